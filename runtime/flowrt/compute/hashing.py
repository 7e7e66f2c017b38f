"""Chained page hashing (DESIGN §7): the keys under which KV pages are stored and matched.

A sequence of token ids is cut into pages of `page_tokens` tokens; only full pages are hashed
(a trailing partial page gets no digest until it fills). Page i's digest covers page i-1's
digest and page i's own contents, so equal digests mean equal prefixes: pages 0..i of two
sequences are the same exactly when their digests i are (up to a BLAKE2b collision). Digests
are the same in every process and on every machine (no `hash()`, no per-process seed).

The byte encoding, version 1 (this module is its specification, with hashlib; the C extension
`_pagehash` computes the same bytes, about 10x faster, where it was compiled: see `native`):

    digest[i]  = BLAKE2b(message[i], digest_size=16)       RFC 7693: no key, salt or personalization
    message[i] = tag[i]                                    8 bytes
              || parent[i]                                 16 bytes
              || tokens[i*P : (i+1)*P] as little-endian uint32 (4*P bytes, P = page_tokens)
              || extra[i]                                  16 bytes, media pages only
    tag[i]     = b"flowkv\\x01\\x00" (PAGE_TAG), or b"flowkv\\x01\\x01" (MEDIA_PAGE_TAG) where page i
                 has an extra: the content hash of the media payload whose tokens it holds
    parent[0]  = the `parent` argument: ROOT (16 zero bytes) unless given, e.g. chain_root(namespace)
                 or the last digest of an earlier call (the chain then goes on where it stopped)
    parent[i]  = digest[i-1]

A message determines every field (the tag says whether an extra is there, the length then
gives P), so different pages never share a message, whatever their page size. `content_hash`
and `chain_root` hash under tags of their own (b"flowmd\\x01\\x00", b"flowns\\x01\\x00"): a
content hash, a root and a page digest never share a message either. Page keys (what the
metadata store takes) are the digests in hex: 32 lowercase hex digits (never a "|").

Token ids are ints in [0, 2**32) (uint32 holds every vocabulary); every token is checked, those
of the trailing partial page too. 128-bit digests resist collisions up to about 2**64 work; a
collision would serve one sequence another's KV, which is why this is a cryptographic hash and
why deployments that must keep tenants apart give each its own `chain_root`.

Tokens may be a list (or any iterable) of ints, an `array.array` of integers, a numpy array
or a CPU torch tensor of an integer dtype; buffers are read without a Python loop per token.
"""

from __future__ import annotations

import hashlib
import operator
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowrt.compute import native
from flowrt.errors import FlowrtError

DIGEST_SIZE = 16
ROOT = bytes(DIGEST_SIZE)  # parent[0] unless a caller gives one
PAGE_TAG = b"flowkv\x01\x00"
MEDIA_PAGE_TAG = b"flowkv\x01\x01"
CONTENT_TAG = b"flowmd\x01\x00"
NAMESPACE_TAG = b"flowns\x01\x00"
MAX_TOKEN = 2**32 - 1
_SIGNED, _UNSIGNED = "bhilqn", "BHILQN"  # the struct codes of integer buffers
_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"
_ARRAY_CODES = {(True, 1): "b", (True, 2): "h", (True, 4): "i", (True, 8): "q"}
_ARRAY_CODES |= {(False, 1): "B", (False, 2): "H", (False, 4): "I", (False, 8): "Q"}

_native, BACKEND = native.load()  # the C extension, or None: hashlib; BACKEND says which, in words


class HashError(FlowrtError, ValueError):
    """Page hashing was given something it cannot hash (a bad token, page size, parent or extra)."""


