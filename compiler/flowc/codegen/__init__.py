"""`flowc build`: the deployable bundle of a checked program (DESIGN §5).

    bundle.json  plan.json  graphs.py  __init__.py  __main__.py  nodes/<role>.py
    deploy/local.yaml  deploy/ray/{launch,runtime_env,job}.json  deploy/k8s/{raycluster,rayjob}.yaml

Generation is boring on purpose: Jinja2 with StrictUndefined fed by view models, everything
sorted, no timestamps or absolute paths, so a build is byte-for-byte the same on every run and
under any hash seed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import jinja2

from flowc import __version__
from flowc.check.endpoints import endpoints_of
from flowc.check.model import Program
from flowc.codegen import views
from flowc.plan import build_plan
from flowc.plan.model import GraphPlan

TARGETS = ("local", "ray", "k8s")


@dataclass(frozen=True)
class Bundle:
    name: str
    files: dict[str, str]  # path inside the bundle -> text

    def write(self, out: Path) -> None:
        for relative, text in self.files.items():
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    @property
    def size(self) -> int:
        return sum(len(t.encode("utf-8")) for t in self.files.values())


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("flowc.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **context: object) -> str:
    return _environment().get_template(template).render(**context)


def source_hash(program: Program) -> str:
    """SHA-256 of every module's name and text, in load order; independent of paths."""
    digest = hashlib.sha256()
    for module in program.modules:
        digest.update(json.dumps([module.name, module.text]).encode("utf-8"))
    return digest.hexdigest()


def build_bundle(program: Program, source: Path, out: Path, targets: tuple[str, ...] = TARGETS, vendor: bool = False) -> Bundle:
    """Render the bundle for `program` (read from `source`) to be written at `out`; with
    `vendor`, the roles' impl modules are copied in (flowc.codegen.vendor, VendorError).

    `source` and `out` may be spelled any way (relative to any working directory, absolute,
    through symlinked directories): the bundle depends only on the real places they name.
    """
    source_dir = _real_directory(source)
    plan = build_plan(program)
    plan_data = plan.as_json()
    header = views.Header(__version__, source.name, plan.flow)
    digest = source_hash(program)
    files: dict[str, str] = {}
    for role in plan.roles.values():
        files[f"nodes/{role.name}.py"] = render("node.py.j2", header=header, role=views.role_module(plan, plan_data, role))
    files["__init__.py"] = render("init.py.j2", header=header)
    files["__main__.py"] = render("main.py.j2", header=header)
    files["graphs.py"] = render("graphs.py.j2", header=header, graphs=views.graphs_module(plan, plan_data))
    files["plan.json"] = _json(plan_data)
    if "local" in targets:
        files["deploy/local.yaml"] = render("local.yaml.j2", header=header, local=views.local_view(plan))
    if "ray" in targets:
        files["deploy/ray/launch.json"] = _json(views.ray_launch_plan(plan, __version__))
        files["deploy/ray/runtime_env.json"] = _json(views.ray_runtime_env(plan, __version__))
        files["deploy/ray/job.json"] = _json(views.ray_job(plan, __version__, digest))
    if "k8s" in targets:
        k8s = views.k8s_view(plan, __version__)
        files["deploy/k8s/raycluster.yaml"] = render("raycluster.yaml.j2", header=header, k8s=k8s)
        files["deploy/k8s/rayjob.yaml"] = render("rayjob.yaml.j2", header=header, k8s=k8s)
    python_path = sorted({_relative(source_dir, out), _relative(source_dir.parent, out)})
    if vendor:
        from flowc.codegen.vendor import vendored

        files.update(vendored([r.impl for r in plan.roles.values()], [source_dir, source_dir.parent]))
        python_path = ["vendor"]
    files["bundle.json"] = _json(
        {
            "name": plan.flow,
            "flowc_version": __version__,
            "source": {"file": source.name, "sha256": digest, "modules": [m.name for m in program.modules]},
            # impl modules are imported with the .flow file's directory and its parent on the path
            # (or, vendored, from the bundle's own copies)
            "python_path": python_path,
            "graphs": {
                name: views.graph_summary(
                    g, entry_types(program, g.entry), output_types(program, g), endpoints_of(program, program.graphs[name])
                )
                for name, g in plan.graphs.items()
            },
            "roles": {name: {"impl": r.impl, "module": f"nodes/{name}.py"} for name, r in plan.roles.items()},
            "targets": sorted(targets),
            "files": sorted([*files, "bundle.json"]),
        }
    )
    return Bundle(plan.flow, dict(sorted(files.items())))


def entry_types(program: Program, entry: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Each entry placeholder's declared type, aliases resolved (`Text`, `[Image]`): the runtime
    checks entry values against them when a call starts (docs/runtime.md, "Entry values")."""
    return {name: str(program.type_of(program.placeholders[name].type)) for name in entry}


def output_types(program: Program, graph: GraphPlan) -> dict[str, str]:
    """Each field a graph streams or returns, with its declared type (aliases resolved): the
    OpenAI endpoint checks a graph's values against them (docs/openai.md)."""
    types = {}
    for output in graph.outputs:
        producers = program.field(output.field).producers
        if producers:  # the checks agree every producer declares one type
            types[output.field] = str(program.type_of(producers[0].decl.type))
    return types


def _json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _real_directory(source: Path) -> Path:
    """The directory holding `source` as named, with `..` and symlinked directories resolved.

    The file itself is not followed: a symlinked .flow file imports its modules from beside the
    link (as `import` does), so its roles are looked for there too. Resolving first matters:
    `Path("pipeline.flow").parent.parent` is `.`, not the parent directory.
    """
    return source.absolute().parent.resolve()


def _relative(directory: Path, out: Path) -> str:
    return Path(os.path.relpath(directory, out.resolve())).as_posix()


__all__ = ["TARGETS", "Bundle", "build_bundle", "render", "source_hash"]
