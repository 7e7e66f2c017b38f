"""Bad inputs to the compiler's command line, one table row each (issue 12, item 6).

Every row runs `python -m flowc` as a real subprocess in a fresh directory and asserts: the exit
status (1 errors in the input, 2 usage or I/O problems), that the output names the place (file,
line and column, option or path) and the fix, that no traceback or "internal error" appears,
and that the output stays small whatever the input's size. Some rows also check what is left on
disk (a file fmt must not touch, a file a tampered bundle.json names outside the bundle).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GOOD = """flow t

placeholder request: Json

role echo {
    impl "roles:Echo"
    interface run { in request  out reply: Json }
}

graph talk {
    entry  request
    return reply
}
"""

BOM = "\ufeff".encode()


def with_role_setting(setting: str) -> str:
    return GOOD.replace('    impl "roles:Echo"\n', f'    impl "roles:Echo"\n    {setting}\n')


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after `flowc`; {tmp} is the case's directory
    status: int
    says: tuple[str, ...]  # each must appear in stdout + stderr
    files: dict[str, bytes | str] = field(default_factory=dict)  # "<dir>" makes a directory
    stdin: bytes | None = None
    after: Callable[[Path], None] | None = None  # more checks on the directory afterwards


def unchanged(name: str, content: str) -> Callable[[Path], None]:
    def check(tmp: Path) -> None:
        assert (tmp / name).read_text() == content, f"{name} was changed"

    return check


def victim_kept(tmp: Path) -> None:
    assert (tmp / "victim.txt").read_text() == "keep me", "a file outside the bundle was deleted"
    assert (tmp / "out" / "plan.json").is_file()


BROKEN_BRACE = 'flow t\n\nrole r {\n    impl "roles:R"\n'
HUGE_LINE = "flow t\nplaceholder x: Json " + " " * 1_500_000 + "$\n"
MANY_BROKEN = "".join(f"role r{i} {{ impl }}\n" for i in range(5000))

CASES = [
    # ── broken .flow text (check exits 1; file:line:col, the code and a hint) ──
    Case("unclosed brace", ("check", "p.flow"), 1, ("p.flow:4:", "E001", "add `}` to end `role r`"), {"p.flow": BROKEN_BRACE}),
    Case(
        "comma between graph clauses",
        ("check", "p.flow"),
        1,
        ("p.flow:11:21: E001", "remove the `,` before `return`"),
        {"p.flow": GOOD.replace("entry  request\n    return", "entry  request, return")},
    ),
    Case(
        "comma between settings",
        ("check", "p.flow"),
        1,
        ("p.flow:7:14: E001", "`replicas` was read as one more value", "remove the `,`"),
        {"p.flow": GOOD.replace('"roles:Echo"\n', '"roles:Echo",\n    replicas 2\n')},
    ),
    Case(
        "unterminated string",
        ("check", "p.flow"),
        1,
        ("p.flow:6:10: E002", 'close the string with `"`'),
        {"p.flow": GOOD.replace('"roles:Echo"', '"roles:Echo')},
    ),
    Case(
        "semicolons",
        ("check", "p.flow"),
        1,
        ("p.flow:6:22: E003", "remove the `;`"),
        {"p.flow": GOOD.replace('"roles:Echo"', '"roles:Echo";')},
    ),
    Case("slash comment", ("check", "p.flow"), 1, ("p.flow:1:1: E003", "comments start with `#`"), {"p.flow": "// hi\n" + GOOD}),
    Case(
        "dash in a name",
        ("check", "p.flow"),
        1,
        ("p.flow:5:8: E003", "not `-`: use `_`"),
        {"p.flow": GOOD.replace("role echo", "role my-echo")},
    ),
    Case(
        "non-ASCII name",
        ("check", "p.flow"),
        1,
        ("p.flow:5:6: E003", "names hold ASCII letters"),
        {"p.flow": GOOD.replace("role echo", "role écho")},
    ),
    Case(
        "reserved word as a name",
        ("check", "p.flow"),
        1,
        ("p.flow:3:13: E001", "`stream` is a reserved word; choose another name"),
        {"p.flow": "flow t\n\nplaceholder stream: Json\n"},
    ),
    Case(
        "NUL bytes", ("check", "p.flow"), 1, ("p.flow:2:1: E003", "control character U+0000"), {"p.flow": b"flow t\n\x00\x00\n"}
    ),
    Case(
        "a BOM inside the file",
        ("check", "p.flow"),
        1,
        ("p.flow:2:1: E003", "byte-order mark: it is allowed only at the very start"),
        {"p.flow": "flow t\n\ufeffplaceholder x: Json\n"},
    ),
    Case("a BOM at the start is fine", ("check", "p.flow"), 0, ("checked 1 file: no problems",), {"p.flow": BOM + GOOD.encode()}),
    Case(
        "a 1.5 MB line",
        ("check", "p.flow"),
        1,
        ("p.flow:2:1500021: E003", "line 2 is 1,500,021 characters long; columns 1499961-1500021 shown"),
        {"p.flow": HUGE_LINE},
    ),
    Case(
        "brackets nested 100,000 deep",
        ("check", "p.flow"),
        1,
        ("p.flow:2:33: E006", "at most 32 levels"),
        {"p.flow": "flow t\n" + "[" * 100_000 + "\n"},
    ),
    Case(
        "a 40-digit number",
        ("check", "p.flow"),
        1,
        ("p.flow:7:14: E005",),
        {"p.flow": with_role_setting("replicas " + "9" * 40)},
    ),
    Case(
        "5,000 broken declarations",
        ("check", "p.flow"),
        1,
        ("p.flow:1:16: E001", "p.flow:20:"),
        {"p.flow": MANY_BROKEN},
    ),
    Case(
        "replicas out of range",
        ("check", "p.flow"),
        1,
        ("p.flow:7:14: E123", "`replicas` must be at most 1024", "1 to 1024"),
        {"p.flow": with_role_setting("replicas 999999999999999999")},
    ),
    Case(
        "a zero timeout",
        ("check", "p.flow"),
        1,
        ("p.flow:7:13: E123", "must be more than 0s", "leave `timeout` out for no limit"),
        {"p.flow": with_role_setting("timeout 0s")},
    ),
    Case(
        "impl without a colon",
        ("check", "p.flow"),
        1,
        ("p.flow:6:10: E125", 'write "roles:Echo"'),
        {"p.flow": GOOD.replace('"roles:Echo"', '"roles.Echo"')},
    ),
    Case(
        "missing import",
        ("check", "p.flow"),
        1,
        ("p.flow:2:1: E101", "looked for `nowhere.flow`"),
        {"p.flow": GOOD.replace("flow t\n", "flow t\nimport nowhere\n")},
    ),
    Case(
        "import cycle",
        ("check", "a.flow"),
        1,
        ("E102", "import cycle: a → b → a"),
        {"a.flow": "import b\n", "b.flow": "import a\n"},
    ),
    Case(
        "imported module is binary",
        ("check", "p.flow"),
        1,
        ("p.flow:2:1: E103", "`lib.flow` is not UTF-8 text (invalid start byte at byte 0)", "save `lib.flow` as UTF-8"),
        {"p.flow": GOOD.replace("flow t\n", "flow t\nimport lib\n"), "lib.flow": b"\xff\xfe\x00garbage"},
    ),
    Case(
        "a role nothing needs, under --strict",
        ("check", "--strict", "p.flow"),
        1,
        ("p.flow:10:7: W210", "p.flow:17:15:", "enter `talk` through a placeholder it does not read"),
        {"p.flow": GOOD + '\nrole spare {\n    impl "roles:Spare"\n    interface run { in request  out other: Json }\n}\n'},
    ),
    # ── files that are not .flow text (exit 2; the path and what to pass) ──
    Case("missing file", ("check", "nope.flow"), 2, ("no such file: nope.flow",)),
    Case("a directory", ("check", "d"), 2, ("d is a directory; pass a .flow file",), {"d": "<dir>"}),
    Case("an empty file name", ("check", ""), 2, ("an empty file name was given; pass a .flow file",)),
    Case(
        "not UTF-8",
        ("check", "p.flow"),
        2,
        ("p.flow is not UTF-8 text", "at byte 0", "save it as UTF-8"),
        {"p.flow": b"\xff\xd8\xff\xe0 JFIF binary"},
    ),
    Case("not UTF-8 on stdin", ("check", "-"), 2, ("<stdin> is not UTF-8 text",), stdin=b"flow t\n\xff\xfe"),
    Case("a device", ("check", "/dev/zero"), 2, ("cannot read /dev/zero: it is a device, not a text file",)),
    Case(
        "a symlink loop",
        ("check", "loop.flow"),
        2,
        ("cannot read loop.flow", "symbolic links"),
        {"loop.flow": "<link:loop.flow>"},
    ),
    Case("a file name too long", ("check", "x" * 300 + ".flow"), 2, ("File name too long",)),
    Case(
        "one file missing among good ones",
        ("check", "p.flow", "nope.flow", "q.flow"),
        2,
        ("no such file: nope.flow", "q.flow:3:1: E001", "checked 2 files: 1 error; 1 could not be read"),
        {"p.flow": GOOD, "q.flow": "flow q\n\n}\n"},
    ),
    # ── bad flags (exit 2; the flag and the choices) ──
    Case("unknown option", ("check", "--frobnicate", "p.flow"), 2, ("No such option '--frobnicate'",), {"p.flow": GOOD}),
    Case("unknown command", ("chekc", "p.flow"), 2, ("No such command 'chekc'",)),
    Case("bad --format", ("check", "--format", "yaml", "p.flow"), 2, ("'yaml' is not one of 'text', 'json'",), {"p.flow": GOOD}),
    Case("no files", ("check",), 2, ("Missing argument 'FILES...'",)),
    Case(
        "build from stdin without -o",
        ("build", "-"),
        2,
        ("a pipeline read from stdin has no directory", "pass -o DIR"),
        stdin=GOOD.encode(),
    ),
    Case("bad --target", ("build", "p.flow", "-o", "out", "--target", "aws"), 2, ("'aws' is not one of",), {"p.flow": GOOD}),
    Case(
        "build a file whose name is no flow name",
        ("build", "my pipe-line.flow"),
        2,
        ("'my pipe-line', which is not a name", "add a `flow NAME` line"),
        {"my pipe-line.flow": GOOD.split("\n", 1)[1] if GOOD.startswith("flow ") else GOOD},
    ),
    Case(
        "unknown graph to draw",
        ("graph", "p.flow", "--graph", "nope"),
        2,
        ("no graph `nope` in p.flow; it has talk",),
        {"p.flow": GOOD},
    ),
    # ── bad or unwritable output targets (exit 2; the target and what to choose) ──
    Case("build -o ''", ("build", "p.flow", "-o", ""), 2, ("-o needs a directory name",), {"p.flow": GOOD}),
    Case(
        "build -o a file",
        ("build", "p.flow", "-o", "f"),
        2,
        ("Invalid value for '-o' / '--output': Directory 'f' is a file",),
        {"p.flow": GOOD, "f": "x"},
    ),
    Case(
        "build -o a directory of other things",
        ("build", "p.flow", "-o", "d"),
        2,
        ("d is not empty and holds no bundle",),
        {"p.flow": GOOD, "d/notes.txt": "mine"},
        after=unchanged("d/notes.txt", "mine"),
    ),
    Case(
        "build -o below a file",
        ("build", "p.flow", "-o", "f/out"),
        2,
        ("cannot write the bundle to f/out", "Not a directory", "choose a writable directory for -o"),
        {"p.flow": GOOD, "f": "x"},
    ),
    Case(
        "build -o where nothing can be written",
        ("build", "p.flow", "-o", "/proc/flowc-bundle"),
        2,
        ("cannot write the bundle to /proc/flowc-bundle",),
        {"p.flow": GOOD},
    ),
    Case(
        "build over a bundle whose bundle.json names files outside it",
        ("build", "p.flow", "-o", "out"),
        0,
        ("wrote out:",),
        {
            "p.flow": GOOD,
            "out/bundle.json": '{"flowc_version": "0.1.0", "files": ["../victim.txt", "/etc/hostname"]}',
            "victim.txt": "keep me",
        },
        after=victim_kept,
    ),
    Case(
        "build a broken file",
        ("build", "p.flow", "-o", "out"),
        1,
        ("p.flow:4:", "has errors; fix them first"),
        {"p.flow": BROKEN_BRACE},
    ),
    Case("plan a broken file", ("plan", "p.flow"), 1, ("p.flow:4:", "has errors; fix them first"), {"p.flow": BROKEN_BRACE}),
    Case("graph -o a directory", ("graph", "p.flow", "-o", "d"), 2, ("'d' is a directory",), {"p.flow": GOOD, "d": "<dir>"}),
    Case(
        "graph -o in a missing directory",
        ("graph", "p.flow", "-o", "no/such/dir.mmd"),
        2,
        ("cannot write no/such/dir.mmd", "choose a writable path for -o"),
        {"p.flow": GOOD},
    ),
    # ── fmt (broken files are reported and left alone) ──
    Case(
        "fmt a broken file",
        ("fmt", "p.flow"),
        1,
        ("p.flow:4:", "p.flow has syntax errors; not formatted"),
        {"p.flow": BROKEN_BRACE},
        after=unchanged("p.flow", BROKEN_BRACE),
    ),
    Case(
        "fmt --check an unformatted file",
        ("fmt", "--check", "p.flow"),
        1,
        ("would reformat p.flow",),
        {"p.flow": GOOD.replace("    impl", "  impl")},
        after=unchanged("p.flow", GOOD.replace("    impl", "  impl")),
    ),
    Case("fmt broken stdin", ("fmt", "-"), 1, ("<stdin>:1:6: E001", "not formatted"), stdin=b"role {\n"),
    Case(
        "fmt a device among files",
        ("fmt", "/dev/zero", "p.flow"),
        2,
        ("cannot read /dev/zero: it is a device", "reformatted p.flow"),
        {"p.flow": GOOD.replace("    impl", "  impl")},
        after=unchanged("p.flow", GOOD),
    ),
]


def materialize(tmp: Path, files: dict[str, bytes | str]) -> None:
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "<dir>":
            path.mkdir()
        elif isinstance(content, str) and content.startswith("<link:"):
            path.symlink_to(content[len("<link:") : -1])
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def test_the_table_is_large_enough():
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path):
    if any("/proc/" in a for a in case.argv) and not Path("/proc/self").exists():
        pytest.skip("needs a /proc file system")
    materialize(tmp_path, case.files)
    result = subprocess.run(
        [sys.executable, "-m", "flowc", *case.argv],
        cwd=tmp_path,
        input=case.stdin if case.stdin is not None else b"",
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    out = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    assert result.returncode == case.status, out[-3000:]
    for expected in case.says:
        assert expected in out, f"expected {expected!r} in:\n{out[-3000:]}"
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    assert len(out) < 64_000, f"{len(out):,} characters of output"
    if case.after is not None:
        case.after(tmp_path)
