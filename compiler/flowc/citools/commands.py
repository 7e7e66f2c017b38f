"""The commands for pipeline authors' CI: `flowc test` (golden event tests) and `flowc diff`
(breaking-change detection). `flowc.cli` registers them; their logic lives in the modules
beside this one, and this module only reads options and prints (docs/ci.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from flowc.cli_support import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, color_option
from flowc.cli_support import color as use_color
from flowc.diagnostics import render_text

_TAGS = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "recorded": "RECORDED", "updated": "UPDATED"}


@click.command("test")
@click.argument("paths", nargs=-1)
@click.option(
    "--update",
    is_flag=True,
    help="Record the cases without a recording and re-record those whose events changed (then review the diff and commit).",
)
@click.option(
    "--deploy",
    default="inproc",
    show_default=True,
    metavar="inproc|local|ray[=ADDRESS]",
    help="Where the roles run, as for `flowc run` (docs/deploy.md); the events are the same.",
)
@click.option("--junit", "junit_file", type=click.Path(dir_okay=False), help="Also write the outcomes to FILE as JUnit XML.")
@click.option(
    "--timeout",
    metavar="SECONDS",
    help="Cancel a case's call after this long [default: the graph's own timeout, else 60].",
)
@click.option(
    "--start-timeout",
    metavar="SECONDS",
    default="120",
    show_default=True,
    help="A case whose deployment has not started by then (a setup() that never returns) is an error.",
)
@click.option("--error-messages", is_flag=True, help="Compare errors' messages too, not only their role and interface.")
@click.option("--debug", "run_debug", is_flag=True, help="Log debug records and full tracebacks of role errors.")
@click.pass_context
def golden_test(
    ctx: click.Context,
    paths: tuple[str, ...],
    update: bool,
    deploy: str,
    junit_file: str | None,
    timeout: str | None,
    start_timeout: str,
    error_messages: bool,
    run_debug: bool,
) -> None:
    """Run golden event tests: call each case's graph and compare its events with the
    recording beside it (default PATH: the working directory).

    \b
    A case is tests/GRAPH.input.json (or tests/GRAPH.LABEL.input.json) beside a pipeline:
    what `flowc run --once GRAPH --input` takes. Its recording is tests/GRAPH[.LABEL].events.jsonl.
    Compared as the language defines them: ordered streams and returns exactly, other
    streams as multisets, errors by role and interface, never timings or places.

    \b
    Examples:
      flowc test                                  # every case under the working directory
      flowc test examples/diamond/pipeline.flow --junit report.xml
      flowc test --update examples/diamond/tests/describe.input.json
    """
    from flowc import running
    from flowc.citools import cases, golden

    seconds = running.timeout_option("--timeout", timeout)
    start_seconds = running.timeout_option("--start-timeout", start_timeout)
    if junit_file == "":
        raise click.BadParameter("give a file name, for example --junit report.xml", param_hint="--junit")
    placement = running.placement(deploy, None, None)
    try:
        found = cases.discover(list(paths) or ["."])
    except cases.NoCases as error:
        click.echo(f"flowc: {error}", err=True)
        sys.exit(EXIT_USAGE)
    settings = golden.Options(
        update, placement, seconds, error_messages, run_debug or bool(ctx.find_root().params.get("debug")), start_seconds
    )
    try:
        outcomes = golden.run_cases(found, settings)
    except KeyboardInterrupt:
        click.echo("flowc: interrupted; no case after the one running was run", err=True)
        sys.exit(130)
    for outcome in outcomes:
        tag = _TAGS[outcome.verdict]
        click.echo(f"{tag:<8} {outcome.case.name}")
        if outcome.detail and outcome.verdict != "passed":
            detail = outcome.detail.encode("utf-8", "backslashreplace").decode("utf-8")  # (a lone surrogate prints escaped)
            click.echo("".join(f"    {line}\n" for line in detail.splitlines()), nl=False)
    counts = {verdict: sum(o.verdict == verdict for o in outcomes) for verdict in _TAGS}
    shown = ", ".join(
        f"{n} {'errors' if verdict == 'error' and n != 1 else verdict}"
        for verdict, n in counts.items()
        if n or verdict in ("passed", "failed")
    )
    click.echo(f"{len(outcomes)} {'case' if len(outcomes) == 1 else 'cases'}: {shown}")
    code = max((o.code for o in outcomes), default=EXIT_OK)
    if junit_file:
        from flowc.citools.junit import junit_xml

        try:
            Path(junit_file).write_text(junit_xml(outcomes), encoding="utf-8")
        except OSError as error:
            click.echo(
                f"flowc: cannot write {junit_file}: {error.strerror or error}; choose a writable path for --junit", err=True
            )
            code = EXIT_USAGE
    if not update and any(o.verdict == "failed" for o in outcomes):  # (something --update would re-record)
        click.echo(
            "flowc: if the new events are intended, re-record them with `flowc test --update` and review the diff", err=True
        )
    sys.exit(code)


@click.command("diff")
@click.argument("old")
@click.argument("new")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Changes as text for people or JSON for tools.",
)
@color_option
def semantic_diff(old: str, new: str, output_format: str, color: bool | None) -> None:
    """Compare what callers and operators see of two versions of a pipeline (graphs, entry
    types, streamed and returned fields, ordering, roles, interfaces, resources, lb) and mark
    each change breaking or compatible; exit 1 when one is breaking.

    \b
    OLD and NEW are .flow files, or git:REV:PATH for a file as it was at a git revision
    (imports are read at that revision too).

    \b
    Examples:
      flowc diff git:origin/main:pipeline.flow pipeline.flow
      flowc diff old/pipeline.flow new/pipeline.flow --format json
    """
    from flowc.citools import revisions, semantic
    from flowc.citools.surface import surface

    paint = use_color(color)
    try:
        with revisions.checked(old) as before, revisions.checked(new) as after:
            for result, side in ((before, old), (after, new)):
                if not result.ok or result.program is None:
                    click.echo(render_text(result.diagnostics, result.sources, paint), err=True)
                    click.echo(f"flowc: {side} has errors; fix them first", err=True)
                    sys.exit(EXIT_ERRORS)
            assert before.program is not None and after.program is not None
            changes = semantic.compare(surface(before.program), surface(after.program))
    except revisions.CannotRead as error:
        click.echo(f"flowc: {error}", err=True)
        sys.exit(EXIT_USAGE)
    breaking = sum(c.severity == semantic.BREAKING for c in changes)
    if output_format == "json":
        payload = {
            "old": old,
            "new": new,
            "breaking": breaking,
            "compatible": len(changes) - breaking,
            "changes": [c.as_json() for c in changes],
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        click.echo(diff_text(changes, old, new, paint), nl=False)
    sys.exit(EXIT_ERRORS if breaking else EXIT_OK)


def diff_text(changes, old: str, new: str, paint: bool = False) -> str:
    """The changes grouped by what they change, each marked and placed; a summary line last."""
    from flowc.citools.semantic import BREAKING

    lines: list[str] = []
    subject = None
    for change in changes:
        if change.subject != subject:
            subject = change.subject
            lines.append(subject)
        mark = "BREAKING" if change.severity == BREAKING else "compatible"
        if paint:
            mark = click.style(
                f"{mark:<10}", fg="red" if change.severity == BREAKING else "green", bold=change.severity == BREAKING
            )
        else:
            mark = f"{mark:<10}"
        place = f"{change.place.file}:{change.place.line}:{change.place.column}"
        lines.append(f"  {mark}  {place}  {change.detail}")
    breaking = sum(c.severity == BREAKING for c in changes)
    if not changes:
        lines.append(f"no changes callers or operators can see ({old} → {new})")
    else:
        noun = "change" if len(changes) == 1 else "changes"
        lines.append(f"{len(changes)} {noun}: {breaking} breaking, {len(changes) - breaking} compatible ({old} → {new})")
    return "\n".join(lines) + "\n"
