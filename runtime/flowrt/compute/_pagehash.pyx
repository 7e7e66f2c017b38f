# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The C fast path of flowrt.compute.hashing: the whole page-hash chain in one call, without the GIL.

BLAKE2b is in _blake2b.h (written from RFC 7693), the chain in _pagehash.h and _pagechain.h;
this module only moves Python data in and out. hashing.py validates every argument before it
calls `chain`, and is the specification: this module must give the very bytes
hashing.spec_page_digests gives. setup.py compiles it with FLOWRT_SOURCE_DIGEST, the digest of
its sources (flowrt.compute.native), so a stale build is detected and not used.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset
from time import perf_counter


cdef extern from "_pagehash.h":
    Py_ssize_t flowrt_tokens_u32(const void *src, int is_signed, int itemsize, size_t n, uint32_t *dst) nogil
    Py_ssize_t flowrt_list_u32(object tokens, Py_ssize_t start, Py_ssize_t n, uint32_t *dst)
    int flowrt_page_chain(const uint32_t *tokens, size_t page_tokens, size_t n_pages, const uint8_t *parent,
                          const uint8_t *page_tag, const uint8_t *media_tag, const int64_t *extra_pages,
                          const uint8_t *extra_digests, size_t n_extras, size_t first_page, uint8_t *out) nogil
    object flowrt_hex_list(const uint8_t *digests, Py_ssize_t n)
    int flowrt_blake2b(uint8_t *out, size_t nn, const uint8_t *msg, size_t len) nogil
    int flowrt_simd
    int flowrt_simd_available()


# tokens that are not already uint32 are converted a run of pages at a time, into a buffer that
# stays in the cache (about 64 KiB), not all at once
cdef Py_ssize_t RUN_TOKENS = 16384


cdef extern from *:
    """
    #ifndef FLOWRT_SOURCE_DIGEST
    #define FLOWRT_SOURCE_DIGEST ""
    #endif
    """
    const char *FLOWRT_SOURCE_DIGEST


SOURCE_DIGEST = (<bytes>FLOWRT_SOURCE_DIGEST).decode("ascii")  # "" when built without setup.py
SIMD_AVAILABLE = bool(flowrt_simd_available())  # this CPU runs the SSSE3 compression


def use_simd(bint on):
    """Run the chain on the SSSE3 compression (where the CPU has it) or the portable one; both
    give the same digests (the tests run both). Returns whether SSSE3 is now in use."""
    global flowrt_simd
    flowrt_simd = on and SIMD_AVAILABLE
    return bool(flowrt_simd)


cdef double _chain_seconds(Py_ssize_t pages, int rounds):
    """The best of `rounds` timings of a `pages`-page chain (16-token pages of zeros)."""
    cdef uint32_t *tokens = <uint32_t *>calloc(pages * 16, 4)
    cdef uint8_t *out = <uint8_t *>malloc(pages * 16)
    cdef uint8_t parent[16]
    cdef uint8_t tag[8]
    memset(parent, 0, 16)
    memset(tag, 0, 8)
    if tokens == NULL or out == NULL:
        free(tokens)
        free(out)
        raise MemoryError()
    best = float("inf")
    try:
        for _ in range(rounds):
            start = perf_counter()
            with nogil:
                flowrt_page_chain(tokens, 16, pages, parent, tag, tag, NULL, NULL, 0, 0, out)
            best = min(best, perf_counter() - start)
    finally:
        free(tokens)
        free(out)
    return best


def calibrate(Py_ssize_t pages=512, int rounds=3):
    """Use whichever compression hashes faster on this CPU, timed on a short chain (under a
    millisecond), and return its name. SSSE3 is not faster everywhere: on an AMD EPYC here the
    portable one hashed twice as many pages a second. Both give the same digests."""
    global DEFAULT_SIMD
    DEFAULT_SIMD = False
    if SIMD_AVAILABLE:
        use_simd(True)
        fast = _chain_seconds(pages, rounds)
        use_simd(False)
        DEFAULT_SIMD = fast < _chain_seconds(pages, rounds)
    use_simd(DEFAULT_SIMD)
    return compression()


def use_default():
    """Back to the compression `calibrate` chose (after a test or bench forced one)."""
    return use_simd(DEFAULT_SIMD)


def compression():
    """Which compression function the chain runs, in words."""
    return "SSSE3" if flowrt_simd else "portable"


DEFAULT_SIMD = False
calibrate()


class BadToken(ValueError):
    """tokens[index] is not an int in [0, 2**32): hashing.py reports which one and why."""

    def __init__(self, index):
        super().__init__(index)
        self.index = index


