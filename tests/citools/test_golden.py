"""`flowc test`: golden event tests, run as a real process on a small pipeline whose roles the
tests rewrite. A case fails on a changed value, a reordered `ordered` stream and a new error,
and not on a reordered unordered stream; `--update` re-records; JUnit XML validates."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema

from tests.conftest import REPO

PIPELINE = """flow probe

placeholder request: Json

role speaker {
    impl "probe_roles:Speaker"
    interface talk {
        in  request
        out stream word: Text, tag: Text
    }
}

role counter {
    impl "probe_roles:Counter"
    interface count { in request  out total: Json }
}

graph talk {
    entry  request
    stream word ordered
    stream tag
    return total
}
"""

ROLES = """
import asyncio

WORDS = {words!r}
TAGS = {tags!r}
TOTAL = {total!r}
FAILURE = {failure!r}


class Speaker:
    async def talk(self, ctx, request):
        for word, tag in zip(WORDS, TAGS):
            yield {{"word": word, "tag": tag}}


class Counter:
    async def count(self, ctx, request):
        if FAILURE == "hang":
            await asyncio.Event().wait()
        if FAILURE:
            raise RuntimeError(FAILURE)
        return {{"total": {{"count": TOTAL, "of": request["what"]}}}}
"""

SCHEMA = xmlschema.XMLSchema(REPO / "tests" / "data" / "junit" / "junit.xsd")


def roles(project: Path, words=("alpha", "beta", "gamma"), tags=("x", "y", "z"), total=3, failure=None) -> None:
    text = ROLES.format(words=list(words), tags=list(tags), total=total, failure=failure)
    (project / "probe_roles.py").write_text(text)


def flowc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=cwd, timeout=180)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pipeline.flow").write_text(PIPELINE)
    roles(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "talk.input.json").write_text('{"request": {"what": "words"}}\n')
    recorded = flowc("test", "--update", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert recorded.stdout.splitlines()[0] == "RECORDED tests/talk"
    return tmp_path


def recording(project: Path) -> list[dict]:
    return [json.loads(line) for line in (project / "tests" / "talk.events.jsonl").read_text().splitlines()]


def test_a_recording_is_what_run_once_prints_and_passes(project):
    once = flowc("run", "pipeline.flow", "--once", "talk", "--input", "@tests/talk.input.json", cwd=project)
    assert (project / "tests" / "talk.events.jsonl").read_text() == once.stdout
    result = flowc("test", cwd=project)
    assert result.returncode == 0, result.stdout
    assert result.stdout == "PASS     tests/talk\n1 case: 1 passed, 0 failed\n"


def test_a_changed_value_fails_with_a_readable_diff(project):
    roles(project, total=4)
    result = flowc("test", cwd=project)
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == "FAIL     tests/talk"
    assert '    -return total: {"count": 3, "of": "words"}' in result.stdout
    assert '    +return total: {"count": 4, "of": "words"}' in result.stdout
    assert "flowc test --update" in result.stderr


def test_a_reordered_ordered_stream_fails(project):
    roles(project, words=("beta", "alpha", "gamma"))
    result = flowc("test", cwd=project)
    assert result.returncode == 1
    assert '    -stream word [0]: "alpha"' in result.stdout and '    +stream word [0]: "beta"' in result.stdout


def test_a_reordered_unordered_stream_passes(project):
    roles(project, tags=("z", "x", "y"))
    run = flowc("run", "pipeline.flow", "--once", "talk", "--input", "@tests/talk.input.json", cwd=project)
    assert [e["value"] for e in map(json.loads, run.stdout.splitlines()) if e.get("field") == "tag"] == ["z", "x", "y"]
    result = flowc("test", cwd=project)
    assert result.returncode == 0, result.stdout
    # but a tag that changed is caught, as a multiset
    roles(project, tags=("z", "x", "x"))
    assert flowc("test", cwd=project).returncode == 1


def test_how_fields_interleave_is_not_compared(project):
    events = recording(project)
    (returned,) = [e for e in events if e["event"] == "return"]
    streamed = [e for e in events if e["event"] == "stream"]
    for layout in ([returned, *streamed], [*streamed[:2], returned, *streamed[2:]], [*streamed, returned]):
        (project / "tests" / "talk.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [*layout, events[-1]]))
        assert flowc("test", cwd=project).returncode == 0


def test_a_new_error_fails_and_update_then_passes(project):
    roles(project, failure="the counter broke")
    result = flowc("test", cwd=project)
    assert result.returncode == 1
    assert "    +error: counter.count" in result.stdout
    assert "    -done: ok" in result.stdout and "    +done: error" in result.stdout
    assert "    +missing: total" in result.stdout
    updated = flowc("test", "--update", cwd=project)
    assert updated.returncode == 0
    assert updated.stdout.splitlines()[0] == "UPDATED  tests/talk"
    (done,) = [e for e in recording(project) if e["event"] == "done"]
    assert done["errors"] == [{"role": "counter", "interface": "count", "message": "RuntimeError: the counter broke"}]
    assert flowc("test", cwd=project).returncode == 0


def test_errors_compare_by_role_and_interface_unless_messages_are_asked_for(project):
    roles(project, failure="first wording")
    flowc("test", "--update", cwd=project)
    roles(project, failure="second wording")
    assert flowc("test", cwd=project).returncode == 0
    strict = flowc("test", "--error-messages", cwd=project)
    assert strict.returncode == 1
    assert "+error: counter.count: RuntimeError: second wording" in strict.stdout


def test_update_keeps_a_recording_that_still_matches(project):
    path = project / "tests" / "talk.events.jsonl"
    events = recording(project)
    reordered = [e for e in events if e.get("field") != "tag"]
    reordered[1:1] = [e for e in events if e.get("field") == "tag"][::-1]
    text = "".join(json.dumps(e) + "\n" for e in reordered)
    path.write_text(text)
    result = flowc("test", "--update", cwd=project)
    assert result.returncode == 0 and result.stdout.startswith("PASS")
    assert path.read_text() == text


def test_an_unrecorded_case_fails_until_recorded(project):
    (project / "tests" / "talk.loud.input.json").write_text('{"request": {"what": "LOUD"}}')
    result = flowc("test", cwd=project)
    assert result.returncode == 1
    assert "FAIL     tests/talk.loud\n    no recording at tests/talk.loud.events.jsonl" in result.stdout
    assert flowc("test", "--update", "tests/talk.loud.input.json", cwd=project).returncode == 0
    assert flowc("test", cwd=project).stdout.endswith("2 cases: 2 passed, 0 failed\n")


def test_junit_xml_validates_and_is_deterministic_but_for_times(project, golden):
    roles(project, total=4)
    (project / "tests" / "talk.broken.input.json").write_text("[1, 2]")
    (project / "tests" / "chat.input.json").write_text("{}")
    report = project / "report.xml"
    result = flowc("test", "--junit", str(report), cwd=project)
    assert result.returncode == 2  # cases that cannot run outrank a failure
    SCHEMA.validate(str(report))
    text = report.read_text()
    assert 'failures="1" errors="2"' in text
    normalized = re.sub(r'time="[0-9.]+"', 'time="…"', text)
    assert normalized == golden


def test_a_hung_role_is_cancelled_by_the_timeout_and_fails(project):
    roles(project, failure="hang")
    result = flowc("test", "--timeout", "0.5", cwd=project)
    assert result.returncode == 1
    assert "    +done: cancelled (timeout)" in result.stdout and "    +missing: total" in result.stdout
    assert flowc("test", "--timeout", "0", cwd=project).returncode == 2


def test_bad_inputs_are_one_line_errors(project):
    tests = project / "tests"
    (tests / "talk.list.input.json").write_text("[1, 2]")
    (tests / "talk.wrong.input.json").write_text('{"reqest": 1}')
    result = flowc("test", cwd=project)
    assert result.returncode == 2
    assert "ERROR    tests/talk.list\n    tests/talk.list.input.json holds a JSON list; it holds what `flowc run" in result.stdout
    assert "ERROR    tests/talk.wrong\n    the call was refused: graph `talk` takes request; missing request" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_paths_that_name_no_case(project, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    result = flowc("test", str(empty), cwd=project)
    assert result.returncode == 2 and "no golden cases under" in result.stderr
    assert flowc("test", "nowhere", cwd=project).returncode == 2
    (project / "tests" / "chat.input.json").write_text("{}")
    result = flowc("test", "tests/chat.input.json", cwd=project)
    assert result.returncode == 2
    assert "no .flow file in . declares graph `chat` (pipeline.flow has talk)" in result.stdout
    (project / "talk.input.json").write_text("{}")
    result = flowc("test", "talk.input.json", cwd=project)
    assert result.returncode == 2 and "a case lives in a `tests/` directory beside its pipeline" in result.stderr


def test_a_pipeline_with_errors_fails_its_cases(project):
    (project / "pipeline.flow").write_text(PIPELINE.replace("return total", "return totl"))
    result = flowc("test", "pipeline.flow", cwd=project)
    assert result.returncode == 1
    assert "pipeline.flow has errors; fix them first" in result.stdout and "Traceback" not in result.stderr


def test_pipelines_with_a_roles_module_of_the_same_name_each_get_their_own(tmp_path):
    for name, total in (("one", 1), ("two", 2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "pipeline.flow").write_text(PIPELINE)
        roles(folder, total=total)
        (folder / "tests").mkdir()
        (folder / "tests" / "talk.input.json").write_text('{"request": {"what": "x"}}')
    assert flowc("test", "--update", cwd=tmp_path).returncode == 0
    totals = []
    for name in ("one", "two"):
        events = map(json.loads, (tmp_path / name / "tests" / "talk.events.jsonl").read_text().splitlines())
        totals += [e["value"]["count"] for e in events if e["event"] == "return"]
    assert totals == [1, 2]


def test_deploy_local_gives_the_same_events(project):
    result = flowc("test", "--deploy", "local", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert flowc("test", "--deploy", "nowhere", cwd=project).returncode == 2


def test_an_input_the_graph_refuses_is_an_error_that_cannot_be_re_recorded(project):
    (project / "tests" / "talk.typo.input.json").write_text('{"requset": {"what": "words"}}\n')
    result = flowc("test", "tests/talk.typo.input.json", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == "ERROR    tests/talk.typo"
    assert "the call was refused" in result.stdout and "fix tests/talk.typo.input.json" in result.stdout
    assert "--update" not in result.stderr  # nothing to re-record
    assert flowc("test", "--update", "tests/talk.typo.input.json", cwd=project).returncode == 2
    assert not (project / "tests" / "talk.typo.events.jsonl").exists()


STATEFUL = """
class Speaker:
    async def talk(self, ctx, request):
        yield {"word": "w", "tag": "t"}


