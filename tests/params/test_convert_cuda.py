"""The CUDA kernel of the layout conversion (cuda/kv_layout.cu): it compiles with nvcc alone; its
torch binding passes a syntax check against the installed torch's headers; and, on a CUDA
device, it equals the PyTorch specification (flowrt.params.convert, backend="torch")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

CUDA = REPO / "cuda"


def cuda_home() -> Path | None:
    """The CUDA toolkit whose headers are here: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, or nvcc's."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    candidates.append(str(Path(nvcc).resolve().parent.parent) if nvcc else None)
    for candidate in filter(None, candidates):
        if (Path(candidate) / "include" / "cuda_runtime.h").is_file():
            return Path(candidate)
    return None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed here")
def test_the_kernel_file_compiles_with_nvcc_alone(tmp_path):
    result = subprocess.run(
        ["nvcc", "-c", str(CUDA / "kv_layout.cu"), "-o", str(tmp_path / "kv_layout.o"), "-Xcompiler", "-Wall"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "kv_layout.o")], capture_output=True, text=True, timeout=60)
    if symbols.returncode == 0:  # the launcher the binding calls is defined there
        assert "flowrt_kv::launch_kv_layout(" in symbols.stdout


def test_the_torch_binding_passes_a_syntax_check_against_the_installed_headers(tmp_path):
    torch = pytest.importorskip("torch", reason="the binding is checked against torch's C++ headers")
    compiler = shutil.which("c++") or shutil.which("g++")
    home = cuda_home()
    if compiler is None or home is None:
        pytest.skip("needs a C++ compiler and the CUDA headers (nvcc's toolkit)")
    from torch.utils.cpp_extension import include_paths

    includes = [*include_paths(), str(home / "include"), str(CUDA), sysconfig.get_paths()["include"]]
    # a CPU build of torch ships c10/cuda's headers without the one its CMake generates
    generated = Path(include_paths()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not generated.is_file():
        stub = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        stub.parent.mkdir(parents=True)
        stub.write_text("#pragma once\n")
        includes.insert(0, str(tmp_path))
    result = subprocess.run(
        [compiler, "-std=c++20", "-fsyntax-only", *(f"-I{p}" for p in includes), "-DTORCH_EXTENSION_NAME=flowrt_kv_layout"]
        + [str(CUDA / "kv_layout.cpp")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert torch.__version__


@pytest.mark.skipif(sys.platform != "linux", reason="CUDA devices are tested on Linux")
def test_the_kernel_equals_the_specification_on_a_cuda_device():
    torch = pytest.importorskip("torch", reason="the kernel is reached through torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is false): the kernel cannot run")
    from flowrt.params import convert

    generator = torch.Generator().manual_seed(3)
    for dtype, shape in [
        (torch.float16, (16, 8, 64)),  # 16 KiB chunks: 16-byte vectors
        (torch.bfloat16, (3, 1, 5)),  # 30-byte chunks: bytes
        (torch.float32, (4, 2, 2)),
        (torch.int8, (16, 2, 16)),
        (torch.float8_e4m3fn, (5, 3, 1)),
    ]:
        chunks, stack_count, flat_count = 6, 40, 50

        def bits(count_shape, dtype=dtype):
            item = torch.empty((), dtype=dtype).element_size()
            raw = torch.randint(0, 256, (*count_shape[:-1], count_shape[-1] * item), dtype=torch.uint8, generator=generator)
            return raw.view(dtype).cuda()

        stacks = [bits((stack_count, *shape)) for _ in range(chunks)]
        flat = bits((flat_count, chunks, *shape))
        stack_slots = torch.randperm(stack_count, generator=generator)[:30].tolist()
        flat_slots = torch.randperm(flat_count, generator=generator)[:30].tolist()
        for slots in [(stack_slots, flat_slots), (range(5, 35), range(12, 42))]:
            expected, got = flat.clone(), flat.clone()
            convert.stacks_to_flat(stacks, slots[0], expected, slots[1], backend="torch")
            convert.stacks_to_flat(stacks, slots[0], got, slots[1], backend="cuda")
            torch.cuda.synchronize()
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), dtype
            back_expected = [s.clone() for s in stacks]
            back_got = [s.clone() for s in stacks]
            convert.flat_to_stacks(flat, slots[1], back_expected, slots[0], backend="torch")
            convert.flat_to_stacks(flat, slots[1], back_got, slots[0], backend="cuda")
            torch.cuda.synchronize()
            for a, b in zip(back_got, back_expected, strict=True):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), dtype
    assert convert.kernel_status() == "built"
