"""The bounds of resource settings (issue 12, item 8): each one accepts its edge values and
rejects the next with E123, a message naming the setting, the bound and the value written, and a
hint giving the accepted range."""

from __future__ import annotations

import pytest

from flowc.check import check_source

TEMPLATE = """
placeholder request: Json

global kv: KVCache {{ {global_settings} }}

role a {{
    impl "m:A"
    uses kv
    {role_settings}
    interface run {{
        in  request
        out result: Json
        {interface_settings}
    }}
}}

graph g {{
    entry  request
    return result
    {graph_settings}
}}
"""


def checked(role="", interface="", graph="", global_settings="layers 2"):
    text = TEMPLATE.format(
        role_settings=role, interface_settings=interface, graph_settings=graph, global_settings=global_settings
    )
    return check_source(text, "limits.flow").diagnostics, text


def diagnostics(**settings):
    return checked(**settings)[0]


# (where, setting as written at the edge, the same setting just past it, message, range in the hint)
BOUNDS = [
    ("role", "replicas 1", "replicas 0", "`replicas` must be at least 1, not 0", "1 to 1024"),
    ("role", "replicas 1024", "replicas 1025", "`replicas` must be at most 1024, not 1025", "1 to 1024"),
    (
        "role",
        "replicas 1024",
        "replicas 999999999999999999",
        "`replicas` must be at most 1024, not 999999999999999999",
        "1 to 1024",
    ),
    ("role", "gpus 0", "gpus 1025", "`gpus` must be at most 1024, not 1025", "0 to 1024"),
    ("role", "nodes 1", "nodes 0", "`nodes` must be at least 1, not 0", "1 to 128"),
    ("role", "nodes 128", "nodes 129", "`nodes` must be at most 128, not 129", "1 to 128"),
    ("role", "batch { max 1 }", "batch { max 0 }", "`max` must be at least 1, not 0", "1 to 65536"),
    ("role", "batch { max 65536 }", "batch { max 65537 }", "`max` must be at most 65536, not 65537", "1 to 65536"),
    ("role", "batch { wait 0ms }", "batch { wait 61s }", "`wait` must be at most 1m, not 61s", "0s to 1m"),
    ("role", "batch { wait 60s }", "batch { wait 2m }", "`wait` must be at most 1m, not 2m", "0s to 1m"),
    ("role", "timeout 1ms", "timeout 0s", "`timeout` must be more than 0s, not 0s", "more than 0s, at most 24h"),
    ("role", "timeout 100us", "timeout 0", "`timeout` must be more than 0s, not 0", "more than 0s, at most 24h"),
    ("role", "timeout 24h", "timeout 25h", "`timeout` must be at most 24h, not 25h", "more than 0s, at most 24h"),
    ("interface", "timeout 0.5s", "timeout 0.0s", "`timeout` must be more than 0s, not 0.0s", "more than 0s, at most 24h"),
    ("interface", "timeout 1440m", "timeout 1441m", "`timeout` must be at most 24h, not 1441m", "more than 0s, at most 24h"),
    ("interface", "batch { max 8 }", "batch { max 70000 }", "`max` must be at most 65536, not 70000", "1 to 65536"),
    ("graph", "timeout 30s", "timeout 0ms", "`timeout` must be more than 0s, not 0ms", "more than 0s, at most 24h"),
    ("graph", "timeout 86400s", "timeout 86401s", "`timeout` must be at most 24h, not 86401s", "more than 0s, at most 24h"),
    ("global", "layers 1024", "layers 1025", "`layers` must be at most 1024, not 1025", "1 to 1024"),
    ("global", "page_tokens 65536", "page_tokens 65537", "`page_tokens` must be at most 65536, not 65537", "1 to 65536"),
    ("global", "capacity 1024TiB", "capacity 1025TiB", "`capacity` must be at most 1024TiB, not 1025TiB", "1 byte to 1024TiB"),
]


def _place(where: str, setting: str) -> dict:
    if where == "global":
        return {"global_settings": f"layers 2 {setting}" if not setting.startswith("layers") else setting}
    return {where: setting}


@pytest.mark.parametrize(("where", "edge", "past", "message", "bounds"), BOUNDS, ids=[row[2] for row in BOUNDS])
def test_resource_setting_bounds(where, edge, past, message, bounds):
    assert [d.code for d in diagnostics(**_place(where, edge))] == []
    found, text = checked(**_place(where, past))
    (problem,) = found
    assert (problem.code, problem.message) == ("E123", message)
    assert bounds in problem.hint
    assert text[problem.span.start : problem.span.end] == message.rsplit("not ", 1)[1]  # the caret is on the value


def test_timeouts_hint_how_to_have_no_limit():
    (problem,) = diagnostics(graph="timeout 0s")
    assert problem.hint.endswith("leave `timeout` out for no limit")