class Counter:
    def __init__(self):
        self.calls = 0  # what an earlier case left here would change a later case's answer

    async def count(self, ctx, request):
        self.calls += 1
        return {"total": {"count": self.calls, "of": request["what"]}}
"""


def test_each_case_runs_on_a_deployment_of_its_own(project):
    (project / "probe_roles.py").write_text(STATEFUL)
    (project / "tests" / "talk.again.input.json").write_text('{"request": {"what": "again"}}\n')
    assert flowc("test", "--update", cwd=project).returncode == 0
    for case in ("talk", "talk.again"):
        (returned,) = [
            e
            for e in map(json.loads, (project / "tests" / f"{case}.events.jsonl").read_text().splitlines())
            if e["event"] == "return"
        ]
        assert returned["value"]["count"] == 1, (case, returned)  # the first call of its deployment, both times
    alone = flowc("test", "tests/talk.again.input.json", cwd=project)
    assert alone.returncode == 0, alone.stdout  # alone or after another case: the same answer


def test_update_writes_a_recording_whole_or_keeps_the_old_one(project):
    import resource

    before = (project / "tests" / "talk.events.jsonl").read_text()
    roles(project, words=tuple(f"word{i:04d}" * 16 for i in range(1000)), tags=("x",) * 1000)  # a recording of ~200 KiB

    def small_files():  # (in the child: no file can grow past 64 KiB: the bundle's do not, the recording does)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))

    import signal as signals

    result = subprocess.run(
        [sys.executable, "-m", "flowc", "test", "--update"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=180,
        preexec_fn=lambda: (signals.signal(signals.SIGXFSZ, signals.SIG_IGN), small_files()),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot write tests/talk.events.jsonl" in result.stdout and "the old recording is kept" in result.stdout
    assert (project / "tests" / "talk.events.jsonl").read_text() == before
    assert not [p.name for p in (project / "tests").iterdir() if p.name.endswith(".tmp")]


def test_a_done_event_of_the_wrong_shape_is_a_bad_recording_not_a_crash(project):
    path = project / "tests" / "talk.events.jsonl"
    lines = path.read_text().splitlines()
    lines[-1] = '{"event": "done", "status": "ok", "errors": 5, "missing": []}'
    path.write_text("\n".join(lines) + "\n")
    result = flowc("test", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"tests/talk.events.jsonl:{len(lines)}: a done event's `errors` is a list, not 5" in result.stdout
    assert "internal error" not in result.stderr
    assert flowc("test", "--update", cwd=project).returncode == 0


def test_junit_holds_what_a_role_printed_in_colour_as_valid_xml(project):
    roles(project, failure="\x1b[31mCUDA driver missing\x1b[0m \x01")
    result = flowc("test", "--error-messages", "--junit", "report.xml", cwd=project)
    assert result.returncode == 1
    report = (project / "report.xml").read_text()
    SCHEMA.validate(report)  # (a control character would not even parse)
    assert "\\x1b[31mCUDA driver missing" in report


HANGING = """
import asyncio


class Speaker:
    async def setup(self, ctx):
        await asyncio.Event().wait()  # never returns

    async def talk(self, ctx, request):
        yield {"word": "w", "tag": "t"}


class Counter:
    async def count(self, ctx, request):
        print("a role's own print")
        return {"total": {"count": 1, "of": request["what"]}}
"""


def test_a_setup_that_never_returns_is_an_error_after_the_start_timeout(project):
    (project / "probe_roles.py").write_text(HANGING)
    result = flowc("test", "--start-timeout", "2", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "did not start within 2s: a role's setup() does not return" in result.stdout


def test_what_roles_print_goes_to_stderr_not_into_the_report(project):
    (project / "probe_roles.py").write_text(HANGING.replace("await asyncio.Event().wait()  # never returns", "pass"))
    result = flowc("test", cwd=project)
    assert "a role's own print" not in result.stdout and "a role's own print" in result.stderr