def content_hash(data: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte content hash of a media payload (an image's or audio clip's bytes), for
    `extras`: BLAKE2b-128(b"flowmd\\x01\\x00" || data). A page holding several payloads' tokens
    takes the content_hash of their hashes joined in order."""
    try:
        view = memoryview(data)
    except TypeError:
        raise HashError(f"content_hash takes bytes (a payload's encoded bytes), not {type(data).__name__}") from None
    return hashlib.blake2b(CONTENT_TAG + view.cast("B").tobytes(), digest_size=DIGEST_SIZE).digest()


def chain_root(namespace: str | bytes) -> bytes:
    """parent[0] for a namespace (a model, a tenant): chains under different roots share no page
    digests. BLAKE2b-128(b"flowns\\x01\\x00" || namespace as UTF-8)."""
    if isinstance(namespace, str):
        namespace = namespace.encode()
    if not isinstance(namespace, bytes | bytearray):
        raise HashError(f"a chain root's namespace is a str or bytes, not {type(namespace).__name__}")
    return hashlib.blake2b(NAMESPACE_TAG + bytes(namespace), digest_size=DIGEST_SIZE).digest()


def page_digests(
    tokens: Any, page_tokens: int = 16, *, parent: bytes | str | None = None, extras: Mapping[int, bytes] | None = None
) -> bytes:
    """The digests of the full pages of `tokens`, 16 bytes each, joined: page i's digest is
    `result[16*i : 16*i+16]`. `parent`: parent[0] (16 bytes or 32 hex digits; default ROOT).
    `extras`: page index -> 16-byte content hash of the media payload on that page."""
    job = _prepare(tokens, page_tokens, parent, extras)
    if _native is None:
        return _spec(job)
    return _fast(job, as_hex=False)


def page_hashes(
    tokens: Any, page_tokens: int = 16, *, parent: bytes | str | None = None, extras: Mapping[int, bytes] | None = None
) -> list[str]:
    """The page keys of the full pages of `tokens`: each page's digest as 32 lowercase hex
    digits, in page order. Arguments as for `page_digests`."""
    job = _prepare(tokens, page_tokens, parent, extras)
    if _native is None:
        text = _spec(job).hex()
        return [text[i : i + 2 * DIGEST_SIZE] for i in range(0, len(text), 2 * DIGEST_SIZE)]
    return _fast(job, as_hex=True)


def spec_page_digests(
    tokens: Any, page_tokens: int = 16, *, parent: bytes | str | None = None, extras: Mapping[int, bytes] | None = None
) -> bytes:
    """`page_digests` computed by the specification (hashlib) whatever BACKEND is."""
    return _spec(_prepare(tokens, page_tokens, parent, extras))


@dataclass(slots=True)
class _Job:
    """Validated arguments: tokens as a list (itemsize 0) or the bytes of a native integer buffer."""

    tokens: Any
    n_tokens: int
    signed: bool
    itemsize: int
    page_tokens: int
    parent: bytes
    extra_pages: bytes  # int64s in native order, ascending: the pages that have an extra
    extra_digests: bytes  # their digests, 16 bytes each, in the same order


def _fast(job: _Job, as_hex: bool):
    try:
        return _native.chain(
            job.tokens,
            job.n_tokens,
            job.page_tokens,
            job.parent,
            PAGE_TAG,
            MEDIA_PAGE_TAG,
            job.extra_pages,
            job.extra_digests,
            as_hex,
            job.signed,
            job.itemsize,
        )
    except _native.BadToken as error:
        raise _bad_token(job, error.index) from None


def _spec(job: _Job) -> bytes:
    """The specification: the module docstring's encoding, page by page, with hashlib."""
    words = _as_uint32(job)
    if sys.byteorder == "big":
        words.byteswap()
    raw = words.tobytes()
    step = 4 * job.page_tokens
    extras = dict(zip(array("q", job.extra_pages), _chunks(job.extra_digests), strict=True))
    out = bytearray()
    previous = job.parent
    for i in range(job.n_tokens // job.page_tokens):
        extra = extras.get(i)
        tag = PAGE_TAG if extra is None else MEDIA_PAGE_TAG
        message = tag + previous + raw[i * step : (i + 1) * step] + (extra or b"")
        previous = hashlib.blake2b(message, digest_size=DIGEST_SIZE).digest()
        out += previous
    return bytes(out)


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + DIGEST_SIZE] for i in range(0, len(data), DIGEST_SIZE)]


def _as_uint32(job: _Job) -> array:
    values = job.tokens
    if job.itemsize:
        values = array(_ARRAY_CODES[job.signed, job.itemsize])
        values.frombytes(job.tokens)
    try:
        return array("I", values)
    except (TypeError, OverflowError):
        for index, value in enumerate(values):
            if not _is_token(value):
                raise _bad_token(job, index) from None
        raise


def _is_token(value: Any) -> bool:
    try:
        return 0 <= operator.index(value) <= MAX_TOKEN
    except TypeError:
        return False


def _bad_token(job: _Job, index: int) -> HashError:
    if job.itemsize:
        item = job.tokens[index * job.itemsize : (index + 1) * job.itemsize]
        value = array(_ARRAY_CODES[job.signed, job.itemsize], bytes(item))[0]
    elif index < len(job.tokens):
        value = job.tokens[index]
    else:  # an item's __index__ shortened the list
        return HashError(f"tokens changed while they were hashed (the list lost items at {index})")
    try:
        operator.index(value)
    except TypeError:
        why = f"a {type(value).__name__}, not an int"
    else:
        why = "negative" if value < 0 else "too large"
    return HashError(
        f"tokens[{index}] = {value!r} is not a token id ({why}): token ids are ints in [0, 2**32); "
        "hash the ids the tokenizer gave (cast floats to int, and keep padding or sentinels such as -1 out)"
    )


