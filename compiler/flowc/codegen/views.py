"""View models for the templates: small frozen records holding exactly what each template prints.

Templates never see the AST, the program or the plan; every decision (what is sorted, how a
table is laid out, which comment explains it) is made here in Python.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from flowc.codegen.literals import literal
from flowc.plan.model import GraphPlan, RolePlan, StaticPlan
from flowc.plan.text import node_lines

RAY_VERSION = "2.60.0"
RAY_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311"
BUNDLE_PATH_IN_IMAGE = "/app/bundle"


@dataclass(frozen=True)
class Header:
    version: str
    source: str  # the .flow file's name, never an absolute path
    flow: str


@dataclass(frozen=True)
class GraphTablesView:
    graph: str
    name_literal: str
    comments: tuple[str, ...]
    tables_literal: str


@dataclass(frozen=True)
class InterfaceView:
    name_literal: str
    graphs: tuple[GraphTablesView, ...]


@dataclass(frozen=True)
class RoleModuleView:
    name: str
    name_literal: str
    impl_literal: str
    resources_literal: str
    interfaces_literal: str
    interfaces: tuple[InterfaceView, ...]


@dataclass(frozen=True)
class GraphView:
    name: str
    name_literal: str
    comments: tuple[str, ...]
    tables_literal: str


@dataclass(frozen=True)
class GraphsModuleView:
    flow_literal: str
    globals_literal: str
    graphs: tuple[GraphView, ...]


def graphs_module(plan: StaticPlan, plan_data: dict) -> GraphsModuleView:
    """graphs.py: each graph's plan less its roles' nodes (those are in nodes/ROLE.py)."""
    graphs = []
    for name in sorted(plan.graphs):
        graph = plan.graphs[name]
        data = dict(plan_data["graphs"][name])
        kept = {node_id: node for node_id, node in data["nodes"].items() if node.get("kind") != "interface"}
        data["nodes"] = kept
        comments = tuple(line.strip() for node_id in sorted(kept) for line in node_lines(graph.nodes[node_id]))
        graphs.append(GraphView(name, literal(name), comments, literal(data, depth=1)))
    return GraphsModuleView(literal(plan_data["flow"]), literal(plan_data.get("globals") or {}), tuple(graphs))


def role_module(plan: StaticPlan, plan_data: dict, role: RolePlan) -> RoleModuleView:
    """`plan_data` is `plan.as_json()`, computed once for all modules of a build."""
    interfaces = []
    for name in sorted(role.interfaces):
        graphs = []
        for graph_name, graph in plan.graphs.items():
            node = graph.nodes.get(f"{role.name}.{name}")
            if node is None:
                continue
            node_json = plan_data["graphs"][graph_name]["nodes"][node.id]
            comments = tuple(line.strip() for line in node_lines(node)[1:])
            graphs.append(GraphTablesView(graph_name, literal(graph_name), comments, literal(node_json, depth=2)))
        interfaces.append(InterfaceView(literal(name), tuple(graphs)))
    resources = {
        "replicas": role.replicas,
        "lb": role.lb,
        "gpus": role.gpus,
        "nodes": role.nodes,
        "share_gpus_with": role.share_gpus_with,
        "uses": list(role.uses),
        "batch": role.batch,
        "timeout_s": role.timeout_s,
    }
    configs = {
        name: {"timeout_s": c.timeout_s, "batch": c.batch, "stream": c.stream} for name, c in sorted(role.interfaces.items())
    }
    return RoleModuleView(
        name=role.name,
        name_literal=literal(role.name),
        impl_literal=literal(role.impl),
        resources_literal=literal(resources),
        interfaces_literal=literal(configs),
        interfaces=tuple(interfaces),
    )


# ── local ──


@dataclass(frozen=True)
class LocalRoleView:
    name: str
    module: str
    impl: str
    replicas: int
    lb: str
    gpus: int
    share_gpus_with: str | None
    interfaces: tuple[str, ...]


@dataclass(frozen=True)
class LocalView:
    name: str
    roles: tuple[LocalRoleView, ...]


def local_view(plan: StaticPlan) -> LocalView:
    return LocalView(
        name=_k8s_name(plan.flow),
        roles=tuple(
            LocalRoleView(
                r.name,
                f"nodes/{r.name}.py",
                r.impl or "",
                r.replicas,
                r.lb,
                r.gpus,
                r.share_gpus_with,
                tuple(sorted(r.interfaces)),
            )
            for r in plan.roles.values()
        ),
    )


# ── Ray ──


def ray_launch_plan(plan: StaticPlan, version: str) -> dict:
    """One placement group per replica of each GPU-owning role; sharing roles join their owner's."""
    groups: dict[str, dict] = {}
    actors: list[dict] = []
    owners = [r for r in plan.roles.values() if r.gpus > 0 and not r.share_gpus_with]
    for role in owners:
        per_node = math.ceil(role.gpus / role.nodes)
        for replica in range(role.replicas):
            name = f"{role.name}-{replica}"
            groups[name] = {
                "name": name,
                "strategy": "STRICT_PACK" if role.nodes == 1 else "STRICT_SPREAD",
                "bundles": [{"CPU": 1, "GPU": per_node} for _ in range(role.nodes)],
                "members": [{"role": role.name, "replica": replica, "bundle_index": 0, "num_cpus": 1, "num_gpus": per_node}],
            }
    for role in plan.roles.values():
        owner = plan.roles.get(role.share_gpus_with or "")
        if owner is not None and owner.gpus > 0:
            for replica in range(role.replicas):
                group = groups[f"{owner.name}-{replica % owner.replicas}"]
                group["bundles"][0]["CPU"] += 1
                group["members"].append(
                    {
                        "role": role.name,
                        "replica": replica,
                        "bundle_index": 0,
                        "num_cpus": 1,
                        "num_gpus": 0,
                        "inject_cuda_visible_devices_of": f"{owner.name}/{replica % owner.replicas}",
                    }
                )
        elif role.gpus == 0 and not role.share_gpus_with:
            actors += [{"role": role.name, "replica": r, "num_cpus": 1, "num_gpus": 0} for r in range(role.replicas)]
    return {
        "apiVersion": "flowrt.dev/v1",
        "kind": "RayLaunchPlan",
        "name": plan.flow,
        "flowc": version,
        "rayVersion": RAY_VERSION,
        "placementGroups": [groups[k] for k in sorted(groups)],
        "actors": actors,
    }


