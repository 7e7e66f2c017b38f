"""Chained page hashing (flowrt.compute.hashing): the documented byte encoding, the chain's
properties, the C fast path against the hashlib specification, the fallback, and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrt.compute import hashing, native
from flowrt.compute.hashing import HashError, chain_root, content_hash, page_digests, page_hashes, spec_page_digests
from tests.conftest import REPO

np = pytest.importorskip("numpy")
C = hashing._native
needs_c = pytest.mark.skipif(C is None, reason=f"the C extension is not in use: {hashing.BACKEND}")


@pytest.fixture(params=["C", "C portable", "hashlib"])
def backend(request, monkeypatch):
    """Runs a test on the C extension (with its SSSE3 compression where the CPU has it, and with
    its portable one) and on the hashlib fallback (forced)."""
    if request.param.startswith("C") and C is None:
        pytest.skip(f"the C extension is not in use: {hashing.BACKEND}")
    if request.param == "hashlib":
        monkeypatch.setattr(hashing, "_native", None)
    if request.param == "C portable":
        C.use_simd(False)
        yield request.param
        C.use_default()
    else:
        yield request.param


def by_hand(tokens, page_tokens=16, parent=bytes(16), extras=None):
    """The module docstring's encoding, spelled out independently of hashing.py."""
    out, extras = [], extras or {}
    for i in range(len(tokens) // page_tokens):
        page = struct.pack(f"<{page_tokens}I", *tokens[i * page_tokens : (i + 1) * page_tokens])
        tag = b"flowkv\x01\x01" if i in extras else b"flowkv\x01\x00"
        parent = hashlib.blake2b(tag + parent + page + extras.get(i, b""), digest_size=16).digest()
        out.append(parent.hex())
    return out


# -- the encoding and the chain ----------------------------------------------------------------


def test_digests_follow_the_documented_encoding(backend):
    tokens = list(range(1000, 1050))
    assert page_hashes(tokens) == by_hand(tokens)
    root = chain_root("model-a")
    extras = {1: content_hash(b"\x89PNG...")}
    assert page_hashes(tokens, 8, parent=root, extras=extras) == by_hand(tokens, 8, root, extras)
    # a pinned vector: a change to the encoding changes every key ever stored
    assert page_hashes(list(range(16))) == [by_hand(list(range(16)))[0]]
    assert (
        page_hashes(list(range(16)))[0]
        == hashlib.blake2b(b"flowkv\x01\x00" + bytes(16) + struct.pack("<16I", *range(16)), digest_size=16).hexdigest()
    )


def test_keys_are_32_lowercase_hex_digits_and_bytes_variant_agrees(backend):
    tokens = [random.randrange(2**32) for _ in range(16 * 50 + 7)]
    keys = page_hashes(tokens)
    assert len(keys) == 50 and all(len(k) == 32 and set(k) <= set("0123456789abcdef") for k in keys)
    assert "|" not in "".join(keys)
    assert page_digests(tokens) == b"".join(bytes.fromhex(k) for k in keys)


def test_changing_one_token_changes_its_page_and_every_later_one_only(backend):
    tokens = [random.randrange(50_000) for _ in range(16 * 12)]
    before = page_hashes(tokens)
    for position in (0, 15, 16, 100, len(tokens) - 1):
        changed = list(tokens)
        changed[position] += 1
        after = page_hashes(changed)
        page = position // 16
        assert after[:page] == before[:page]
        assert all(a != b for a, b in zip(after[page:], before[page:], strict=True))


def test_equal_prefixes_give_equal_keys_and_the_chain_goes_on_from_a_parent(backend):
    shared = [random.randrange(50_000) for _ in range(16 * 5)]
    a = page_hashes(shared + [1] * 32)
    b = page_hashes(shared + [2] * 40)
    assert a[:5] == b[:5] and a[5] != b[5]
    assert page_hashes(shared[48:] + [1] * 32, parent=a[2]) == a[3:]  # a key in hex works as parent
    assert page_hashes(shared[48:] + [1] * 32, parent=bytes.fromhex(a[2])) == a[3:]


def test_only_full_pages_are_hashed(backend):
    tokens = list(range(64))
    assert page_hashes(tokens + [7, 8, 9]) == page_hashes(tokens)
    assert page_hashes(tokens[:15]) == [] and page_digests([]) == b""
    assert page_hashes(tokens, 64) == by_hand(tokens, 64) and page_hashes(tokens, 65) == []


def test_roots_and_extras_change_keys(backend):
    tokens = list(range(16 * 4))
    plain = page_hashes(tokens)
    assert page_hashes(tokens, parent=chain_root("tenant-1")) != page_hashes(tokens, parent=chain_root("tenant-2"))
    assert chain_root("x") == chain_root(b"x") != chain_root("y")
    image = {2: content_hash(b"image one")}
    with_image = page_hashes(tokens, extras=image)
    assert with_image[:2] == plain[:2] and all(a != b for a, b in zip(with_image[2:], plain[2:], strict=True))
    assert page_hashes(tokens, extras={2: content_hash(b"image two")})[2] != with_image[2]
    # an extra on the trailing partial page is allowed and, like that page, not hashed
    assert page_hashes(tokens + [1, 2], extras={4: content_hash(b"late")}) == plain
    # an extra is not the same as the 4 tokens that would spell the same bytes
    spelled = list(struct.unpack("<4I", content_hash(b"x")))
    assert page_hashes(tokens[:16] + spelled, 20) != page_hashes(tokens[:16], 16, extras={0: content_hash(b"x")})


def test_content_hash_is_blake2b_128_under_its_own_tag():
    assert content_hash(b"abc") == hashlib.blake2b(b"flowmd\x01\x00abc", digest_size=16).digest()
    assert content_hash(memoryview(b"abc")) == content_hash(bytearray(b"abc"))
    with pytest.raises(HashError, match="content_hash takes bytes"):
        content_hash("abc")


# -- inputs ------------------------------------------------------------------------------------


def test_every_kind_of_token_sequence_gives_the_same_keys(backend):
    values = [random.randrange(2**31) for _ in range(16 * 9 + 3)]
    expected = by_hand(values)
    kinds = [
        values,
        tuple(values),
        iter(values),
        array("I", values),
        array("q", values),
        array("L", values),
        np.array(values, dtype=np.int64),
        np.array(values, dtype=np.uint32),
        np.array(values, dtype=np.uint64),
        np.array(values, dtype=np.int32),
        np.repeat(np.array(values, dtype=np.int64), 2)[::2],  # not contiguous
        [np.int64(v) for v in values],
    ]
    for tokens in kinds:
        assert page_hashes(tokens) == expected, type(tokens)
    for dtype in (np.uint16, np.int16, np.uint8, np.int8):
        narrow = [v % (np.iinfo(dtype).max + 1) for v in values]
        assert page_hashes(np.array(narrow, dtype=dtype)) == by_hand(narrow)


def test_cpu_torch_tensors_are_hashed_as_their_values(backend):
    torch = pytest.importorskip("torch")
    values = [random.randrange(2**31) for _ in range(16 * 3)]
    assert page_hashes(torch.tensor(values, dtype=torch.int64)) == by_hand(values)
    assert page_hashes(torch.tensor(values, dtype=torch.int32)) == by_hand(values)
    assert page_hashes(torch.tensor(values).repeat_interleave(2)[::2]) == by_hand(values)
    with pytest.raises(HashError, match=r"not a tensor of torch.float32: convert it first \(.long\(\)\)"):
        page_hashes(torch.tensor([1.0] * 16))


def test_long_sequences_are_hashed_a_run_at_a_time_with_the_same_result(backend):
    values = [random.randrange(2**32) for _ in range(16 * 3000 + 5)]  # several runs of the C path
    extras = {i: content_hash(str(i).encode()) for i in (0, 1023, 1024, 1025, 2047, 2999)}
    expected = by_hand(values, 16, bytes(16), extras)
    for tokens in (values, np.array(values, dtype=np.int64), array("I", values)):
        assert page_hashes(tokens, extras=extras) == expected
    head = page_hashes(values[: 7 * 2000], 7)
    assert page_hashes(values, 7) == head + page_hashes(values[7 * 2000 :], 7, parent=head[-1])


@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=300),
    page_tokens=st.integers(1, 40),
    parent=st.none() | st.binary(min_size=16, max_size=16),
    extra_seed=st.integers(0, 2**32),
    kind=st.sampled_from(["list", "uint32", "int64", "uint64"]),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_c_path_gives_the_bytes_of_the_specification(tokens, page_tokens, parent, extra_seed, kind):
    if C is None:
        pytest.skip(f"the C extension is not in use: {hashing.BACKEND}")
    rng = random.Random(extra_seed)
    pages = -(-len(tokens) // page_tokens)
    extras = {i: rng.randbytes(16) for i in range(pages) if rng.random() < 0.3}
    data = tokens if kind == "list" else np.array(tokens, dtype=kind)
    expected = spec_page_digests(tokens, page_tokens, parent=parent, extras=extras)
    try:
        for simd in (True, False):  # SSSE3 compression (where the CPU has it), then portable
            C.use_simd(simd)
            assert hashing.page_digests(data, page_tokens, parent=parent, extras=extras) == expected
            assert hashing.page_hashes(data, page_tokens, parent=parent, extras=extras) == [
                expected[i : i + 16].hex() for i in range(0, len(expected), 16)
            ]
    finally:
        C.use_default()


@needs_c
def test_the_faster_compression_is_chosen_and_either_can_be_forced():
    try:
        assert C.use_simd(False) is False and C.compression() == "portable"
        assert C.use_simd(True) is C.SIMD_AVAILABLE
        assert C.compression() == ("SSSE3" if C.SIMD_AVAILABLE else "portable")
        chosen = C.calibrate(pages=64, rounds=1)
        assert chosen in ("SSSE3", "portable") and (chosen == "SSSE3") is C.DEFAULT_SIMD
        assert C.SIMD_AVAILABLE or chosen == "portable"
    finally:
        C.use_default()


@needs_c
def test_the_c_blake2b_is_blake2b():
    for length in (0, 1, 111, 112, 127, 128, 129, 255, 256, 257, 1000):
        data = random.randbytes(length)
        for size in (1, 16, 20, 32, 64):
            assert C.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest(), (length, size)


# -- across processes and the fallback -----------------------------------------------------------

SCRIPT = """
import json, sys
from flowrt.compute import hashing
tokens = list(range(5, 16 * 20 + 5))
print(json.dumps([hashing.BACKEND, hashing.page_hashes(tokens, extras={3: hashing.content_hash(b"x")})]))
"""


def run_elsewhere(**env) -> tuple[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**os.environ, **env}, capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    backend, keys = json.loads(result.stdout)
    return backend, keys


def test_keys_are_the_same_in_other_processes_whatever_their_hash_seed_and_backend():
    here = page_hashes(list(range(5, 16 * 20 + 5)), extras={3: content_hash(b"x")})
    backend, keys = run_elsewhere(PYTHONHASHSEED="12345")
    assert keys == here, backend
    backend, keys = run_elsewhere(PYTHONHASHSEED="999", FLOWRT_PURE="1")
    assert keys == here and backend == "hashlib (FLOWRT_PURE=1)"


def test_a_stale_or_missing_extension_falls_back_to_hashlib(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWRT_PURE", raising=False)
    for name in native.SOURCES:
        shutil.copy(native.HERE / name, tmp_path)
    built_from = native.source_digest(tmp_path)
    assert native.choose(built_from, tmp_path) == (True, "C (Cython)")
    assert native.choose(None, tmp_path) == (False, "hashlib (the C extension was not compiled when flowrt was installed)")
    # an installed wheel: no sources beside the extension, or some (wheels ship the headers, not the .pyx)
    assert native.choose(built_from, tmp_path / "elsewhere") == (True, "C (Cython)")
    (tmp_path / "wheel").mkdir()
    shutil.copy(native.HERE / "_blake2b.h", tmp_path / "wheel")
    assert native.choose("anything", tmp_path / "wheel") == (True, "C (Cython)")
    with (tmp_path / "_blake2b.h").open("a") as header:
        header.write("/* edited */\n")
    with pytest.warns(RuntimeWarning, match="older than its sources"):
        assert native.choose(built_from, tmp_path) == (False, "hashlib (the C extension is stale)")
    monkeypatch.setenv("FLOWRT_PURE", "1")
    assert native.choose(built_from, tmp_path) == (False, "hashlib (FLOWRT_PURE=1)")


@needs_c
def test_the_installed_extension_was_built_from_these_sources():
    assert native.source_digest() == C.SOURCE_DIGEST


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1, 2, -1, 4], r"tokens\[2\] = -1 is not a token id \(negative\).*keep padding or sentinels such as -1 out"),
        ([1, 2**32], r"tokens\[1\] = 4294967296 is not a token id \(too large\)"),
        ([1, 2**70], r"tokens\[1\] = 1180591620717411303424 is not a token id \(too large\)"),
        ([1, 2.0], r"tokens\[1\] = 2.0 is not a token id \(a float, not an int\).*cast floats to int"),
        ([1, "2"], r"tokens\[1\] = '2' is not a token id \(a str, not an int\)"),
        ([1, None], r"tokens\[1\] = None is not a token id"),
        (array("q", [0] * 40 + [-5]), r"tokens\[40\] = -5 is not a token id \(negative\)"),
        (array("Q", [0] * 20 + [2**40]), r"tokens\[20\] = 1099511627776 is not a token id \(too large\)"),
        ([0] * 20000 + [-3], r"tokens\[20000\] = -3 is not a token id"),  # in a later run of the C path
        (np.array([1.0, 2.0]), r"not floating point: convert them first \(e.g. numpy's .astype\('int64'\)\)"),
        (np.array([True, False]), r"not booleans"),
        (np.zeros((2, 16), dtype=np.int64), r"one-dimensional, not of shape \(2, 16\)"),
        (np.arange(16, dtype=">i4"), r"native byte order"),
        ("hello", r"not str: tokenize the text first"),
        (b"hello", r"not bytes"),
        (42, r"a sequence of token ids \(ints\), not int"),
    ],
)
def test_bad_tokens_are_refused_with_the_fix(backend, tokens, message):
    with pytest.raises(HashError, match=message):
        page_hashes(tokens)
    with pytest.raises(ValueError):  # HashError is a ValueError (and a FlowrtError)
        page_digests(tokens)


