"""Which engines the engine suite runs against: every test taking `engine_case` runs once per
engine. By default the reference engine in two shapes; another engine with

    .venv/bin/pytest tests/compute/engine --engine my_package.my_module:make_engine
    FLOWRT_TEST_ENGINE=my_package.my_module:make_engine .venv/bin/pytest tests/compute/engine

(`--engine` only where pytest is pointed at this directory: pytest reads the options of a
directory's conftest when it starts there; the variable works from anywhere.) An engine with
looser numerics than its KV dtype's defaults says so with `conformance_tolerance`, or the run
with `--engine-tolerance RTOL,ATOL` (FLOWRT_TEST_TOLERANCE). The SGLang adapter, on a CUDA machine:

    .venv/bin/pytest tests/compute/engine --engine flowrt.compute.engine.sglang_engine:tiny_factory

torch runs these tests on one thread: the models are tiny, and on a busy machine two spinning
threads per process made them several times slower.
"""

from __future__ import annotations

import pytest

from tests.compute.engine.engines import TOLERANCE_OVERRIDE, engine_cases, parse_tolerance


def pytest_addoption(parser):
    parser.addoption(
        "--engine",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="run the engine conformance suite against this engine (a callable returning an unbound EngineAdapter); repeatable",
    )
    parser.addoption(
        "--engine-tolerance",
        default=None,
        metavar="RTOL,ATOL",
        help="compare an engine's outputs with these tolerances (default: the engine's conformance_tolerance, else by KV dtype)",
    )


def pytest_configure(config):
    TOLERANCE_OVERRIDE["option"] = parse_tolerance(config.getoption("--engine-tolerance", default=None))


def pytest_generate_tests(metafunc):
    if "engine_case" in metafunc.fixturenames:
        cases = engine_cases(metafunc.config.getoption("--engine", default=[]) or [])
        metafunc.parametrize("engine_case", cases, ids=[case.name for case in cases])


@pytest.fixture(autouse=True)
def one_torch_thread():
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
