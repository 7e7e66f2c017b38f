"""Finding the golden cases of `flowc test` (docs/ci.md, "Golden event tests").

The convention: a case is a file `tests/GRAPH.input.json` or `tests/GRAPH.LABEL.input.json`
in the directory of the pipeline, holding what `flowc run --once GRAPH --input` takes (a JSON
object mapping each entry placeholder to its value). Its recording sits beside it as
`tests/GRAPH[.LABEL].events.jsonl`. The graph is the case's name up to its first dot; its
pipeline is the `.flow` file in the directory above `tests/` that declares that graph.

`flowc test` takes case files, `.flow` files (their cases) and directories (every case under
them; hidden directories, `node_modules`, `__pycache__` and `build` are not searched).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from flowc.sources import read_source
from flowc.syntax import ast, parse

CASES_DIR = "tests"
INPUT_SUFFIX = ".input.json"
EVENTS_SUFFIX = ".events.jsonl"
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "build"})


class NoCases(Exception):
    """A path names nothing `flowc test` can run: one line saying why and the fix (exit 2)."""


@dataclass(frozen=True)
class Case:
    name: str  # the input file's path without `.input.json`, as the user named it
    input: Path
    pipeline: Path | None  # None: `problem` says why no pipeline was found
    graph: str
    problem: str = ""

    @property
    def events(self) -> Path:
        return self.input.with_name(self.input.name[: -len(INPUT_SUFFIX)] + EVENTS_SUFFIX)

    @property
    def label(self) -> str:
        """The case's name within its pipeline: GRAPH or GRAPH.LABEL."""
        return self.input.name[: -len(INPUT_SUFFIX)]


def discover(paths: list[str]) -> list[Case]:
    """The cases the paths name, each once, sorted by name; NoCases for a path that names none."""
    found: dict[Path, Case] = {}
    for given in paths:
        try:
            cases = _cases_of(given)
        except OSError as error:  # (a directory this user may not enter, say)
            raise NoCases(f"cannot read {error.filename or given}: {error.strerror or error}") from None
        for case in cases:
            found.setdefault(case.input.resolve(), case)
    return sorted(found.values(), key=lambda c: c.name)


def _cases_of(given: str) -> list[Case]:
    path = Path(given)
    if not path.exists():
        raise NoCases(f"no such file or directory: {given}")
    if path.is_dir():
        inputs = list(_inputs_under(path))
        if not inputs:
            raise NoCases(
                f"no golden cases under {given}: add tests/GRAPH.input.json beside a pipeline "
                "and record it with `flowc test --update` (docs/ci.md)"
            )
        cases = [_case(p) for p in inputs]
    elif path.name.endswith(INPUT_SUFFIX):
        if path.absolute().parent.name != CASES_DIR:
            raise NoCases(f"{given}: a case lives in a `{CASES_DIR}/` directory beside its pipeline; move it there")
        cases = [_case(path)]
    elif path.suffix == ".flow":
        cases = _cases_of_pipeline(path)
        if not cases:
            raise NoCases(
                f"{given} has no golden cases: add {(path.parent / CASES_DIR).as_posix()}/GRAPH.input.json "
                "and record it with `flowc test --update` (docs/ci.md)"
            )
    else:
        raise NoCases(f"{given} is neither a directory, a .flow file nor a case (NAME{INPUT_SUFFIX})")
    return cases


def _raise(error: OSError) -> None:
    raise error  # (os.walk passes over a directory it cannot read; a case there would be missed silently)


def _inputs_under(root: Path):
    for directory, subdirectories, names in os.walk(root, onerror=_raise):
        subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(".") and d not in SKIPPED_DIRS)
        if Path(directory).absolute().name == CASES_DIR:
            yield from (Path(directory, n) for n in sorted(names) if n.endswith(INPUT_SUFFIX))


def _cases_of_pipeline(pipeline: Path) -> list[Case]:
    folder = pipeline.parent / CASES_DIR
    if not folder.is_dir():
        return []
    cases = [_case(p) for p in sorted(folder.glob(f"*{INPUT_SUFFIX}"))]
    # its own cases, and those that name no graph of any pipeline there (reported, not dropped)
    return [c for c in cases if c.pipeline is None or c.pipeline.resolve() == pipeline.resolve()]


def _case(input_path: Path) -> Case:
    name = input_path.as_posix()[: -len(INPUT_SUFFIX)]
    graph = input_path.name[: -len(INPUT_SUFFIX)].split(".")[0]
    home = Path(os.path.relpath(input_path.absolute().parent.parent))  # (right from inside tests/ too)
    candidates = sorted(home.glob("*.flow"))
    declared = {p: _graphs(p) for p in candidates}  # None: it does not parse
    declaring = [p for p, graphs in declared.items() if graphs is not None and graph in graphs]
    if not declaring:  # a broken pipeline is still the one its cases run (its check says why), if it is the only one
        broken = [p for p, graphs in declared.items() if graphs is None]
        declaring = broken if len(broken) == 1 else declaring
    if len(declaring) == 1:
        return Case(name, input_path, declaring[0], graph)
    if not declaring:
        there = "; ".join(f"{p.name} has {', '.join(sorted(declared[p] or ())) or 'no graph'}" for p in candidates)
        problem = (
            f"no .flow file in {home.as_posix()} declares graph `{graph}`"
            + (f" ({there})" if there else "")
            + f"; name the case after the graph it calls: GRAPH{INPUT_SUFFIX} or GRAPH.LABEL{INPUT_SUFFIX}"
        )
    else:
        problem = (
            f"graph `{graph}` is declared by {' and '.join(p.name for p in declaring)} in {home.as_posix()}; "
            "keep one pipeline per directory for its golden cases"
        )
    return Case(name, input_path, None, graph, problem)


def _graphs(pipeline: Path) -> tuple[str, ...] | None:
    """The graphs a `.flow` file declares; None when it cannot be read or parsed."""
    try:
        module = parse(read_source(pipeline).text, str(pipeline)).module
    except (OSError, UnicodeDecodeError):
        return None
    if module is None:
        return None
    return tuple(d.name.text for d in module.decls if isinstance(d, ast.Graph))