def blake2b(const unsigned char[::1] data, Py_ssize_t digest_size=64):
    """BLAKE2b (no key) of `data`: the primitive on its own, for the tests' check against hashlib."""
    if not 1 <= digest_size <= 64:
        raise ValueError("digest_size must be 1..64")
    out = PyBytes_FromStringAndSize(NULL, digest_size)
    cdef uint8_t *dst = <uint8_t *>PyBytes_AS_STRING(out)
    cdef const uint8_t *src = &data[0] if data.shape[0] else <const uint8_t *>b""
    cdef size_t n = data.shape[0]
    cdef int status
    with nogil:
        status = flowrt_blake2b(dst, digest_size, src, n)
    if status:
        raise MemoryError()
    return out


def chain(tokens, Py_ssize_t n_tokens, Py_ssize_t page_tokens, const unsigned char[::1] parent,
          const unsigned char[::1] page_tag, const unsigned char[::1] media_tag,
          const unsigned char[::1] extra_pages, const unsigned char[::1] extra_digests,
          bint as_hex, bint is_signed=False, int itemsize=0):
    """The digests of the n_tokens // page_tokens full pages of `tokens`: one bytes of 16 bytes
    a page, or (as_hex) a list of their hex strings.

    `tokens` is a list of ints (itemsize 0) or the bytes of a C-contiguous native-order integer
    buffer (a memoryview cast to "B") whose items have `itemsize` bytes, signed or not.
    `extra_pages` holds the sorted indexes (int64, native order) of the pages that carry an
    extra digest, `extra_digests` those digests, 16 bytes each, in the same order. hashing.py
    has checked every length and range; a token outside [0, 2**32) raises BadToken.
    """
    if page_tokens < 1 or n_tokens < 0 or parent.shape[0] != 16 or page_tag.shape[0] != 8 or media_tag.shape[0] != 8:
        raise ValueError("chain: bad sizes (call it through flowrt.compute.hashing)")
    if extra_pages.shape[0] % 8 or extra_digests.shape[0] != 2 * extra_pages.shape[0]:
        raise ValueError("chain: extra_pages and extra_digests do not match")
    if itemsize and (itemsize not in (1, 2, 4, 8) or len(tokens) != n_tokens * itemsize):
        raise ValueError("chain: the token buffer does not hold n_tokens items of itemsize bytes")
    cdef size_t n_pages = n_tokens // page_tokens
    cdef size_t n_extras = extra_pages.shape[0] // 8
    cdef const int64_t *pages_with_extras = <const int64_t *>&extra_pages[0] if n_extras else NULL
    cdef const uint8_t *extras = &extra_digests[0] if n_extras else NULL
    cdef const unsigned char[::1] raw
    cdef const uint8_t *src = NULL
    cdef uint32_t *run = NULL
    cdef const uint32_t *words
    cdef Py_ssize_t run_tokens = max(RUN_TOKENS // page_tokens, 1) * page_tokens
    cdef Py_ssize_t start = 0, count, bad = -1
    cdef size_t first = 0, pages, skip = 0
    cdef int status = 0
    out = PyBytes_FromStringAndSize(NULL, n_pages * 16)
    cdef uint8_t *dst = <uint8_t *>PyBytes_AS_STRING(out)
    cdef const uint8_t *previous = &parent[0]
    if itemsize and n_tokens:
        raw = tokens
        src = &raw[0]
    if itemsize == 4 and not is_signed and (<size_t>src) % 4 == 0:
        if n_pages:  # already what the chain reads: no copy
            with nogil:
                status = flowrt_page_chain(<const uint32_t *>src, page_tokens, n_pages, previous, &page_tag[0],
                                           &media_tag[0], pages_with_extras, extras, n_extras, 0, dst)
    elif n_tokens:
        run = <uint32_t *>malloc(min(run_tokens, n_tokens) * 4)
        if run == NULL:
            raise MemoryError()
        try:
            while start < n_tokens and status == 0:
                count = min(run_tokens, n_tokens - start)
                if itemsize == 0:
                    bad = flowrt_list_u32(tokens, start, count, run)
                else:
                    with nogil:
                        bad = flowrt_tokens_u32(src + start * itemsize, is_signed, itemsize, count, run)
                if bad >= 0:
                    raise BadToken(start + bad)
                first = start // page_tokens
                pages = count // page_tokens
                while skip < n_extras and <size_t>pages_with_extras[skip] < first:
                    skip += 1
                if pages:
                    with nogil:
                        status = flowrt_page_chain(run, page_tokens, pages, previous, &page_tag[0], &media_tag[0],
                                                   pages_with_extras + skip if skip < n_extras else NULL,
                                                   extras + 16 * skip if skip < n_extras else NULL,
                                                   n_extras - skip, first, dst + 16 * first)
                    previous = dst + 16 * (first + pages - 1)
                start += count
        finally:
            free(run)
    if status:
        raise MemoryError()
    if as_hex:
        return flowrt_hex_list(dst, n_pages)
    return out
