"""The SGLang adapter's edges that run without SGLang: the pin (pyproject's `sglang` extra and the
adapter agree), the version check and the errors a missing or mismatched SGLang gives (real
imports in fresh interpreters, with stand-in `sglang` distributions on the path where a version
is needed: the check must refuse them before importing them), `import flowrt.compute.engine`
without SGLang, and the conformance suite's `--engine` / `--engine-tolerance` plumbing. What needs
SGLang on a GPU is skipped here with the command that runs it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flowrt.compute.engine.sglang_plan import (
    ANY_VERSION_ENV,
    PIP_FIX,
    SGLANG_REQUIREMENT,
    SGLANG_VERSION,
    SGLangVersionError,
    check_sglang_version,
    installed_sglang_version,
)
from tests.compute.engine.engines import REFERENCE_CASES, TOLERANCE_OVERRIDE, engine_cases, load_factory, parse_tolerance

REPO = Path(__file__).resolve().parents[3]
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
GPU_COMMAND = (
    "pip install -e '.[dev,sglang]' on a CUDA machine, then "
    ".venv/bin/python -m pytest tests/compute/engine --engine flowrt.compute.engine.sglang_engine:tiny_factory"
)
needs_no_sglang = pytest.mark.skipif(HAVE_SGLANG, reason="checks the errors of a Python without SGLang; this one has it")


def clean_environment() -> dict[str, str]:
    """This process's environment without the engine suite's and the adapter's settings (a run
    with FLOWRT_TEST_ENGINE or FLOWRT_SGLANG_* set must not leak them into these checks)."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("FLOWRT_TEST_", "FLOWRT_SGLANG_"))}


