"""The `flowc` command line (click): the command group and the compiler's commands. The
commands for pipeline authors' CI (`test`, `diff`) live in `flowc.citools.commands` and are
registered here; what both need (reading and checking a file, exit codes) is `flowc.cli_support`.

Exit codes: 0 clean (warnings allowed unless --strict), 1 errors in the input, 2 usage or I/O
problems, 3 an internal error (a bug in flowc; `--debug` shows the traceback). No traceback
reaches the user without `--debug`.
"""

from __future__ import annotations

import json
import keyword
import sys
from pathlib import Path

import click

from flowc import __version__
from flowc.check import check_source
from flowc.citools import commands as ci_commands
from flowc.cli_support import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, FlowcGroup
from flowc.cli_support import checked_program as _checked_program
from flowc.cli_support import color as _color
from flowc.cli_support import color_option as _color_option
from flowc.cli_support import read_path as _read
from flowc.diagnostics import Diagnostic, Severity, render_json, render_text, summary_line
from flowc.fmt import format_source
from flowc.lsp.scheduler import DEFAULT_DEBOUNCE_S
from flowc.running import front_door_options
from flowc.top import top as top_command
from flowrt.options import DEFAULT_MAX_BODY_MB, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL


@click.group(cls=FlowcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="flowc")
@click.option("--debug", is_flag=True, help="Show Python tracebacks: of internal errors, and in `run`'s log of role errors.")
def main(debug: bool) -> None:
    """flowc: compile .flow multimodal inference pipelines.

    \b
    Examples:
      flowc check examples/image_chat/pipeline.flow
      flowc fmt --check examples/*/pipeline.flow
      flowc plan examples/image_chat/pipeline.flow
    """


class _Inputs:
    """The files of one `check` or `fmt`: each that does not read is reported on stderr and
    skipped, so one bad name does not hide the other files' results (the command exits 2)."""

    def __init__(self, paths: tuple[str, ...]):
        self.paths = paths
        self.unreadable: list[str] = []

    def __iter__(self):
        for path in self.paths:
            try:
                source, file = _read(path)
            except click.UsageError as error:
                click.echo(f"flowc: {error.message}", err=True)
                self.unreadable.append(path)
                continue
            yield path, source, file


_format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Diagnostics as text for people or JSON for tools.",
)


