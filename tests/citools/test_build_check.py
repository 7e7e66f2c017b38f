"""`flowc build` without -o, and `flowc build --check`: a committed bundle is caught when it is
stale (a hand-edited, missing or extra file, a changed .flow file) and passes when fresh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO


def flowc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def project(tmp_path):
    """The diamond example in a fresh directory, its bundle committed at bundle/."""
    shutil.copytree(REPO / "examples" / "diamond", tmp_path / "diamond", ignore=shutil.ignore_patterns("tests", "build"))
    built = flowc("build", "diamond/pipeline.flow", "-o", "bundle", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    return tmp_path


def check(project: Path, *extra: str) -> subprocess.CompletedProcess:
    return flowc("build", "diamond/pipeline.flow", "-o", "bundle", "--check", *extra, cwd=project)


def snapshot_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_fresh_bundle_passes_and_nothing_is_written(project):
    before = snapshot_of(project)
    result = check(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "bundle is up to date with diamond/pipeline.flow\n"
    assert snapshot_of(project) == before


def test_python_caches_of_a_bundle_that_ran_do_not_count(project):
    (project / "bundle" / "nodes" / "__pycache__").mkdir()
    (project / "bundle" / "nodes" / "__pycache__" / "fuse.cpython-311.pyc").write_bytes(b"\0")
    assert check(project).returncode == 0


def test_a_hand_edited_file_is_shown_as_a_diff(project):
    node = project / "bundle" / "nodes" / "fuse.py"
    node.write_text(node.read_text().replace('"replicas": 1', '"replicas": 3'))
    before = snapshot_of(project)
    result = check(project)
    assert result.returncode == 1
    assert "--- bundle/nodes/fuse.py (in the directory)\n+++ bundle/nodes/fuse.py (built now)\n" in result.stdout
    assert '-    "replicas": 3,' in result.stdout and '+    "replicas": 1,' in result.stdout
    assert "the bundle in bundle is stale (1 file differs)" in result.stderr
    assert "rebuild it with `flowc build diamond/pipeline.flow -o bundle`" in result.stderr
    assert snapshot_of(project) == before


def test_a_missing_file_is_named(project):
    (project / "bundle" / "deploy" / "k8s" / "rayjob.yaml").unlink()
    result = check(project)
    assert result.returncode == 1
    assert "missing from bundle: deploy/k8s/rayjob.yaml" in result.stdout
    assert "(1 missing)" in result.stderr


def test_an_extra_file_is_named(project):
    (project / "bundle" / "nodes" / "old_role.py").write_text("# a role that was removed\n")
    result = check(project)
    assert result.returncode == 1
    assert "not part of the bundle: bundle/nodes/old_role.py" in result.stdout
    assert "(1 extra)" in result.stderr


def test_a_changed_flow_file_makes_the_bundle_stale(project):
    pipeline = project / "diamond" / "pipeline.flow"
    pipeline.write_text(pipeline.read_text().replace("replicas 2", "replicas 3"))
    result = check(project)
    assert result.returncode == 1
    assert "bundle/nodes/color.py (built now)" in result.stdout
    assert '+    "replicas": 3,' in result.stdout
    assert "bundle/bundle.json (built now)" in result.stdout  # the source hash
    rebuilt = flowc("build", "diamond/pipeline.flow", "-o", "bundle", cwd=project)
    assert rebuilt.returncode == 0 and check(project).returncode == 0


def test_other_build_options_are_hinted(project):
    result = check(project, "--target", "local")
    assert result.returncode == 1
    assert "hint: the bundle in bundle was built for k8s, local, ray: pass `--target all`" in result.stderr


def test_the_command_to_rebuild_keeps_the_builds_own_options(project):
    built = flowc("build", "diamond/pipeline.flow", "-o", "vendored", "--vendor", "--target", "local", cwd=project)
    assert built.returncode == 0, built.stderr
    with (project / "diamond" / "pipeline.flow").open("a") as source:
        source.write("# a change\n")
    result = flowc("build", "diamond/pipeline.flow", "-o", "vendored", "--check", "--vendor", "--target", "local", cwd=project)
    assert result.returncode == 1
    assert "`flowc build diamond/pipeline.flow -o vendored --target local --vendor`" in result.stderr, result.stderr


def test_a_reader_that_goes_away_is_not_an_internal_error(project):
    (project / "bundle" / "bundle.json").write_text("stale\n" * 20_000)  # a long diff to print
    read, write = os.pipe()
    os.close(read)  # the reader is gone before flowc writes a byte (`flowc ... | head` that exited)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "flowc", "build", "diamond/pipeline.flow", "-o", "bundle", "--check"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=project,
            timeout=120,
        )
    finally:
        os.close(write)
    assert result.returncode == 141, result.stderr  # as a Unix tool killed by SIGPIPE
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_missing_bundle_fails_and_a_file_in_its_place_is_a_usage_error(project):
    shutil.rmtree(project / "bundle")
    result = check(project)
    assert result.returncode == 1 and "missing from bundle: bundle.json" in result.stdout
    (project / "bundle").write_text("not a directory")
    result = check(project)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_file_that_cannot_be_read_is_one_line_exit_two(project):
    plan = project / "bundle" / "plan.json"
    plan.unlink()
    plan.symlink_to(project / "gone.json")  # a dangling link: listed, but not readable
    result = check(project)
    assert result.returncode == 2
    assert "cannot read bundle/plan.json" in result.stderr and "Traceback" not in result.stderr


def test_without_o_the_bundle_goes_to_build_beside_the_file(project):
    result = flowc("build", "diamond/pipeline.flow", cwd=project)
    assert result.returncode == 0, result.stderr
    out = project / "diamond" / "build" / "diamond_bundle"
    assert result.stdout.startswith("wrote diamond/build/diamond_bundle: ")
    assert snapshot_of(out)["plan.json"] == (project / "bundle" / "plan.json").read_bytes()
    assert flowc("build", "diamond/pipeline.flow", "--check", cwd=project).returncode == 0
    # the bundle runs from there: its roles are found beside the .flow file
    call = flowc("run", str(out), "--once", "describe", "--input", "@diamond/request.json", cwd=project)
    assert call.returncode == 0, call.stderr
    assert '"frame 2: green owl"' in call.stdout


def test_the_default_bundle_serves_with_python_m_from_its_parent(project):
    # issue 33: the default directory was build/diamond/, named like the roles' package
    # (`impl "diamond.roles:..."`), so `cd build && python -m diamond serve` imported the bundle
    # in its place and could not open
    assert flowc("build", "diamond/pipeline.flow", cwd=project).returncode == 0
    build = project / "diamond" / "build"
    assert [p.name for p in build.iterdir()] == ["diamond_bundle"]
    server = subprocess.Popen(
        [sys.executable, "-m", "diamond_bundle", "serve", "--http", "127.0.0.1:0"],
        cwd=build,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith("serving diamond on http://127.0.0.1:"), line + server.stderr.read()
        url = line.split(" on ", 1)[1].strip()
        request = urllib.request.Request(f"{url}/graphs/describe", data=(project / "diamond" / "request.json").read_bytes())
        with urllib.request.urlopen(request, timeout=60) as answer:
            events = [json.loads(line) for line in answer.read().decode().splitlines()]
        assert events[-1]["status"] == "ok" and "frame 2: green owl" in json.dumps(events)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert server.returncode == 0


def test_check_without_o_finds_a_bundle_in_the_earlier_default_place(project):
    # flowc 0.1.0 wrote build/<flow name>/: a committed bundle there is still checked until rebuilt
    earlier = project / "diamond" / "build" / "diamond"
    assert flowc("build", "diamond/pipeline.flow", "-o", "diamond/build/diamond", cwd=project).returncode == 0
    assert flowc("build", "diamond/pipeline.flow", "--check", cwd=project).returncode == 0
    (earlier / "plan.json").write_text("{}")
    stale = flowc("build", "diamond/pipeline.flow", "--check", cwd=project)
    assert stale.returncode == 1 and "diamond/build/diamond " in stale.stderr, stale.stderr
    # once built in the new place, that is the one checked
    assert flowc("build", "diamond/pipeline.flow", cwd=project).returncode == 0
    assert flowc("build", "diamond/pipeline.flow", "--check", cwd=project).returncode == 0


def test_o_still_wins_and_stdin_needs_it(project):
    assert flowc("build", "diamond/pipeline.flow", "-o", "elsewhere", cwd=project).returncode == 0
    assert (project / "elsewhere" / "bundle.json").is_file() and not (project / "diamond" / "build").exists()
    piped = subprocess.run(
        [sys.executable, "-m", "flowc", "build", "-"],
        input=(project / "diamond" / "pipeline.flow").read_text(),
        capture_output=True,
        text=True,
        cwd=project,
        timeout=60,
    )
    assert piped.returncode == 2 and "pass -o DIR" in piped.stderr


def test_build_never_touches_a_directory_whose_bundle_json_flowc_did_not_write(project):
    theirs = project / "theirs"
    (theirs / "src").mkdir(parents=True)
    (theirs / "src" / "main.py").write_text("important\n")
    (theirs / "README.md").write_text("notes\n")
    for manifest in ('{"name": "my-lib", "files": ["src/main.py", "README.md"]}', "[1, 2]", '{"files": 5}'):
        (theirs / "bundle.json").write_text(manifest)
        result = flowc("build", "diamond/pipeline.flow", "-o", "theirs", cwd=project)
        assert result.returncode == 2, result.stderr
        assert "theirs is not empty and holds no bundle" in result.stderr and "internal error" not in result.stderr
        assert (theirs / "src" / "main.py").read_text() == "important\n" and (theirs / "README.md").exists()


def test_a_previous_bundle_is_replaced_and_only_its_own_files_go(project):
    (project / "bundle" / "NOTES.md").write_text("mine\n")  # a file of the user's beside a bundle
    listed = json.loads((project / "bundle" / "bundle.json").read_text())
    listed["files"].append("NOTES.md")  # even if bundle.json were edited to list it
    (project / "bundle" / "bundle.json").write_text(json.dumps(listed))
    rebuilt = flowc("build", "diamond/pipeline.flow", "-o", "bundle", cwd=project)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (project / "bundle" / "NOTES.md").read_text() == "mine\n"
