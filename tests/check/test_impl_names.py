"""`impl "package.module:Class"` (issue 12, item 17): Unicode Python identifiers are valid impl
names, since they are valid Python and import; every other mistake gets a message naming the
part that is wrong and a hint fixing that, not a blanket "separate with one `:`"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowc.check import check_source

PROGRAM = """flow t

placeholder text: Text

role echo {{
    impl "{impl}"
    interface run {{ in text  out loud: Text }}
}}

graph yell {{
    entry  text
    return loud
}}
"""


def impl_diagnostics(impl: str):
    return [d for d in check_source(PROGRAM.format(impl=impl), "t.flow").diagnostics if d.code == "E125"]


@pytest.mark.parametrize("impl", ["prøbe.rôles:Échø", "roles:Echo", "a.b.c:Outer.Inner", "_x:_Y", "模块:类"])
def test_python_identifiers_are_valid_impls(impl):
    assert impl_diagnostics(impl) == []


# (impl, what the message says is wrong, the hint)
BAD = [
    ("my_module.A", "it has no `:` between the module and the class", 'write "my_module:A": the module path, `:`, the class'),
    ("Echo", "it names no module", 'write "module:Echo", naming the Python module that defines `Echo`'),
    ("a:b:C", "it has more than one `:`", "use one `:`, between the module path and the class name"),
    (":Echo", "the module is missing before the `:`", 'write "package.module:Echo"'),
    ("roles:", "the class is missing after the `:`", 'write "roles:ClassName"'),
    (
        "my-roles:Echo",
        "`my-roles` in the module path is not a Python identifier",
        "a Python name cannot hold `-`: write `my_roles`, and rename the file or class to match",
    ),
    (
        "roles.2d:Echo",
        "`2d` in the module path is not a Python identifier",
        "a Python name cannot start with a digit: rename `2d`",
    ),
    (
        "roles:Echo!",
        "`Echo!` in the class name is not a Python identifier",
        "a Python name holds letters, digits and `_`, not `!`: rename `Echo!`",
    ),
    (
        "my roles:Echo",
        "`my roles` in the module path is not a Python identifier",
        "a Python name holds letters, digits and `_`, not spaces: rename `my roles`",
    ),
    ("roles: Echo", "the class name ` Echo` has spaces around it", "remove the spaces: `Echo`"),
    (
        "roles..x:Echo",
        "the module path `roles..x` has an empty part",
        "write the names separated by single dots, with none at either end",
    ),
    (
        "class:Echo",
        "`class` in the module path is a Python keyword",
        "rename the module: `class` cannot be imported by that name",
    ),
    (
        "roles:ﬁle",
        "`ﬁle` in the class name is not in the form Python reads identifiers in (NFKC)",
        "write it as `file`, the name Python gives it",
    ),
]


@pytest.mark.parametrize(("impl", "what", "hint"), BAD, ids=[b[0] for b in BAD])
def test_bad_impls_say_what_is_wrong(impl, what, hint):
    (diagnostic,) = impl_diagnostics(impl)
    assert diagnostic.message == f'`impl` of role `echo` must look like "package.module:Class", but {what}'
    assert diagnostic.hint == hint


def test_a_unicode_impl_builds_and_runs(tmp_path):
    package = tmp_path / "prøbe"
    package.mkdir()
    (package / "pipeline.flow").write_text(PROGRAM.format(impl="prøbe.rôles:Échø"), encoding="utf-8")
    (package / "rôles.py").write_text(
        "class Échø:\n    async def run(self, ctx, text):\n        return {'loud': text.upper() + '!'}\n", encoding="utf-8"
    )
    built = subprocess.run(
        [sys.executable, "-m", "flowc", "build", "pipeline.flow", "-o", str(tmp_path / "bundle")],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [sys.executable, "-m", "flowc", "run", str(tmp_path / "bundle"), "--once", "yell", "--input", '{"text": "ça"}'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    assert events[0] == {"event": "return", "field": "loud", "value": "ÇA!"}
