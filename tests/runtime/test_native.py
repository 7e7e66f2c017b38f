"""Which control core runs: the compiled one where it was built from the sources beside it,
else the Python sources (forced, never built, or stale), never a mix."""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import subprocess
import sys

import pytest

from flowrt.control import native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def package(tmp_path):
    """A copy of the core's sources with extensions beside them and the manifest a build writes
    (stand-ins: choose() reads names and digests, it imports nothing)."""
    for module in native.MODULES:
        for suffix in (".py", ".pxd"):
            shutil.copy(native.HERE / f"{module}{suffix}", tmp_path)
        (tmp_path / f"{module}{SUFFIX}").write_bytes(b"")
    manifest = {f"{m}{SUFFIX}": native.source_digest(m, tmp_path) for m in native.MODULES}
    (tmp_path / native.MANIFEST).write_text(json.dumps(manifest))
    return tmp_path


def test_extensions_built_from_the_sources_beside_them_run(package, monkeypatch):
    monkeypatch.delenv("FLOWRT_PURE", raising=False)
    assert native.choose(package) == (True, "compiled (Cython)")


def test_flowrt_pure_runs_the_sources(package, monkeypatch):
    monkeypatch.setenv("FLOWRT_PURE", "1")
    assert native.choose(package) == (False, "Python sources (FLOWRT_PURE=1)")


@pytest.mark.parametrize("edited", ["call.py", "bucket.pxd"])
def test_an_extension_older_than_its_sources_is_not_run(package, monkeypatch, edited):
    monkeypatch.delenv("FLOWRT_PURE", raising=False)
    with (package / edited).open("a") as source:
        source.write("\n# edited after the build\n")
    with pytest.warns(RuntimeWarning, match=r"older than its sources .*make install"):
        compiled, reason = native.choose(package)
    assert not compiled and edited.split(".")[0] in reason


def test_a_missing_extension_or_manifest_means_the_sources(package, monkeypatch):
    monkeypatch.delenv("FLOWRT_PURE", raising=False)
    (package / native.MANIFEST).unlink()
    with pytest.warns(RuntimeWarning):
        assert not native.choose(package)[0]  # nothing vouches for the extensions
    (package / f"roles{SUFFIX}").unlink()
    assert native.choose(package) == (False, "Python sources (the core was not compiled when flowrt was installed)")


def _core_in_subprocess(pure: bool) -> dict:
    probe = (
        "import json, flowrt.control as c, flowrt.control.call as call, flowrt.control.program as program; "
        "print(json.dumps({'compiled': c.COMPILED, 'core': c.CORE, 'call': call.__file__, 'program': program.__file__}))"
    )
    env = {"PATH": "/usr/bin:/bin", "FLOWRT_PURE": "1" if pure else "0"}
    result = subprocess.run([sys.executable, "-W", "error", "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_process_runs_one_core_whole():
    pure = _core_in_subprocess(pure=True)
    assert not pure["compiled"] and pure["call"].endswith("call.py") and pure["program"].endswith("program.py")
    default = _core_in_subprocess(pure=False)
    if default["compiled"]:
        assert not default["call"].endswith(".py") and not default["program"].endswith(".py")
    else:  # this checkout's core was never compiled: the sources, and nothing says it is stale
        assert default["core"] == "Python sources (the core was not compiled when flowrt was installed)"