@main.command()
@click.argument("files", nargs=-1, required=True)
@_format_option
@_color_option
@click.option("--strict", is_flag=True, help="Treat warnings as errors.")
def check(files: tuple[str, ...], output_format: str, color: bool | None, strict: bool) -> None:
    """Check .flow files and report every problem, sorted by position.

    \b
    Examples:
      flowc check pipeline.flow
      flowc check --format json pipeline.flow | jq '.diagnostics[].code'
    """
    all_diagnostics: list[Diagnostic] = []
    sources: dict[str, str] = {}
    inputs = _Inputs(files)
    for path, source, file in inputs:
        result = check_source(source.text, "<stdin>" if path == "-" else path, file)
        all_diagnostics += result.diagnostics
        sources.update(result.sources)
    failed = any(d.severity is Severity.ERROR or strict for d in all_diagnostics)
    if output_format == "json":
        click.echo(
            json.dumps(
                {
                    "diagnostics": json.loads(render_json(all_diagnostics)),
                    "errors": sum(d.severity is Severity.ERROR for d in all_diagnostics),
                    "warnings": sum(d.severity is Severity.WARNING for d in all_diagnostics),
                    "unreadable": inputs.unreadable,
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        if all_diagnostics:
            click.echo(render_text(all_diagnostics, sources, _color(color)))
        read = len(files) - len(inputs.unreadable)
        noun = "file" if read == 1 else "files"
        unread = f"{len(inputs.unreadable)} could not be read" if inputs.unreadable else ""
        if read:
            click.echo(f"checked {read} {noun}: {summary_line(all_diagnostics)}" + (f"; {unread}" if unread else ""))
        else:
            click.echo(f"checked nothing: {unread}")
    sys.exit(EXIT_USAGE if inputs.unreadable else EXIT_ERRORS if failed else EXIT_OK)


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--check", "check_only", is_flag=True, help="Change nothing; exit 1 if a file would be reformatted.")
@click.option("--diff", is_flag=True, help="Print what would change as a unified diff; change nothing.")
@_color_option
def fmt(files: tuple[str, ...], check_only: bool, diff: bool, color: bool | None) -> None:
    """Format .flow files in the canonical layout (in place; `-` reads stdin, writes stdout).

    \b
    Examples:
      flowc fmt pipeline.flow
      flowc fmt --check examples/*/pipeline.flow
    """
    import difflib

    failed = False
    unwritable: list[str] = []
    inputs = _Inputs(files)
    for path, source, file in inputs:
        text = source.original  # fmt keeps a BOM (docs/language.md, "Formatting")
        display = "<stdin>" if path == "-" else path
        formatted, diagnostics = format_source(text, display)
        if formatted is None:
            click.echo(render_text(diagnostics, {display: source.text}, _color(color)), err=True)
            click.echo(f"flowc: {display} has syntax errors; not formatted", err=True)
            failed = True
            continue
        if path == "-" and not (check_only or diff):
            click.echo(formatted, nl=False)
            continue
        if formatted == text:
            continue
        if diff:
            click.echo(
                "".join(difflib.unified_diff(text.splitlines(True), formatted.splitlines(True), display, display)), nl=False
            )
        if check_only or diff:
            click.echo(f"would reformat {display}", err=True)
            failed = True
        else:
            assert file is not None
            try:
                file.write_text(formatted, encoding="utf-8")
            except OSError as error:
                click.echo(f"flowc: cannot write {display}: {error.strerror}; it is unchanged", err=True)
                unwritable.append(path)
                continue
            click.echo(f"reformatted {display}", err=True)
    sys.exit(EXIT_USAGE if inputs.unreadable or unwritable else EXIT_ERRORS if failed else EXIT_OK)


@main.command()
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (schema: docs/plan.schema.json).")
@_color_option
def plan(file: str, as_json: bool, color: bool | None) -> None:
    """Check a .flow file and print its static plan: per graph, how every interface is
    activated (direct, bucket, join), diamond roots, critical slots, control edges, loops.

    \b
    Examples:
      flowc plan examples/image_chat/pipeline.flow
      flowc plan --json examples/image_chat/pipeline.flow
    """
    from flowc.plan import build_plan
    from flowc.plan.text import plan_text

    static_plan = build_plan(_checked_program(file, color))
    click.echo(json.dumps(static_plan.as_json(), indent=2, sort_keys=True) if as_json else plan_text(static_plan), nl=as_json)


@main.command()
@click.argument("file")
@click.option("--format", "picture", type=click.Choice(["mermaid", "dot", "svg"]), default="mermaid", show_default=True)
@click.option("--graph", "graph_name", help="Which graph to draw (default: the first one declared).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write to a file instead of stdout.")
@_color_option
def graph(file: str, picture: str, graph_name: str | None, output: str | None, color: bool | None) -> None:
    """Draw a graph of a .flow file: roles as clusters, interfaces as nodes, fields on edges;
    buckets, joins and session nodes marked; loop back edges dashed.

    \b
    Examples:
      flowc graph examples/image_chat/pipeline.flow > chat.mmd
      flowc graph --format svg -o chat.svg examples/image_chat/pipeline.flow
    """
    from flowc.plan import build_plan, pictures

    static_plan = build_plan(_checked_program(file, color))
    declared = list(_checked_program(file, color).graphs)
    if not declared:
        raise click.UsageError(f"{file} declares no graph to draw")
    name = graph_name or declared[0]
    if name not in static_plan.graphs:
        raise click.UsageError(f"no graph `{name}` in {file}; it has {', '.join(declared)}")
    if graph_name is None and len(declared) > 1:
        click.echo(f"flowc: drawing graph `{name}`; choose another with --graph ({', '.join(declared)})", err=True)
    try:
        text = {"mermaid": pictures.mermaid, "dot": pictures.dot, "svg": pictures.svg}[picture](static_plan.graphs[name])
    except pictures.GraphvizMissing as error:
        click.echo(f"flowc: {error}", err=True)
        sys.exit(EXIT_USAGE)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as error:
            raise click.UsageError(f"cannot write {output}: {error.strerror}; choose a writable path for -o") from None
    else:
        click.echo(text, nl=False)


@main.command()
@click.argument("file")
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(file_okay=False),
    help="Directory of the bundle [default: build/<flow name>_bundle/ in FILE's directory].",
)
@click.option(
    "--target",
    "targets",
    type=click.Choice(["local", "ray", "k8s", "all"]),
    multiple=True,
    default=("all",),
    show_default=True,
    help="Deployment manifests to generate (repeatable).",
)
@click.option(
    "--vendor",
    is_flag=True,
    help="Copy the roles' impl modules (and the local modules they import) into the bundle, so it runs without the source tree.",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing: build in memory and exit 1, with a diff, if the bundle in the directory differs from it.",
)
@_color_option
def build(file: str, out: str | None, targets: tuple[str, ...], vendor: bool, check_only: bool, color: bool | None) -> None:
    """Check a .flow file and write its bundle: bundle.json, plan.json, nodes/<role>.py,
    __main__.py and deploy/ manifests. Output is byte-for-byte deterministic. Without -o the
    bundle goes to build/<flow name>_bundle/ beside the file; --check compares instead of writing.

    \b
    Examples:
      flowc build examples/image_chat/pipeline.flow     # writes examples/image_chat/build/image_chat_bundle/
      flowc build examples/image_chat/pipeline.flow -o build/image_chat
      flowc build pipeline.flow -o out --target local --target k8s
      flowc build pipeline.flow -o out --vendor      # a bundle that runs without the source tree
      flowc build pipeline.flow -o bundle --check    # CI: is the committed bundle current?
    """
    from flowc.citools import bundles
    from flowc.codegen import TARGETS, build_bundle
    from flowc.codegen.vendor import VendorError

    if out == "":
        raise click.UsageError("-o needs a directory name, for example `-o build/bundle`")
    if out is None and file == "-":
        raise click.UsageError("a pipeline read from stdin has no directory to build beside; pass -o DIR")
    program = _checked_program(file, color)
    if not program.root.name.isidentifier() or keyword.iskeyword(
        program.root.name
    ):  # (from the file's name: a `flow NAME` line is checked)
        raise click.UsageError(
            f"{file}: the flow's name comes from the file's name, {program.root.name!r}, which is not a name "
            "(letters, digits and _, not starting with a digit); add a `flow NAME` line at the top of the file"
        )
    out_dir = bundles.default_output(Path(file), program.root.name, check_only) if out is None else Path(out)
    chosen = TARGETS if "all" in targets else tuple(t for t in TARGETS if t in targets)
    try:
        bundle = build_bundle(program, Path(file), out_dir, chosen, vendor=vendor)
    except VendorError as error:
        raise click.UsageError(str(error)) from None
    if check_only:
        try:
            staleness = bundles.compare(bundle, out_dir)
        except bundles.Unreadable as error:
            raise click.UsageError(str(error)) from None
        options = "".join(f" --target {t}" for t in targets if "all" not in targets) + (" --vendor" if vendor else "")
        sys.exit(EXIT_OK if bundles.report(staleness, out_dir, file, click.echo, options) else EXIT_ERRORS)
    try:
        _prepare_output(out_dir)
        bundle.write(out_dir)
    except OSError as error:
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(out_dir) else ""
        raise click.UsageError(
            f"cannot write the bundle to {out_dir}{where}: {error.strerror}; choose a writable directory for -o"
        ) from None
    click.echo(f"wrote {out_dir}: {len(bundle.files)} files, {bundle.size:,} bytes ({', '.join(chosen)})")


BUNDLE_TOP = frozenset({"__init__.py", "__main__.py", "bundle.json", "plan.json"})  # what a bundle holds at its top
BUNDLE_DIRS = frozenset({"deploy", "nodes", "vendor"})  # and below these


def _previous_bundle_files(out: Path) -> list[str] | None:
    """The files a bundle that flowc wrote at `out` lists in its bundle.json; None where `out`
    holds no such bundle (no bundle.json, or one flowc did not write)."""
    try:
        manifest = json.loads((out / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("flowc_version"), str):
        return None
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return files


def _prepare_output(out: Path) -> None:
    """Remove the files of a previous bundle at `out`; refuse to write into anything else.
    Only what a bundle can hold is removed (its top files, deploy/, nodes/, vendor/), and only
    where bundle.json is flowc's: a directory of other files is never touched."""
    if not out.exists():
        return
    if not out.is_dir():
        raise click.UsageError(f"{out} exists and is not a directory")
    files = _previous_bundle_files(out)
    if files is None:
        if any(out.iterdir()):
            raise click.UsageError(f"{out} is not empty and holds no bundle; choose an empty or new directory")
        return
    root = out.resolve()
    for relative in files:
        parts = Path(relative).parts
        if not parts or (relative not in BUNDLE_TOP and parts[0] not in BUNDLE_DIRS) or ".." in parts:
            continue
        target = out / relative
        if root in target.resolve().parents and target.is_file() and not target.is_symlink():
            target.unlink()


@main.command()
@click.argument("target")
@click.option("--once", "graph_name", metavar="GRAPH", help="Call GRAPH once, print its events as JSON lines, and exit.")
@click.option(
    "--input",
    "input_json",
    default="{}",
    show_default=True,
    help="JSON object mapping each entry placeholder to its value, or @FILE.",
)
@click.option("--session", help="Session id (calls of one session run one at a time).")
@click.option(
    "--timeout",
    metavar="SECONDS",
    help="Cancel the call after this many seconds, a finite number > 0 (default: the graph's own timeout).",
)
@click.option(
    "--http", "http", metavar="HOST:PORT", default="127.0.0.1:8000", show_default=True, help="Where to serve (without --once)."
)
@click.option(
    "--session-ttl",
    metavar="SECONDS",
    default=f"{DEFAULT_SESSION_TTL:g}",
    show_default=True,
    help="Serving: an idle session's state (its roles' globals) is dropped after this long.",
)
@click.option(
    "--max-sessions",
    metavar="N",
    default=str(DEFAULT_MAX_SESSIONS),
    show_default=True,
    help="Serving: at most N idle sessions keep their state; the least recently used go first.",
)
@click.option(
    "--max-body-mb",
    metavar="MIB",
    default=f"{DEFAULT_MAX_BODY_MB:g}",
    show_default=True,
    help="Serving: the largest request body accepted, in MiB.",
)
@click.option(
    "--deploy",
    default="inproc",
    show_default=True,
    metavar="inproc|local|ray[=ADDRESS]",
    help="Where the roles run: this process, one process per replica (local), or Ray actors (docs/deploy.md).",
)
@click.option(
    "--registry",
    metavar="URL",
    help="local/ray: keep the replica registry in Redis (redis://[:PASSWORD@]HOST:PORT/DB, rediss://...) instead of the embedded one.",
)
@click.option(
    "--heartbeat-ttl",
    metavar="SECONDS",
    help="local/ray: a replica not heard from for this long is dropped (its calls end with an error) and restarted [default: 3].",
)
@click.option(
    "--pool-mb",
    metavar="MIB",
    help="local/ray: the shared-memory pool for tensors between role processes (docs/memory.md); 0 turns it off [default: 1024].",
)
@click.option(
    "--kv-meta",
    metavar="URL",
    help="Where KVCache globals keep their page metadata: `embedded` (each process its own) or redis://HOST:PORT/DB, "
    "shared by every process of the deployment (docs/kv.md) [default: $FLOWRT_KV_META, else embedded].",
)
@click.option("--trace", "trace_file", metavar="FILE", help="With --once: write the call's Chrome trace (Perfetto) to FILE.")
@click.option("--debug", "run_debug", is_flag=True, help="Log debug records and full tracebacks (as `flowc --debug run`).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True, help="The log on stderr: lines for people, or one JSON object per event (docs/observe.md).")  # fmt: skip
@click.option("--quiet", is_flag=True, help="Serving: print only the URL line, not how the start goes.")
@front_door_options  # --api-key, --max-in-flight, --grace, ... (flowrt.frontdoor; docs/security.md)
@_color_option
@click.pass_context
def run(
    ctx: click.Context,
    target: str,
    graph_name: str | None,
    input_json: str,
    session: str | None,
    timeout: str | None,
    http: str,
    session_ttl: str,
    max_sessions: str,
    max_body_mb: str,
    deploy: str,
    registry: str | None,
    heartbeat_ttl: str | None,
    pool_mb: str | None,
    kv_meta: str | None,
    trace_file: str | None,
    run_debug: bool,
    log_format: str,
    quiet: bool,
    color: bool | None,
    front: dict,
) -> None:
    """Serve a bundle (a directory from `flowc build`) or a .flow file (built to a temporary
    bundle first) over HTTP, or call one graph with --once; --deploy picks where the roles run
    (this process, one process per replica, or Ray actors: docs/deploy.md).

    \b
    Serving (docs/runtime.md, "Serving"): POST /graphs/GRAPH with a JSON object of entry values
    answers with one JSON event per line, the same lines --once prints; GET /health, /graphs and
    /stats describe the server. SIGTERM drains (the calls in flight have --grace seconds to
    finish); Ctrl-C cancels the calls in flight and stops. API keys, limits: docs/security.md.

    \b
    Prints one JSON object per event: {"event": "stream" | "return", "field": F, "value": V},
    then {"event": "done", "status": "ok" | "error" | "cancelled", "errors": [...], "missing": [...]}.
    The exit status is 0 only when the status is "ok"; 130 or 143 when SIGINT or SIGTERM
    cancelled the call. The runtime's log (role errors; tracebacks with --debug) goes to stderr.

    \b
    Examples:
      flowc run examples/image_chat/pipeline.flow --once chat \\
          --input '{"request": {"segments": [{"type": "text", "text": "a red cat"}]}}'
      flowc run build/image_chat --once chat --input @request.json --session s1 --trace call.json
      flowc run build/image_chat --http 127.0.0.1:8000 --session-ttl 600
    """
    import asyncio
    import tempfile

    from flowc import running
    from flowrt import options
    from flowrt.logs import show_log

    debug = run_debug or bool(ctx.find_root().params.get("debug"))
    show_log(debug=debug, log_format=log_format)  # (first: what the runtime says as it loads is in the log's format)
    if graph_name is None and (input_json != "{}" or session or timeout is not None):
        raise click.UsageError(
            "--input, --session and --timeout belong to one call: add --once GRAPH, "
            "or leave them out to serve (a request gives its own)"
        )
    if trace_file is not None and graph_name is None:
        raise click.UsageError("--trace records one call: add --once GRAPH (a served call asks with ?trace=1)")
    seconds = running.option_value(options.timeout_seconds, "--timeout", timeout)
    ttl = running.option_value(options.session_ttl_seconds, "--session-ttl", session_ttl)
    cap = running.option_value(options.session_cap, "--max-sessions", max_sessions)
    body_mb = running.option_value(options.size_mib, "--max-body-mb", max_body_mb)
    placement = running.placement(deploy, registry, heartbeat_ttl, pool_mb)
    if kv_meta is not None:
        running.use_kv_meta(kv_meta)
    inputs = running.parse_input(input_json) if graph_name is not None else {}
    path = Path(target)
    with tempfile.TemporaryDirectory(prefix="flowc-run-") as scratch:
        if path.suffix == ".flow" or path.is_file():
            from flowc.codegen import build_bundle

            program = _checked_program(target, color)
            bundle_dir = Path(scratch) / "bundle"
            build_bundle(program, path, bundle_dir).write(bundle_dir)
        else:
            bundle_dir = path
        if graph_name is None:
            running.serve_bundle(bundle_dir, http, ttl, cap, body_mb, placement, debug, quiet, front)
            return
        code = asyncio.run(running.run_once(bundle_dir, graph_name, inputs, session, seconds, placement, debug, trace_file))
    sys.exit(code)


@main.command()
@click.argument("file")
@click.option("-o", "--output", required=True, help="The picture: call.svg, or call.html (the picture and a table).")
def trace(file: str, output: str) -> None:
    """Draw one call's trace (from `run --trace` or `?trace=1`) with a swimlane per replica
    and a bar per activation (docs/observe.md).

    \b
    Examples:
      flowc run build/image_chat --once chat --input @request.json --trace call.json
      flowc trace call.json -o call.svg
    """
    from flowrt.observe.picture import TraceFileError, write_picture

    try:
        click.echo(write_picture(file, output))
    except TraceFileError as error:
        raise click.UsageError(str(error)) from None


@main.command()
@click.option("--stdio", is_flag=True, help="Talk over stdin and stdout (the default and only transport).")
@click.option(
    "--debounce-ms",
    type=click.FloatRange(min=0, max=60_000),
    default=DEFAULT_DEBOUNCE_S * 1000,
    show_default=True,
    help="Check an edited document once edits have paused this long (open and save check at once).",
)
def lsp(stdio: bool, debounce_ms: float) -> None:
    """Run the language server for editors (Language Server Protocol over stdio).

    \b
    Diagnostics on open, save and, after a pause in edits, on change (checked off the
    event loop, outdated results dropped); hover, go to definition, references,
    completion, document symbols and formatting. Editors start it; see editors/vscode/.
    """
    if debounce_ms != debounce_ms:  # NaN passes FloatRange
        raise click.BadParameter("nan is not a number of milliseconds; give one from 0 to 60000", param_hint="--debounce-ms")
    try:
        from flowc.lsp.server import main as serve
    except ImportError as error:  # pygls is a dependency; a broken install gets a fix, not a traceback
        raise click.ClickException(f"the language server needs pygls ({error}); reinstall flowc: pip install flowc") from None
    serve(debounce_ms / 1000)


# the commands for pipeline authors' CI (docs/ci.md)
main.add_command(ci_commands.golden_test)
main.add_command(ci_commands.semantic_diff)
main.add_command(top_command)  # `flowc top URL` (flowc.top)