def test_a_bad_token_in_the_trailing_partial_page_is_refused_too(backend):
    with pytest.raises(HashError, match=r"tokens\[17\]"):
        page_hashes([0] * 17 + [-1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"page_tokens": 0}, r"page_tokens must be an int >= 1 \(the KV layout's tokens per page\), not 0"),
        ({"page_tokens": -16}, r"page_tokens must be an int >= 1"),
        ({"page_tokens": True}, r"page_tokens must be an int >= 1"),
        ({"page_tokens": 1.5}, r"page_tokens must be an int >= 1"),
        ({"parent": b"short"}, r"parent must be a 16-byte digest, not 5 bytes"),
        ({"parent": "zz" * 16}, r"parent 'zzzz.*' is not a digest in hex"),
        ({"parent": 7}, r"parent must be a 16-byte digest \(bytes or 32 hex digits\), not int"),
        ({"extras": {2: b"x" * 16}}, r"extras has a key 2, which is not a page of these tokens: .* 0 to 1 here"),
        ({"extras": {-1: b"x" * 16}}, r"extras has a key -1"),
        ({"extras": {True: b"x" * 16}}, r"extras has a key True"),
        ({"extras": {0: b"x" * 32}}, r"extras\[0\] must be a 16-byte digest, not 32 bytes.*content_hash"),
        ({"extras": [(0, b"x" * 16)]}, r"extras must be a mapping of page index -> content hash, not list"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(backend, kwargs, message):
    with pytest.raises(HashError, match=message):
        page_hashes(list(range(32)), **kwargs)


def test_numpy_page_sizes_are_ints():
    assert page_hashes(list(range(32)), np.int64(16)) == page_hashes(list(range(32)), 16)
