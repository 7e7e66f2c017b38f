"""Deployment manifests, validated offline: local.yaml against its schema, the Ray runtime_env
with Ray's own validator, the job spec against Ray's submission API, KubeRay YAML against the
CRD schema. Each validator also rejects a deliberately broken manifest."""

from __future__ import annotations

import inspect
import json
from importlib import resources

import jsonschema
import pytest
import yaml

from tests.codegen.conftest import BUNDLES
from tests.conftest import REPO

LOCAL_SCHEMA = json.loads(resources.files("flowrt").joinpath("schemas/local.schema.json").read_text())
KUBERAY = {kind: json.loads((REPO / f"tests/data/kuberay/{kind}.schema.json").read_text()) for kind in ("raycluster", "rayjob")}
NAMES = sorted(BUNDLES)


def files(example):
    return BUNDLES[example][0].files


def validate(document, schema):
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("example", NAMES)
def test_local_manifest_matches_its_schema(example):
    document = yaml.safe_load(files(example)["deploy/local.yaml"])
    validate(document, LOCAL_SCHEMA)
    roles = {r["name"]: r for r in document["spec"]["roles"]}
    bundle = json.loads(files(example)["bundle.json"])
    assert set(roles) == set(bundle["roles"])
    assert all(roles[n]["module"] == f"nodes/{n}.py" for n in roles)


def test_local_schema_rejects_a_broken_manifest():
    document = yaml.safe_load(files("image_chat")["deploy/local.yaml"])
    document["spec"]["roles"][0]["replicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(document, LOCAL_SCHEMA)


@pytest.mark.parametrize("example", NAMES)
def test_ray_runtime_env_passes_rays_validator(example):
    from ray.runtime_env import RuntimeEnv

    env = json.loads(files(example)["deploy/ray/runtime_env.json"])
    validated = RuntimeEnv(**env)
    assert validated["env_vars"]["FLOWRT_BUNDLE_NAME"] == json.loads(files(example)["bundle.json"])["name"]


def test_rays_validator_rejects_a_broken_runtime_env():
    from ray.runtime_env import RuntimeEnv

    env = json.loads(files("image_chat")["deploy/ray/runtime_env.json"])
    env["env_vars"]["FLOWRT_REPLICAS"] = 2  # env vars must be strings
    with pytest.raises(TypeError):
        RuntimeEnv(**env)


@pytest.mark.parametrize("example", NAMES)
def test_ray_job_spec_matches_the_submission_api(example):
    from ray.job_submission import JobSubmissionClient
    from ray.runtime_env import RuntimeEnv

    job = json.loads(files(example)["deploy/ray/job.json"])
    accepted = set(inspect.signature(JobSubmissionClient.submit_job).parameters) - {"self"}
    assert set(job) <= accepted, set(job) - accepted
    RuntimeEnv(**job["runtime_env"])
    assert all(isinstance(v, str) for v in job["metadata"].values())


def test_ray_launch_plan_places_shared_gpu_roles_with_their_owner():
    plan = json.loads(files("image_chat")["deploy/ray/launch.json"])
    (group,) = plan["placementGroups"]
    # llm owns one GPU per replica: one placement group per replica; dit shares it with no GPU
    # of its own and gets the owner's CUDA_VISIBLE_DEVICES injected.
    assert group["name"] == "llm-0" and group["bundles"] == [{"CPU": 2, "GPU": 1}]
    members = {m["role"]: m for m in group["members"]}
    assert members["llm"]["num_gpus"] == 1
    assert members["dit"]["num_gpus"] == 0 and members["dit"]["inject_cuda_visible_devices_of"] == "llm/0"
    assert {a["role"] for a in plan["actors"]} == {"frontend", "embed", "vit", "vae"}
    assert sum(1 for a in plan["actors"] if a["role"] == "frontend") == 2


@pytest.mark.parametrize("example", NAMES)
@pytest.mark.parametrize("kind", ["raycluster", "rayjob"])
def test_kuberay_manifests_match_the_crd_schema(example, kind):
    document = yaml.safe_load(files(example)[f"deploy/k8s/{kind}.yaml"])
    validate(document, KUBERAY[kind])
    spec = document["spec"] if kind == "raycluster" else document["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == "2.60.0"
    for group in spec["workerGroupSpecs"]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    if kind == "rayjob":
        runtime_env = yaml.safe_load(document["spec"]["runtimeEnvYAML"])
        assert runtime_env["env_vars"]["FLOWRT_REGISTRY"] == "ray"


def test_worker_groups_follow_gpu_shapes():
    spec = yaml.safe_load(files("image_chat")["deploy/k8s/raycluster.yaml"])["spec"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    # frontend x2, embed, vit, vae on CPU pods; llm's one GPU pod; dit rides on llm's pod
    assert groups["cpu"]["replicas"] == 5
    assert groups["gpu1"]["replicas"] == 1
    assert groups["gpu1"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_crd_schema_rejects_a_broken_manifest():
    document = yaml.safe_load(files("image_chat")["deploy/k8s/raycluster.yaml"])
    document["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-cpus"] = 2  # must be a string
    with pytest.raises(jsonschema.ValidationError):
        validate(document, KUBERAY["raycluster"])
    job = yaml.safe_load(files("image_chat")["deploy/k8s/rayjob.yaml"])
    del job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    with pytest.raises(jsonschema.ValidationError):
        validate(job, KUBERAY["rayjob"])
