"""The command line, run as a real process: exit codes, output formats, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from flowc import cli
from tests.conftest import EXAMPLES, INVALID, REPO


def flowc(*args: str, stdin: str | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowc", *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_version():
    result = flowc("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("flowc, version ")


def test_help_shows_examples():
    result = flowc("check", "--help")
    assert result.returncode == 0
    assert "flowc check pipeline.flow" in result.stdout


def test_check_clean_examples_exit_zero():
    result = flowc("check", *[str(p.relative_to(REPO)) for p in EXAMPLES])
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip() == f"checked {len(EXAMPLES)} files: no problems"


def test_check_errors_exit_one_with_positioned_diagnostics():
    path = next(p for p in INVALID if p.stem == "E140_field_without_producer")
    result = flowc("check", str(path.relative_to(REPO)))
    assert result.returncode == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("tests/invalid/E140_field_without_producer.flow:8:24: E140 field `reqest`")
    assert "^^^^^^" in result.stdout
    assert "hint: did you mean `request`?" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_warnings_alone_exit_zero_unless_strict():
    path = str(next(p for p in INVALID if p.stem == "W143_field_never_used").relative_to(REPO))
    assert flowc("check", path).returncode == 0
    assert flowc("check", "--strict", path).returncode == 1


def test_check_json_output():
    path = next(p for p in INVALID if p.stem == "many_errors_sorted_by_position")
    result = flowc("check", "--format", "json", str(path.relative_to(REPO)))
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert payload["errors"] == 5 and payload["warnings"] == 1
    assert [d["code"] for d in payload["diagnostics"]] == ["E124", "E120", "E140", "W143", "E112", "E172"]


def test_usage_and_io_problems_exit_two():
    assert flowc("check", "no/such/file.flow").returncode == 2
    assert flowc("check").returncode == 2
    assert flowc("check", "examples").returncode == 2
    assert flowc("frobnicate").returncode == 2


def test_binary_input_is_a_usage_error_not_a_traceback(tmp_path):
    path = tmp_path / "bad.flow"
    path.write_bytes(b"\xff\xfe\x00role")
    result = flowc("check", str(path))
    assert result.returncode == 2
    assert "not UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_stdin_is_checked():
    result = flowc("check", "-", stdin="role a {\n")
    assert result.returncode == 1
    assert result.stdout.startswith("<stdin>:1:9: E001 expected `}` to close `role a`")


def test_fmt_check_reports_and_changes_nothing(tmp_path):
    path = tmp_path / "p.flow"
    path.write_text("placeholder   p :Json\n")
    result = flowc("fmt", "--check", str(path))
    assert result.returncode == 1
    assert "would reformat" in result.stderr
    assert path.read_text() == "placeholder   p :Json\n"


def test_fmt_rewrites_in_place_and_is_then_clean(tmp_path):
    path = tmp_path / "p.flow"
    path.write_text("placeholder   p :Json\n")
    assert flowc("fmt", str(path)).returncode == 0
    assert path.read_text() == "placeholder p: Json\n"
    assert flowc("fmt", "--check", str(path)).returncode == 0


def test_fmt_diff_and_stdin():
    result = flowc("fmt", "-", stdin="placeholder   p :Json\n")
    assert result.returncode == 0 and result.stdout == "placeholder p: Json\n"
    diff = flowc("fmt", "--diff", "-", stdin="placeholder   p :Json\n")
    assert diff.returncode == 1
    assert "-placeholder   p :Json\n+placeholder p: Json" in diff.stdout


def test_fmt_of_broken_file_reports_and_keeps_the_file(tmp_path):
    path = tmp_path / "p.flow"
    path.write_text("role {\n")
    result = flowc("fmt", str(path))
    assert result.returncode == 1
    assert "E001" in result.stderr
    assert path.read_text() == "role {\n"


def test_plan_of_invalid_file_exits_one():
    path = next(p for p in INVALID if p.stem == "E140_field_without_producer")
    result = flowc("plan", str(path.relative_to(REPO)))
    assert result.returncode == 1 and "E140" in result.stderr


def test_internal_errors_are_one_line_without_traceback(monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "check_source", explode)
    runner = CliRunner()
    result = runner.invoke(cli.main, ["check", str(EXAMPLES[0])])
    assert result.exit_code == 3
    assert "flowc: internal error: RuntimeError: boom" in result.output
    assert "Traceback" not in result.output
    debug = runner.invoke(cli.main, ["--debug", "check", str(EXAMPLES[0])])
    assert isinstance(debug.exception, RuntimeError)
