"""Language server: time to diagnostics after a burst of quick edits, before and after debouncing.

In ONE run it starts several `flowc lsp` servers over stdio (a pygls client, as an editor
would), opens the same generated file of `--roles` roles in each (bench/compile_bench.py's
layered pipeline), then for `--rounds` rounds sends each server a burst of `--edits`
whole-document changes back to back, each adding or removing one misspelt field so every
version has its own error count. Measured from the moment the last edit of a burst is sent:

- settle: until the diagnostics of the final version arrive (servers publish in order, so
  nothing about the burst can come later);
- publishes: how many publishDiagnostics the burst caused for the file;
- hover: a hover request sent right after the burst, until it is answered;
- checks (new servers only, from `flowc.statistics`): how many checks the burst started.

Servers, every round in the same order so machine drift hits them alike (medians reported):
- before: `compiler/flowc/lsp/server.py` as of `--baseline` (the commit before debouncing),
  loaded from git; it checks every change synchronously on the event loop. Skipped when git
  or that commit is not available (`--baseline none` skips it too);
- debounce 0 ms: checks on the worker thread, edits arriving while one runs coalesced;
- debounce 150 ms (the default of `flowc lsp`).

    python bench/lsp_bench.py [--roles 1000] [--edits 10] [--rounds 5] [--baseline REV|none]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient
from pygls.uris import from_fs_path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from compile_bench import generate  # noqa: E402

from flowc.lsp.scheduler import Snapshot  # noqa: E402
from flowc.lsp.server import analyse  # noqa: E402

# the last commit whose language server checked every change synchronously
BASELINE = "79b61897a0a72cf73b05305207f21714017804f7"
DEADLINE_S = 300  # for any one wait; a server that never answers stops the bench instead of hanging it
# runs the baseline server file given as argv[1] (a module of its own, so its dataclasses resolve)
LAUNCH_FILE = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('baseline_lsp_server', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; "
    "spec.loader.exec_module(module); module.main()"
)


def with_typos(text: str, roles: int, typos: int) -> str:
    """`text` with the input of the first `typos` eligible roles misspelt (one unknown field each)."""
    eligible = [i for i in range(1, roles) if i % 5]  # roles with a single input group
    for i in eligible[:typos]:
        marker = f"interface run{i} {{\n        in  f"
        assert marker in text, marker
        text = text.replace(marker, f"interface run{i} {{\n        in  fx", 1)
    return text


def errors(params: types.PublishDiagnosticsParams) -> int:
    return sum(d.severity == types.DiagnosticSeverity.Error for d in params.diagnostics)


@dataclass
class Server:
    """One language server under test, with every publishDiagnostics it sent and when."""

    name: str
    command: list[str]
    new: bool  # answers flowc.statistics and versions its diagnostics
    client: LanguageClient = field(init=False)
    published: list[tuple[float, types.PublishDiagnosticsParams]] = field(default_factory=list)
    settles: list[float] = field(default_factory=list)
    hovers: list[float] = field(default_factory=list)
    publishes: list[float] = field(default_factory=list)
    checks: list[float] = field(default_factory=list)

    async def start(self) -> None:
        self.client = LanguageClient("flowc-lsp-bench", "0")
        self._arrived = asyncio.Event()

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def published(client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
            self.published.append((time.perf_counter(), params))
            self._arrived.set()

        await self.client.start_io(*self.command)
        await asyncio.wait_for(
            self.client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities())), DEADLINE_S
        )
        self.client.initialized(types.InitializedParams())

    async def diagnostics(self, uri: str, since: int, error_count: int) -> float:
        """When the first diagnostics of `uri` with `error_count` errors arrived (from `published[since]` on)."""
        while True:
            for at, params in self.published[since:]:
                if params.uri == uri and errors(params) == error_count:
                    return at
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), DEADLINE_S)

    async def checks_started(self) -> int:
        params = types.ExecuteCommandParams(command="flowc.statistics", arguments=["settled"])
        stats = await asyncio.wait_for(self.client.workspace_execute_command_async(params), DEADLINE_S)
        return stats["checks"]["started"]

    async def stop(self) -> None:
        await asyncio.wait_for(self.client.shutdown_async(None), DEADLINE_S)
        self.client.exit(None)
        await self.client.stop()


def baseline_server(rev: str, folder: Path) -> Server | str:
    """The server before debouncing, from git; or why it cannot run."""
    if rev == "none":
        return "not asked for (--baseline none)"
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:compiler/flowc/lsp/server.py"], cwd=REPO, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"git is not available ({error})"
    if source.returncode != 0:
        return f"commit {rev[:12]} is not in this checkout ({source.stderr.strip()})"
    path = folder / "baseline_server.py"
    path.write_text(source.stdout, encoding="utf-8")
    return Server(f"before ({rev[:7]}, synchronous)", [sys.executable, "-c", LAUNCH_FILE, str(path)], new=False)


async def burst(server: Server, uri: str, texts: list[str], first_version: int, final_errors: int) -> None:
    since = len(server.published)
    checks_before = await server.checks_started() if server.new else 0
    for offset, text in enumerate(texts):
        server.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=first_version + offset),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )
    sent = time.perf_counter()
    hover_params = types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=4, character=6)
    )
    hover = asyncio.ensure_future(server.client.text_document_hover_async(hover_params))
    hover.add_done_callback(lambda _: server.hovers.append(time.perf_counter() - sent))
    arrived = await server.diagnostics(uri, since, final_errors)
    await asyncio.wait_for(hover, DEADLINE_S)
    server.settles.append(arrived - sent)
    server.publishes.append(sum(params.uri == uri for _, params in server.published[since:]))
    if server.new:
        server.checks.append(await server.checks_started() - checks_before)


def spread(values: list[float], scale: float = 1, unit: str = "") -> str:
    """The median and, over several values, (min–max)."""
    median = f"{statistics.median(values) * scale:,.0f}{' ' + unit if unit else ''}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values) * scale:,.0f}–{max(values) * scale:,.0f})"


async def main_async(args: argparse.Namespace) -> int:
    text = generate(args.roles)
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        analysis = analyse(Snapshot("file:///bench.flow", 1, text))
        timings.append(time.perf_counter() - began)
    assert analysis.result.ok, [d.message for d in analysis.result.diagnostics[:3]]
    with tempfile.TemporaryDirectory(prefix="flowc-lsp-bench-") as tmp:
        folder = Path(tmp)
        path = folder / "pipeline.flow"
        path.write_text(text, encoding="utf-8")
        uri = from_fs_path(str(path))
        servers: list[Server] = []
        baseline = baseline_server(args.baseline, folder)
        if isinstance(baseline, Server):
            servers.append(baseline)
        else:
            print(f"before: skipped, {baseline}", file=sys.stderr)
        for debounce_ms in (0, 150):
            command = [sys.executable, "-m", "flowc", "lsp", "--debounce-ms", str(debounce_ms)]
            servers.append(Server(f"debounce {debounce_ms} ms", command, new=True))
        for server in servers:
            await server.start()
            since = len(server.published)
            item = types.TextDocumentItem(uri=uri, language_id="flow", version=1, text=text)
            server.client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
            await server.diagnostics(uri, since, 0)
        version = 2
        for round_ in range(args.rounds):
            # odd rounds add one misspelling per edit, even rounds take them away again
            counts = range(1, args.edits + 1) if round_ % 2 == 0 else range(args.edits - 1, -1, -1)
            texts = [with_typos(text, args.roles, n) for n in counts]
            for server in servers:
                await burst(server, uri, texts, version, counts[-1])
            version += len(texts)
        for server in servers:
            await server.stop()

    print(f"Python {sys.version.split()[0]}; flowc lsp, time to diagnostics after a burst of edits")
    print(
        f"file: {args.roles:,} roles, {len(text.splitlines()):,} lines; one check (parse, check, index) "
        f"in-process: {statistics.median(timings) * 1e3:,.0f} ms (median of 3)"
    )
    print(f"bursts: {args.edits} whole-document edits sent back to back; rounds: {args.rounds}; median (min–max)")
    print(
        "| server | settle: final diagnostics after the last edit | publishes per burst | checks per burst | hover answered after |"
    )
    print("|---|---:|---:|---:|---:|")
    for server in servers:
        checks = spread(server.checks) if server.checks else "-"
        print(
            f"| {server.name} | {spread(server.settles, 1e3, 'ms')} | {spread(server.publishes)} "
            f"| {checks} | {spread(server.hovers, 1e3, 'ms')} |"
        )
    if isinstance(baseline, Server):
        before = statistics.median(baseline.settles)
        for server in servers[1:]:
            print(f"{server.name}: settles {before / statistics.median(server.settles):.1f}x faster than before")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roles", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the synchronous server, or 'none'")
    args = parser.parse_args()
    if args.edits < 1 or args.rounds < 1 or args.roles < 2 * args.edits:
        parser.error("--edits and --rounds must be at least 1, and --roles at least twice --edits")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