def _prepare(tokens: Any, page_tokens: Any, parent: Any, extras: Any) -> _Job:
    if isinstance(page_tokens, bool) or not _is_int(page_tokens) or operator.index(page_tokens) < 1:
        raise HashError(f"page_tokens must be an int >= 1 (the KV layout's tokens per page), not {page_tokens!r}")
    page_tokens = operator.index(page_tokens)
    data, n_tokens, signed, itemsize = _token_data(tokens)
    extra_pages, extra_digests = _extras(extras, n_tokens, page_tokens)
    return _Job(data, n_tokens, signed, itemsize, page_tokens, _digest(parent, "parent"), extra_pages, extra_digests)


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _token_data(tokens: Any) -> tuple[Any, int, bool, int]:
    """(a list, or the bytes of a C-contiguous native integer buffer; its length; signed; item size)."""
    if isinstance(tokens, list):
        return tokens, len(tokens), False, 0
    if isinstance(tokens, str | bytes | bytearray):
        raise HashError(f"tokens must be token ids (ints), not {type(tokens).__name__}: tokenize the text first")
    if type(tokens).__module__.partition(".")[0] == "torch":
        tokens = _from_torch(tokens)
    try:
        view = memoryview(tokens)
    except TypeError:
        try:
            return _token_data(list(tokens))
        except TypeError:
            raise HashError(f"tokens must be a sequence of token ids (ints), not {type(tokens).__name__}") from None
    fmt = view.format
    code = fmt[1:] if len(fmt) == 2 and fmt[0] in "@=" + _NATIVE_ORDER else fmt
    if view.ndim != 1:
        raise HashError(f"tokens must be one-dimensional, not of shape {tuple(view.shape)}: hash each sequence on its own")
    if len(code) != 1 or code not in _SIGNED + _UNSIGNED:
        kind = "floating point" if code in "efd" else "booleans" if code == "?" else f"items of format {fmt!r}"
        raise HashError(
            f"tokens must be integers in native byte order, not {kind}: convert them first (e.g. numpy's .astype('int64'))"
        )
    raw = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    return raw, len(view), code in _SIGNED, view.itemsize


def _from_torch(tensor: Any) -> Any:
    if getattr(tensor, "device", None) is not None and tensor.device.type != "cpu":
        raise HashError(f"tokens on {tensor.device} cannot be hashed where they are: move them to the CPU first (.cpu())")
    if tensor.is_floating_point() or tensor.is_complex() or str(tensor.dtype) == "torch.bool":
        raise HashError(f"tokens must be integers, not a tensor of {tensor.dtype}: convert it first (.long())")
    return tensor.detach().contiguous().numpy()


def _digest(value: Any, what: str) -> bytes:
    """A 16-byte digest given as bytes or 32 hex digits (None: ROOT)."""
    if value is None:
        return ROOT
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value)
        except ValueError:
            raise HashError(f"{what} {value!r} is not a digest in hex (32 hex digits)") from None
    try:
        value = memoryview(value).cast("B").tobytes()
    except TypeError:
        raise HashError(f"{what} must be a 16-byte digest (bytes or 32 hex digits), not {type(value).__name__}") from None
    if len(value) != DIGEST_SIZE:
        raise HashError(
            f"{what} must be a 16-byte digest, not {len(value)} bytes: use page_digests' or chain_root's "
            "digests (page keys in hex work too), or content_hash for a media payload"
        )
    return value


def _extras(extras: Any, n_tokens: int, page_tokens: int) -> tuple[bytes, bytes]:
    """(the pages with an extra, as native int64s in order; their digests) for the full pages;
    an extra for the trailing partial page is accepted and, like that page, not hashed."""
    if not extras:
        return b"", b""
    if not isinstance(extras, Mapping):
        raise HashError(f"extras must be a mapping of page index -> content hash, not {type(extras).__name__}")
    pages = -(-n_tokens // page_tokens)
    used = []
    for key, value in extras.items():
        if isinstance(key, bool) or not _is_int(key) or not 0 <= operator.index(key) < pages:
            raise HashError(
                f"extras has a key {key!r}, which is not a page of these tokens: keys are page indexes, "
                f"0 to {pages - 1} here ({n_tokens} tokens, {page_tokens} a page)"
            )
        digest = _digest(value, f"extras[{key}]")
        if operator.index(key) < n_tokens // page_tokens:
            used.append((operator.index(key), digest))
    used.sort()
    return array("q", [index for index, _ in used]).tobytes(), b"".join(digest for _, digest in used)
