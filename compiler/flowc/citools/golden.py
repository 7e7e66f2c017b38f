"""Running golden cases (`flowc test`): each pipeline is checked, built to a temporary bundle
and deployed once (`--deploy`, as `flowc run` does); its cases are called one after another,
each without a session (so no state carries from one case to the next), and their events are
compared with the recordings (`flowc.citools.events`), or recorded with `--update`.

With `--update` a case whose events still match keeps its file untouched, so re-recording
never churns a recording that only differs in what the language leaves open (the order of an
unordered stream, the interleaving of fields, an error's message).

Pipelines run in this process under `--deploy inproc`: modules imported from a pipeline's
directory (and its parent: the bundle's import path) are forgotten after its cases, so two
pipelines whose roles share a module name (`roles.py`) each get their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flowc import running
from flowc.check import check_file
from flowc.citools import events
from flowc.citools.cases import Case
from flowc.diagnostics import Severity, render_text

PASSED, FAILED, ERROR, RECORDED, UPDATED = "passed", "failed", "error", "recorded", "updated"
OPEN_TIMEOUT_S = 120.0  # seconds a case's deployment has to start (the local supervisor's own bound too)
DEFAULT_TIMEOUT_S = 60.0  # a case of a graph without a timeout of its own: a hung role must not hang CI


@dataclass(frozen=True)
class Options:
    update: bool = False
    placement: dict | None = None
    timeout: float | None = None  # None: the graph's own timeout, else DEFAULT_TIMEOUT_S
    messages: bool = False  # compare the errors' messages too
    debug: bool = False
    start_timeout: float = OPEN_TIMEOUT_S  # seconds a case's deployment has to start


@dataclass(frozen=True)
class Outcome:
    case: Case
    verdict: str  # PASSED, FAILED, ERROR, RECORDED or UPDATED
    detail: str = ""  # a failure's (or an update's) diff, an error's reason, what was recorded
    seconds: float = 0.0
    code: int = 0  # what it makes the exit status: 0, 1 (a failed case, a pipeline with errors) or 2 (cannot run)


def run_cases(cases: list[Case], options: Options) -> list[Outcome]:
    """Every case's outcome, in the order of `cases`. What roles print (under inproc they run
    in this process) goes to stderr: stdout is the report."""
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(_run_all(cases, options))


async def _run_all(cases: list[Case], options: Options) -> list[Outcome]:
    outcomes: dict[Case, Outcome] = {}
    by_pipeline: dict[Path, list[Case]] = {}
    for case in cases:
        if case.pipeline is None:
            outcomes[case] = Outcome(case, ERROR, case.problem, code=2)
        else:
            by_pipeline.setdefault(case.pipeline, []).append(case)
    for pipeline, group in by_pipeline.items():
        for outcome in await _run_pipeline(pipeline, group, options):
            outcomes[outcome.case] = outcome
    return [outcomes[case] for case in cases]


async def _run_pipeline(pipeline: Path, cases: list[Case], options: Options) -> list[Outcome]:
    from flowc.codegen import build_bundle
    from flowc.plan import build_plan

    try:
        result = check_file(pipeline, pipeline.as_posix())
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
        return [Outcome(c, ERROR, f"cannot read {pipeline.as_posix()}: {reason}", code=2) for c in cases]
    if not result.ok or result.program is None:
        errors = [d for d in result.diagnostics if d.severity is Severity.ERROR]
        detail = render_text(errors, result.sources, False) + f"\n{pipeline.as_posix()} has errors; fix them first (flowc check)"
        return [Outcome(c, ERROR, detail, code=1) for c in cases]
    plan = build_plan(result.program)
    outcomes: list[Outcome] = []
    ready: list[tuple[Case, dict]] = []
    for case in cases:
        try:
            ready.append((case, _inputs(case)))
        except ValueError as error:
            outcomes.append(Outcome(case, ERROR, str(error), code=2))
    if not ready:
        return outcomes
    with tempfile.TemporaryDirectory(prefix="flowc-test-") as scratch, _own_imports(pipeline):
        bundle_dir = Path(scratch) / "flowc-test-bundle"
        try:
            build_bundle(result.program, pipeline, bundle_dir).write(bundle_dir)
        except OSError as error:
            reason = f"cannot build {pipeline.as_posix()} in {scratch}: {error.strerror or error}; free the disk (or set TMPDIR)"
            return outcomes + [Outcome(c, ERROR, reason, code=2) for c, _ in ready]
        for case, inputs in ready:  # each on a deployment of its own: no case sees what another left in a role
            graph = plan.graphs[case.graph]
            ordered = {o.field: o.ordered for o in graph.outputs if o.kind == "stream"}
            timeout = options.timeout or graph.timeout_s or DEFAULT_TIMEOUT_S
            try:
                async with running.deployed(bundle_dir, options.placement, options.debug, options.start_timeout) as runtime:
                    started = time.perf_counter()
                    try:
                        observed = await running.call_events(runtime, case.graph, inputs, timeout)
                    except running.Refused as error:
                        reason = f"the call was refused: {error.message}; fix {case.input.as_posix()}"
                        outcomes.append(Outcome(case, ERROR, reason, time.perf_counter() - started, 2))
                        continue
                    outcomes.append(_judge(case, observed, ordered, options, time.perf_counter() - started))
            except running.Refused as error:
                outcomes.append(Outcome(case, ERROR, f"{pipeline.as_posix()} cannot run: {error.message}", code=2))
    return outcomes


def _inputs(case: Case) -> dict:
    """The case's input object; ValueError naming the file and the fix."""
    shown = case.input.as_posix()
    fix = "it holds what `flowc run --once GRAPH --input` takes: a JSON object mapping each entry placeholder to its value"
    try:
        text = case.input.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{shown} is not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise ValueError(f"cannot read {shown}: {error.strerror or error}") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{shown} is nested too deeply to read as JSON") from None
    except ValueError as error:
        raise ValueError(f"{shown} is not valid JSON ({error}); {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{shown} holds a JSON {type(value).__name__}; {fix}")
    return value


