"""Which engines the engine suite runs against: every test taking `engine_case` runs once per
engine. By default the reference engine in two shapes; another engine with

    .venv/bin/pytest tests/compute/engine --engine my_package.my_module:make_engine
    FLOWRT_TEST_ENGINE=my_package.my_module:make_engine .venv/bin/pytest tests/compute/engine

(`--engine` only where pytest is pointed at this directory: pytest reads the options of a
directory's conftest when it starts there; the variable works from anywhere.)

torch runs these tests on one thread: the models are tiny, and on a busy machine two spinning
threads per process made them several times slower.
"""

from __future__ import annotations

import pytest

from tests.compute.engine.engines import engine_cases


def pytest_addoption(parser):
    parser.addoption(
        "--engine",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="run the engine conformance suite against this engine (a callable returning an unbound EngineAdapter); repeatable",
    )


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