def ray_runtime_env(plan: StaticPlan, version: str) -> dict:
    return {
        "working_dir": ".",
        "pip": [f"flowc=={version}"],
        "env_vars": {"FLOWRT_BUNDLE_NAME": plan.flow, "FLOWRT_REGISTRY": "ray"},
    }


def ray_job(plan: StaticPlan, version: str, source_hash: str) -> dict:
    return {
        "entrypoint": "python __main__.py launch-ray",
        "runtime_env": ray_runtime_env(plan, version),
        "metadata": {"flow": plan.flow, "flowc": version, "source_sha256": source_hash},
        "entrypoint_num_cpus": 1,
    }


# ── KubeRay ──


@dataclass(frozen=True)
class WorkerGroupView:
    name: str
    replicas: int
    gpus: int
    cpus: int
    memory: str
    image: str
    params: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class K8sView:
    name: str
    ray_version: str
    image: str
    head_params: tuple[tuple[str, str], ...]
    groups: tuple[WorkerGroupView, ...]
    entrypoint: str
    runtime_env_yaml: tuple[str, ...]
    bundle_path: str


def k8s_view(plan: StaticPlan, version: str) -> K8sView:
    pods_by_gpus: dict[int, int] = {}
    for role in plan.roles.values():
        if role.share_gpus_with:
            continue  # runs on its owner's pod
        per_node = math.ceil(role.gpus / role.nodes) if role.gpus else 0
        pods = role.replicas * (role.nodes if role.gpus else 1)
        pods_by_gpus[per_node] = pods_by_gpus.get(per_node, 0) + pods
    groups = []
    for gpus, replicas in sorted(pods_by_gpus.items()):
        if gpus == 0:
            groups.append(WorkerGroupView("cpu", replicas, 0, 2, "8Gi", RAY_IMAGE, (("num-cpus", "2"),)))
        else:
            groups.append(
                WorkerGroupView(
                    f"gpu{gpus}", replicas, gpus, 4 * gpus, f"{16 * gpus}Gi", f"{RAY_IMAGE}-gpu", (("num-gpus", str(gpus)),)
                )
            )
    env = {"working_dir": BUNDLE_PATH_IN_IMAGE, "env_vars": {"FLOWRT_BUNDLE_NAME": plan.flow, "FLOWRT_REGISTRY": "ray"}}
    env_yaml = ["working_dir: " + BUNDLE_PATH_IN_IMAGE, "env_vars:"] + [
        f"  {k}: {json.dumps(v)}" for k, v in sorted(env["env_vars"].items())
    ]
    return K8sView(
        name=_k8s_name(plan.flow),
        ray_version=RAY_VERSION,
        image=RAY_IMAGE,
        head_params=(("dashboard-host", "0.0.0.0"), ("num-cpus", "0")),
        groups=tuple(groups),
        entrypoint=f"python {BUNDLE_PATH_IN_IMAGE}/__main__.py launch-ray",
        runtime_env_yaml=tuple(env_yaml),
        bundle_path=BUNDLE_PATH_IN_IMAGE,
    )


def _k8s_name(flow: str) -> str:
    """A DNS-1123 name for Kubernetes objects (`image_chat` -> `image-chat`)."""
    return flow.lower().replace("_", "-").strip("-")[:63] or "flow"


def graph_summary(
    graph: GraphPlan, types: dict[str, str], output_types: dict[str, str], endpoints: dict[str, dict[str, str]]
) -> dict:
    """A graph as bundle.json lists it; `types`: each entry placeholder's declared type;
    `output_types`: each streamed or returned field's; `endpoints`: the OpenAI endpoints that
    serve it, with the fields each reads (flowc.check.endpoints)."""
    return {
        "endpoints": {endpoint: dict(sorted(fields.items())) for endpoint, fields in sorted(endpoints.items())},
        "entry": list(graph.entry),
        "types": dict(sorted(types.items())),
        "output_types": dict(sorted(output_types.items())),
        "stream": [{"field": o.field, "ordered": o.ordered} for o in graph.outputs if o.kind == "stream"],
        "return": [o.field for o in graph.outputs if o.kind == "return"],
    }