def python(code: str, *, path: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter of this venv, from the repository root, with `path` first
    on its import path."""
    environment = clean_environment()
    if path is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(path), environment.get("PYTHONPATH", "")])
    environment.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)


def stand_in_sglang(root: Path, version: str | None, *, metadata: bool = True) -> Path:
    """A `sglang` package that fails if imported (the check must not import it), installed with
    distribution metadata of `version` (or, without metadata, a version.py as a source tree has)."""
    package = root / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the stand-in sglang was imported')\n")
    if version is not None and metadata:
        info = root / f"sglang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    elif version is not None:
        (package / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


# ── the pin ──


def test_the_extra_pins_the_release_the_adapter_is_written_against():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["sglang"] == [SGLANG_REQUIREMENT] == [f"sglang=={SGLANG_VERSION}"]
    assert "'flowc[sglang]'" in PIP_FIX


def test_the_version_check_names_both_versions_and_the_fix():
    assert check_sglang_version(SGLANG_VERSION) is None
    with pytest.raises(SGLangVersionError) as missing:
        check_sglang_version(None)
    assert f"needs SGLang {SGLANG_VERSION}" in str(missing.value) and PIP_FIX in str(missing.value)
    with pytest.raises(SGLangVersionError) as other:
        check_sglang_version("0.5.8")
    text = str(other.value)
    assert "SGLang 0.5.8 is installed" in text and f"required: {SGLANG_REQUIREMENT}" in text
    assert PIP_FIX in text and f"pip install '{SGLANG_REQUIREMENT}'" in text and f"{ANY_VERSION_ENV}=1" in text
    warning = check_sglang_version("0.5.24", any_version=True)
    assert warning is not None and "SGLang 0.5.24 is installed" in warning and "going on anyway" in warning


def test_the_installed_version_is_read_without_importing_sglang(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(stand_in_sglang(tmp_path / "dist", "0.5.8")))
    assert installed_sglang_version() == "0.5.8"  # the stand-in raises when imported: it was not
    assert "sglang" not in sys.modules


def test_a_source_tree_without_metadata_is_read_from_its_version_file(tmp_path, monkeypatch):
    if HAVE_SGLANG:
        pytest.skip("an installed SGLang's metadata would answer first")
    monkeypatch.syspath_prepend(str(stand_in_sglang(tmp_path / "src", "0.5.9", metadata=False)))
    assert installed_sglang_version() == "0.5.9"


@needs_no_sglang
def test_no_sglang_reads_as_none():
    assert installed_sglang_version() is None


# ── importing the adapter ──


@needs_no_sglang
def test_importing_the_adapter_without_sglang_says_what_to_install():
    result = python("import flowrt.compute.engine.sglang_engine")
    assert result.returncode != 0
    assert "SGLangVersionError" in result.stderr
    assert f"needs SGLang {SGLANG_VERSION} ({SGLANG_REQUIREMENT})" in result.stderr
    assert "has no SGLang installed" in result.stderr and PIP_FIX in result.stderr


def test_importing_the_adapter_with_another_sglang_refuses_it_before_importing_it(tmp_path):
    result = python("import flowrt.compute.engine.sglang_engine", path=stand_in_sglang(tmp_path, "0.5.8"))
    assert result.returncode != 0
    assert f"SGLang 0.5.8 is installed in {sys.executable}" in result.stderr
    assert f"required: {SGLANG_REQUIREMENT}" in result.stderr and PIP_FIX in result.stderr
    assert "the stand-in sglang was imported" not in result.stderr


def test_the_pinned_release_with_its_modules_missing_says_which_module(tmp_path):
    pytest.importorskip("torch", reason="past the version check the adapter imports torch (the torch extra)")
    root = stand_in_sglang(tmp_path, SGLANG_VERSION)
    (root / "sglang" / "__init__.py").write_text("")  # importable, but without sglang.srt
    result = python("import flowrt.compute.engine.sglang_engine", path=root)
    assert result.returncode != 0
    assert f"SGLang {SGLANG_VERSION} is installed but `sglang.srt" in result.stderr
    assert f"written against SGLang {SGLANG_VERSION}'s module layout" in result.stderr


def test_another_release_is_tried_when_asked_to(tmp_path):
    pytest.importorskip("torch", reason="past the version check the adapter imports torch (the torch extra)")
    root = stand_in_sglang(tmp_path, "0.5.24")
    (root / "sglang" / "__init__.py").write_text("")
    result = python("import flowrt.compute.engine.sglang_engine", path=root, env={ANY_VERSION_ENV: "1"})
    assert result.returncode != 0
    assert "SGLang 0.5.24 is installed" in result.stderr and "going on anyway" in result.stderr  # warned, not refused
    assert "SGLang 0.5.24 is installed but `sglang.srt" in result.stderr  # and went on to import it


def test_flowrts_engine_package_imports_without_sglang_and_never_loads_the_adapter():
    result = python(
        "import sys, flowrt.compute.engine\n"
        "print('sglang' in sys.modules, 'flowrt.compute.engine.sglang_engine' in sys.modules, "
        "'flowrt.compute.engine.sglang_plan' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"]


# ── the conformance suite's plumbing ──


def test_engine_factories_and_tolerances_parse(monkeypatch):
    case = load_factory("flowrt.compute.engine:ReferenceEngine")
    assert case.name == "flowrt.compute.engine:ReferenceEngine" and case.make is not None
    with pytest.raises(ValueError, match="give MODULE:FACTORY"):
        load_factory("flowrt.compute.engine")
    with pytest.raises(ValueError, match="has no callable 'Nothing'"):
        load_factory("flowrt.compute.engine:Nothing")
    monkeypatch.setenv("FLOWRT_TEST_ENGINE", "flowrt.compute.engine:ReferenceEngine")
    assert [c.name for c in engine_cases([])] == ["flowrt.compute.engine:ReferenceEngine"]
    assert parse_tolerance("0.05,0.1") == (0.05, 0.1) and parse_tolerance("0.2") == (0.2, 0.2)
    assert parse_tolerance(None) is None and parse_tolerance(" ") is None
    for bad in ("a,b", "1,2,3", "-1", "nan"):
        with pytest.raises(ValueError, match="give RTOL,ATOL"):
            parse_tolerance(bad)


def test_the_tolerance_override_comes_before_the_engines_own_and_the_dtypes(monkeypatch):
    support = pytest.importorskip("tests.compute.engine.support", reason="the suite runs on torch (the torch extra)")
    monkeypatch.delenv("FLOWRT_TEST_TOLERANCE", raising=False)
    monkeypatch.setitem(TOLERANCE_OVERRIDE, "option", None)
    engine = REFERENCE_CASES[0].make()
    assert support.tolerance(engine) == (1e-4, 1e-4)  # float32 K/V
    engine.conformance_tolerance = (0.01, 0.02)
    assert support.tolerance(engine) == (0.01, 0.02)
    monkeypatch.setenv("FLOWRT_TEST_TOLERANCE", "0.3,0.4")
    assert support.tolerance(engine) == (0.3, 0.4)
    monkeypatch.setitem(TOLERANCE_OVERRIDE, "option", (0.5, 0.6))  # --engine-tolerance
    assert support.tolerance(engine) == (0.5, 0.6)


def run_suite(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "tests/compute/engine/test_conformance.py", "-p", "no:cacheprovider", *arguments]
    return subprocess.run(command, cwd=REPO, env=clean_environment(), capture_output=True, text=True, timeout=300)


def test_the_suite_runs_against_a_named_engine_with_a_tolerance():
    pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")
    result = run_suite(
        "-k",
        "describe or positions",
        "--engine",
        "flowrt.compute.engine:ReferenceEngine",
        "--engine-tolerance",
        "0.001,0.001",
        "-rA",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        "PASSED tests/compute/engine/test_conformance.py::test_positions_come_from_the_request[flowrt.compute.engine:ReferenceEngine]"
        in (result.stdout)
    )
    assert "[reference]" not in result.stdout  # the named engine replaces the default ones
    bad = run_suite("-k", "describe", "--engine-tolerance", "loose")
    assert bad.returncode != 0 and "give RTOL,ATOL" in bad.stdout + bad.stderr


@needs_no_sglang
def test_the_suite_against_the_sglang_adapter_without_sglang_says_what_to_install():
    pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")
    result = run_suite("-k", "describe", "--engine", "flowrt.compute.engine.sglang_engine:tiny_factory")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "--engine flowrt.compute.engine.sglang_engine:tiny_factory" in output
    assert f"needs SGLang {SGLANG_VERSION}" in output and PIP_FIX in output


# ── the adapter's own code, over a CPU stand-in for SGLang (sglang_stand_in/README.md) ──

STAND_IN = REPO / "tests" / "compute" / "engine" / "sglang_stand_in"


def test_over_a_stand_in_with_sglangs_slot_semantics_the_adapter_passes_the_conformance_suite():
    pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")
    suite = [
        f"tests/compute/engine/{name}.py" for name in ("test_conformance", "test_contract_errors", "test_batcher", "test_driver")
    ]
    command = [sys.executable, "-m", "pytest", *suite, "-p", "no:cacheprovider", "-rs"]
    command += ["--engine", "flowrt.compute.engine.sglang_engine:tiny_factory"]
    environment = {**clean_environment(), "PYTHONPATH": str(STAND_IN)}
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "does not claim `bidirectional`" in result.stdout and "does not claim `no_write`" in result.stdout
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_over_a_stand_in_the_adapter_shares_one_runner_and_refuses_a_second_model():
    pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")
    result = python(
        "import os\n"
        "from flowrt.compute.engine.sglang_engine import factory, tiny_factory\n"
        "first, second = tiny_factory(), tiny_factory()\n"
        "print(first.shared is second.shared, first is not second, first.describe().features == {'hidden', 'embeddings'})\n"
        "os.environ['FLOWRT_SGLANG_MODEL'] = '/models/other'\n"
        "factory()\n",
        path=STAND_IN,
    )
    assert result.stdout.split() == ["True", "True", "True"]
    assert "this process already runs SGLang with" in result.stderr and "start another process for /models/other" in result.stderr


def test_over_a_stand_in_whose_pool_ignores_the_binding_the_adapter_fails_at_start_up():
    pytest.importorskip("torch", reason="the engines run on torch (the torch extra)")
    result = python(
        "from flowrt.compute.engine.selftest import SelfTestError\n"
        "from flowrt.compute.engine.sglang_engine import tiny_factory\n"
        "try:\n"
        "    tiny_factory()\n"
        "except SelfTestError as error:\n"
        "    print('first:', error)\n"
        "tiny_factory()\n",
        path=STAND_IN,
        env={"STAND_IN_IGNORE_REBIND": "1"},
    )
    first = result.stdout
    assert f"the SGLang {SGLANG_VERSION} adapter on" in first and "failed its start-up self-test" in first
    assert "writes only into the given slots: new tokens' slots left unwritten" in first
    assert f"written for SGLang {SGLANG_VERSION}: a bug in it" in first
    assert "the SGLang adapter failed to start earlier in this process" in result.stderr  # not started twice


# ── on a GPU with SGLang ──


def gpu_with_sglang() -> bool:
    if not HAVE_SGLANG:
        return False
    torch = pytest.importorskip("torch", reason="the engines run on torch")
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not gpu_with_sglang(), reason=f"needs SGLang (CUDA) — run: {GPU_COMMAND}")
def test_the_tiny_model_starts_passes_its_self_test_and_writes_into_the_pools_stacks():  # pragma: no cover - GPU only
    import torch

    from flowrt.compute.engine import StepBatch, StepRequest, kv_stacks
    from flowrt.compute.engine.sglang_engine import TINY_LLAMA, tiny_factory
    from flowrt.params.tiers import DeviceTier

    engine = tiny_factory()  # builds the runner and runs the self-test, which raises on failure
    spec = engine.describe()
    assert (spec.vocab_size, spec.num_layers, spec.num_kv_heads) == (
        TINY_LLAMA["vocab_size"],
        TINY_LLAMA["num_hidden_layers"],
        TINY_LLAMA["num_key_value_heads"],
    )
    assert spec.device.startswith("cuda") and spec.kv_dtype == "bfloat16"
    tier = DeviceTier(spec.kv_layout("kv", 16), 8, spec.device)
    engine.bind_kv(kv_stacks(tier))
    (result,) = engine.forward(StepBatch([StepRequest(token_ids=[1, 2, 3], slots=[40, 7, 99])]))
    assert torch.isfinite(result.logits).all()
    written = tier.stacks[0].view(8 * 16, -1).abs().sum(dim=1).nonzero().flatten().tolist()
    assert written == [7, 40, 99]