def _judge(case: Case, observed: list[dict], ordered: dict[str, bool], options: Options, seconds: float) -> Outcome:
    recording = case.events
    shown = recording.as_posix()
    recorded: list[dict] | None = None
    try:
        recorded = events.parse(recording.read_text(encoding="utf-8"), shown)
    except FileNotFoundError:
        pass
    except events.BadRecording as error:
        if not options.update:
            return Outcome(case, ERROR, str(error), seconds, 2)
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
        return Outcome(case, ERROR, f"cannot read {shown}: {reason}", seconds, 2)
    diff = None
    if recorded is not None:
        diff = events.difference(recorded, observed, ordered, options.messages, label=shown)
        if diff is None:
            return Outcome(case, PASSED, "", seconds)
        if not options.update:
            return Outcome(case, FAILED, diff, seconds, 1)
    elif not options.update:
        return Outcome(
            case,
            FAILED,
            f"no recording at {shown}: record it with `flowc test --update {case.input.as_posix()}` and review it",
            seconds,
            1,
        )
    try:
        data = events.dump(observed).encode("utf-8")
    except UnicodeEncodeError as error:
        reason = f"the events hold text that is not valid Unicode ({error.reason}: {error.object[error.start : error.end]!r})"
        return Outcome(case, ERROR, f"cannot record {shown}: {reason}; fix the role that produced it", seconds, 2)
    try:
        _replace(recording, data)
    except OSError as error:
        return Outcome(case, ERROR, f"cannot write {shown}: {error.strerror or error} (the old recording is kept)", seconds, 2)
    if recorded is None:
        return Outcome(case, RECORDED, f"recorded {shown}", seconds)
    return Outcome(case, UPDATED, diff or "", seconds)


def _replace(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a new file beside it, renamed over it once written (a
    full disk or a size limit leaves the old recording as it was)."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(scratch, "wb") as out:
            out.write(data)
        os.replace(scratch, path)
    finally:
        with contextlib.suppress(OSError):
            scratch.unlink()


@contextlib.contextmanager
def _own_imports(pipeline: Path):
    """Forget, on leaving, the modules imported from the pipeline's directory or its parent."""
    roots = {pipeline.absolute().parent.resolve(), pipeline.absolute().parent.resolve().parent}
    path, before = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("flowc", "flowrt", "flowstd"):
                continue
            file = getattr(sys.modules.get(name), "__file__", None)
            locations = [Path(file)] if file else [Path(p) for p in getattr(sys.modules.get(name), "__path__", None) or []]
            if any(root in location.resolve().parents for location in locations for root in roots):
                del sys.modules[name]
