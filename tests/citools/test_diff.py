"""`flowc diff`: a table of hand-written change pairs, each classified breaking or compatible
(the wording and places pinned by a golden file), and the command as a real process: exit
codes, JSON, errors, and `git:REV:PATH` read from a temporary repository with its imports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowc.check import check_source
from flowc.citools.commands import diff_text
from flowc.citools.semantic import BREAKING, COMPATIBLE, compare
from flowc.citools.surface import surface

BASE = """flow shop

type Picture = Image

placeholder request: Json
placeholder style: Text

global kv: KVCache {
    layers 2
    page_tokens 16
}

role reader {
    impl "shop.roles:Reader"
    replicas 2
    interface read {
        in  request
        out stream word: Text
    }
}

role painter {
    impl "shop.roles:Painter"
    lb session
    gpus 2
    uses kv
    interface paint {
        in  word
        out picture: Picture
        timeout 30s
    }
}

role helper {
    impl "shop.roles:Helper"
    share gpus with painter
    interface help { in word  out note: Text }
}

graph draw {
    entry  request
    stream word ordered
    stream note
    return picture
    timeout 60s
}
"""

OTHER_GRAPH = "\ngraph sketch {\n    entry  request\n    return picture\n}\n"
AUDIT_ROLE = """
role audit {
    impl "shop.roles:Audit"
    interface log { in note  out audit_line: Text }
}
"""
RECALL = "    interface help { in word  out note: Text }\n    interface recall { in note  out memo: Text }\n"


def edit(*replacements: tuple[str, str], text: str = BASE) -> str:
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


# name -> (old text, new text, the (severity, code) of every change expected, in order)
PAIRS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "flow renamed": (BASE, edit(("flow shop", "flow store")), [(BREAKING, "flow.renamed")]),
    "graph added": (BASE, BASE + OTHER_GRAPH, [(COMPATIBLE, "graph.added")]),
    "graph removed": (BASE + OTHER_GRAPH, BASE, [(BREAKING, "graph.removed")]),
    "graph timeout lowered": (BASE, edit(("timeout 60s", "timeout 20s")), [(BREAKING, "graph.timeout")]),
    "graph timeout raised": (BASE, edit(("timeout 60s", "timeout 2m")), [(COMPATIBLE, "graph.timeout")]),
    "graph timeout removed": (BASE, edit(("    timeout 60s\n", "")), [(COMPATIBLE, "graph.timeout")]),
    "entry added": (BASE, edit(("entry  request", "entry  request, style")), [(BREAKING, "entry.added")]),
    "entry removed": (edit(("entry  request", "entry  request, style")), BASE, [(BREAKING, "entry.removed")]),
    "entry type widened": (edit(("request: Json", "request: Text")), BASE, [(COMPATIBLE, "entry.type-widened")]),
    "entry type narrowed": (BASE, edit(("request: Json", "request: Text")), [(BREAKING, "entry.type-changed")]),
    "entry type changed through an alias": (
        edit(("placeholder request: Json", "type Request = Json\n\nplaceholder request: Request")),
        edit(("placeholder request: Json", "type Request = [Json]\n\nplaceholder request: Request")),
        [(BREAKING, "entry.type-changed")],
    ),
    "entry made streaming": (BASE, edit(("placeholder request", "placeholder stream request")), [(BREAKING, "entry.stream")]),
    "entry no longer streaming": (
        edit(("placeholder request", "placeholder stream request")),
        BASE,
        [(BREAKING, "entry.stream")],
    ),
    "graph made interruptible": (
        BASE,
        edit(("    timeout 60s\n}", "    timeout 60s\n    interruptible\n}")),
        [(BREAKING, "graph.interruptible")],
    ),
    "graph no longer interruptible": (
        edit(("    timeout 60s\n}", "    timeout 60s\n    interruptible\n}")),
        BASE,
        [(COMPATIBLE, "graph.interruptible")],
    ),
    "an alias renamed: nothing callers see": (BASE, edit(*[("Picture", "Img")] * 2), []),
    "stream added": (edit(("    stream note\n", "")), BASE, [(COMPATIBLE, "output.added")]),
    "stream removed": (BASE, edit(("    stream note\n", "")), [(BREAKING, "output.removed")]),
    "return added": (edit(("    return picture\n", "")), BASE, [(COMPATIBLE, "output.added")]),
    "return removed": (BASE, edit(("    return picture\n", "")), [(BREAKING, "output.removed")]),
    "stream made unordered": (BASE, edit(("stream word ordered", "stream word")), [(BREAKING, "output.unordered")]),
    "stream made ordered": (BASE, edit(("stream note\n", "stream note ordered\n")), [(COMPATIBLE, "output.ordered")]),
    "stream moved to return": (
        BASE,
        edit(("    stream note\n", ""), ("return picture", "return picture, note")),
        [(BREAKING, "output.kind")],
    ),
    "output type changed": (
        BASE,
        edit(("out picture: Picture", "out picture: Tensor")),
        [(BREAKING, "output.type-changed"), (COMPATIBLE, "interface.outputs")],
    ),
    "output type narrowed": (
        edit(("out picture: Picture", "out picture: Any")),
        BASE,
        [(COMPATIBLE, "output.type-narrowed"), (COMPATIBLE, "interface.outputs")],
    ),
    "role added": (BASE, BASE + AUDIT_ROLE, [(COMPATIBLE, "role.added")]),
    "role removed": (BASE + AUDIT_ROLE, BASE, [(BREAKING, "role.removed")]),
    "more replicas": (BASE, edit(("replicas 2", "replicas 4")), [(COMPATIBLE, "role.replicas")]),
    "fewer replicas": (BASE, edit(("    replicas 2\n", "")), [(COMPATIBLE, "role.replicas")]),
    "lb away from session": (BASE, edit(("lb session", "lb load_aware")), [(BREAKING, "role.lb")]),
    "lb to session": (BASE, edit(("replicas 2", "replicas 2\n    lb session")), [(COMPATIBLE, "role.lb")]),
    "more gpus": (BASE, edit(("gpus 2", "gpus 4")), [(BREAKING, "role.gpus")]),
    "fewer gpus": (BASE, edit(("gpus 2", "gpus 1")), [(COMPATIBLE, "role.gpus")]),
    "more nodes": (BASE, edit(("gpus 2", "gpus 2\n    nodes 2")), [(BREAKING, "role.nodes")]),
    "gpu sharing added": (
        BASE,
        edit(("replicas 2\n", "replicas 2\n    share gpus with painter\n")),
        [(BREAKING, "role.share")],
    ),
    "gpu sharing removed": (BASE, edit(("    share gpus with painter\n", "")), [(COMPATIBLE, "role.share")]),
    "impl moved": (BASE, edit(("shop.roles:Helper", "shop.helpers:Helper")), [(COMPATIBLE, "role.impl")]),
    "a global no longer used": (BASE, edit(("    uses kv\n", "")), [(COMPATIBLE, "role.uses")]),
    "interface added": (
        BASE,
        edit(("    interface help { in word  out note: Text }\n", RECALL)),
        [(COMPATIBLE, "interface.added")],
    ),
    "interface removed": (
        edit(("    interface help { in word  out note: Text }\n", RECALL)),
        BASE,
        [(BREAKING, "interface.removed")],
    ),
    "interface timeout lowered": (BASE, edit(("timeout 30s", "timeout 5s")), [(BREAKING, "interface.timeout")]),
    "interface timeout from the role": (
        BASE,
        edit(("        timeout 30s\n", ""), ("lb session", "lb session\n    timeout 45s")),
        [(COMPATIBLE, "interface.timeout")],
    ),
    "interface inputs changed": (
        BASE,
        edit(("interface help { in word  out note: Text }", "interface help { in word | request  out note: Text }")),
        [(COMPATIBLE, "interface.inputs")],
    ),
    "global setting changed": (BASE, edit(("layers 2", "layers 4")), [(COMPATIBLE, "global.setting")]),
    "layout and comments only": (
        BASE,
        edit(("role helper {", "# helps\nrole helper {"), ("entry  request", "entry request  # the order")),
        [],
    ),
    "several at once": (
        BASE,
        edit(("replicas 2", "replicas 3"), ("stream word ordered", "stream word"), ("gpus 2", "gpus 1")),
        [(BREAKING, "output.unordered"), (COMPATIBLE, "role.gpus"), (COMPATIBLE, "role.replicas")],
    ),
}


def changes_of(old: str, new: str):
    before, after = check_source(old, "old.flow"), check_source(new, "new.flow")
    for result in (before, after):
        assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    return compare(surface(before.program), surface(after.program))


def test_the_table_is_large_enough():
    assert len(PAIRS) >= 20
    assert {severity for _, _, expected in PAIRS.values() for severity, _ in expected} == {BREAKING, COMPATIBLE}


@pytest.mark.parametrize("name", list(PAIRS))
def test_each_pair_is_classified(name):
    old, new, expected = PAIRS[name]
    assert [(c.severity, c.code) for c in changes_of(old, new)] == expected


def test_the_classified_table(golden):
    blocks = []
    for name, (old, new, _) in PAIRS.items():
        blocks.append(f"## {name}\n" + diff_text(changes_of(old, new), "old.flow", "new.flow"))
    assert "\n".join(blocks) == golden


def test_imports_are_compared_resolved_not_as_text(tmp_path):
    # moving the roles into an imported module changes the text, not what callers see
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "pipeline.flow").write_text(BASE)
    head, roles_start = BASE.index("type Picture"), BASE.index("role reader")
    graph_start = BASE.index("graph draw")
    (tmp_path / "new" / "parts.flow").write_text(BASE[head:graph_start])
    (tmp_path / "new" / "pipeline.flow").write_text("flow shop\n\nimport parts\n\n" + BASE[graph_start:])
    assert roles_start < graph_start
    result = flowc("diff", "old/pipeline.flow", "new/pipeline.flow", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "no changes callers or operators can see (old/pipeline.flow → new/pipeline.flow)\n"
    # and a change inside the imported module is placed there
    parts = tmp_path / "new" / "parts.flow"
    parts.write_text(parts.read_text().replace("gpus 2", "gpus 3"))
    result = flowc("diff", "old/pipeline.flow", "new/pipeline.flow", cwd=tmp_path)
    assert result.returncode == 1
    assert "  BREAKING    new/parts.flow:" in result.stdout and "gpus 2 → 3" in result.stdout


def flowc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def pair(tmp_path):
    (tmp_path / "old.flow").write_text(BASE)
    return tmp_path


def test_exit_one_on_breaking_zero_on_compatible(pair):
    (pair / "new.flow").write_text(edit(("replicas 2", "replicas 4")))
    compatible = flowc("diff", "old.flow", "new.flow", cwd=pair)
    assert compatible.returncode == 0
    assert compatible.stdout.splitlines()[1].startswith("  compatible  new.flow:15:5  replicas 2 → 4")
    (pair / "new.flow").write_text(edit(("stream word ordered", "stream word")))
    breaking = flowc("diff", "old.flow", "new.flow", cwd=pair)
    assert breaking.returncode == 1
    assert "  BREAKING    new.flow:42:12  stream `word` is no longer ordered" in breaking.stdout


def test_json_for_bots(pair):
    (pair / "new.flow").write_text(edit(("replicas 2", "replicas 4"), ("    return picture\n", "")))
    result = flowc("diff", "old.flow", "new.flow", "--format", "json", cwd=pair)
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert payload["breaking"] == 1 and payload["compatible"] == 1
    assert [(c["severity"], c["code"], c["subject"]) for c in payload["changes"]] == [
        ("breaking", "output.removed", "graph draw"),
        ("compatible", "role.replicas", "role reader"),
    ]
    assert payload["changes"][0]["place"] == {"file": "old.flow", "line": 44, "column": 12}  # removed: placed in the old


def test_bad_sides_are_one_line(pair):
    missing = flowc("diff", "old.flow", "gone.flow", cwd=pair)
    assert missing.returncode == 2 and missing.stderr == "flowc: no such file: gone.flow\n"
    (pair / "broken.flow").write_text(BASE.replace("in  word", "in  wrd"))
    broken = flowc("diff", "old.flow", "broken.flow", cwd=pair)
    assert broken.returncode == 1 and "flowc: broken.flow has errors; fix them first" in broken.stderr
    outside = flowc("diff", "git:HEAD:old.flow", "old.flow", cwd=pair)
    assert outside.returncode == 2 and "is not inside a git repository" in outside.stderr
    assert "Traceback" not in missing.stderr + broken.stderr + outside.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_revisions_are_read_with_their_imports(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "ci@example.com")
    git("config", "user.name", "CI")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    graph_start = BASE.index("graph draw")
    (pipelines / "parts.flow").write_text(BASE[BASE.index("type Picture") : graph_start])
    (pipelines / "shop.flow").write_text("flow shop\n\nimport parts\n\n" + BASE[graph_start:])
    git("add", "-A")
    git("commit", "-q", "-m", "first")
    # only the imported module changes: the diff must see it at both revisions
    (pipelines / "parts.flow").write_text((pipelines / "parts.flow").read_text().replace("gpus 2", "gpus 8"))
    result = flowc("diff", "git:HEAD:pipelines/shop.flow", "pipelines/shop.flow", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "  BREAKING    pipelines/parts.flow:" in result.stdout and "gpus 2 → 8" in result.stdout
    git("commit", "-q", "-am", "more gpus")
    # from a subdirectory, paths are relative to it; both sides may be revisions
    here = flowc("diff", "git:HEAD~1:shop.flow", "git:main:shop.flow", "--format", "json", cwd=pipelines)
    assert here.returncode == 1, here.stderr
    (change,) = json.loads(here.stdout)["changes"]
    assert change["code"] == "role.gpus" and change["place"]["file"] == "git:main:./parts.flow"
    same = flowc("diff", "git:HEAD:pipelines/shop.flow", "pipelines/shop.flow", cwd=tmp_path)
    assert same.returncode == 0, same.stdout
    unknown = flowc("diff", "git:nope:pipelines/shop.flow", "pipelines/shop.flow", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr == (
        "flowc: git:nope:pipelines/shop.flow: no revision `nope` in this repository; check the name (git log, git branch -a)\n"
    )
    absent = flowc("diff", "git:HEAD~1:pipelines/new.flow", "pipelines/shop.flow", cwd=tmp_path)
    assert absent.returncode == 2 and "pipelines/new.flow does not exist at HEAD~1" in absent.stderr
