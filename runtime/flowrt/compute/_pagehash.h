/* The C side of flowrt.compute._pagehash: the page-hash chain, and moving tokens and keys
 * between Python objects and C arrays.
 *
 * flowrt.compute.hashing is the specification of the chain (its docstring gives the byte
 * encoding; hashlib computes it there): this file must give the very same bytes, which
 * tests/compute checks. The chain runs without the GIL; the functions that take or return
 * Python objects (flowrt_list_u32, flowrt_hex_list) run with it.
 */
#ifndef FLOWRT_PAGEHASH_H
#define FLOWRT_PAGEHASH_H

#include <Python.h>

#include "_blake2b.h"

#define FLOWRT_DIGEST 16
#define FLOWRT_TAG 8 /* the 8-byte tag that opens every page's message */

/* the chain once per compression function (_pagechain.h) */
#define FLOWRT_CHAIN(name) name##_portable
#define FLOWRT_COMPRESS flowrt_b2b_compress
#define FLOWRT_CHAIN_INLINE FLOWRT_INLINE
#define FLOWRT_CHAIN_ENTRY FLOWRT_NOINLINE
#include "_pagechain.h"
#undef FLOWRT_CHAIN
#undef FLOWRT_COMPRESS
#undef FLOWRT_CHAIN_INLINE
#undef FLOWRT_CHAIN_ENTRY

#if FLOWRT_HAVE_SSSE3
#define FLOWRT_CHAIN(name) name##_ssse3
#define FLOWRT_COMPRESS flowrt_b2b_compress_ssse3
#define FLOWRT_CHAIN_INLINE FLOWRT_SSSE3
#define FLOWRT_CHAIN_ENTRY static __attribute__((noinline, target("ssse3")))
#include "_pagechain.h"
#undef FLOWRT_CHAIN
#undef FLOWRT_COMPRESS
#undef FLOWRT_CHAIN_INLINE
#undef FLOWRT_CHAIN_ENTRY
#endif

/* Whether the chain runs the SSSE3 compression: set once by flowrt_simd_init (where the CPU
 * has SSSE3), and by the tests through _pagehash.use_simd, with the GIL held. */
static int flowrt_simd = 0;

/* Whether this CPU can run the SSSE3 compression. */
static int flowrt_simd_available(void) {
#if FLOWRT_HAVE_SSSE3
    __builtin_cpu_init();
    return __builtin_cpu_supports("ssse3") != 0;
#else
    return 0;
#endif
}

/* The page-hash chain: n_pages pages of page_tokens tokens each, every digest (16 bytes) into
 * out. Page i's message is tag || previous digest (parent for page 0) || its tokens as
 * little-endian uint32 || its extra digest (16 bytes, only on the pages listed in extra_pages,
 * with the media tag instead of the page tag). extra_pages is sorted and counts pages from
 * first_page (tokens[0] is the first token of page first_page of the sequence): callers hash a
 * long sequence a run of pages at a time. Returns 0, or -1 when out of memory. Runs without the GIL.
 *
 * The message is laid out in place in one zero-padded buffer of 64-bit words (the padding stays
 * zero), and each digest is written as two 64-bit words, both into out and into the next
 * message, where the next compression reads it back as the same two words. */
static int flowrt_page_chain(const uint32_t *tokens, size_t page_tokens, size_t n_pages, const uint8_t *parent,
                             const uint8_t *page_tag, const uint8_t *media_tag, const int64_t *extra_pages,
                             const uint8_t *extra_digests, size_t n_extras, size_t first_page, uint8_t *out) {
    const size_t longest = FLOWRT_TAG + FLOWRT_DIGEST + 4 * page_tokens + FLOWRT_DIGEST;
    const size_t padded = (longest + FLOWRT_B2B_BLOCK - 1) / FLOWRT_B2B_BLOCK * FLOWRT_B2B_BLOCK;
    uint64_t stack[2 * FLOWRT_B2B_BLOCK / 8];
    uint8_t *buf = (uint8_t *)stack;
    if (padded > sizeof(stack)) {
        buf = (uint8_t *)malloc(padded); /* malloc's memory is aligned for uint64_t */
        if (buf == NULL) return -1;
    }
    memset(buf, 0, padded);
    memcpy(buf, page_tag, FLOWRT_TAG);
    memcpy(buf + FLOWRT_TAG, parent, FLOWRT_DIGEST);
#if FLOWRT_HAVE_SSSE3
    if (flowrt_simd)
        flowrt_chain_ssse3(tokens, page_tokens, n_pages, buf, page_tag, media_tag, extra_pages, extra_digests, n_extras,
                           first_page, out);
    else
#endif
        flowrt_chain_portable(tokens, page_tokens, n_pages, buf, page_tag, media_tag, extra_pages, extra_digests,
                              n_extras, first_page, out);
    if (buf != (uint8_t *)stack) free(buf);
    return 0;
}

/* Checks n tokens of a native-order integer buffer (itemsize 1, 2, 4 or 8; signed or not) and
 * writes them as uint32 to dst. Returns -1 when all fit in [0, 2^32), else the index of the
 * first that does not. */
static Py_ssize_t flowrt_tokens_u32(const void *src, int is_signed, int itemsize, size_t n, uint32_t *dst) {
#define FLOWRT_COPY(type, check)                              \
    do {                                                      \
        const type *p = (const type *)src;                    \
        for (size_t i = 0; i < n; i++) {                      \
            if (!(check)) return (Py_ssize_t)i;               \
            dst[i] = (uint32_t)p[i];                          \
        }                                                     \
    } while (0)
    if (is_signed) {
        switch (itemsize) {
        case 1: FLOWRT_COPY(int8_t, p[i] >= 0); break;
        case 2: FLOWRT_COPY(int16_t, p[i] >= 0); break;
        case 4: FLOWRT_COPY(int32_t, p[i] >= 0); break;
        default: FLOWRT_COPY(int64_t, p[i] >= 0 && p[i] <= (int64_t)0xFFFFFFFFLL); break;
        }
    } else {
        switch (itemsize) {
        case 1: FLOWRT_COPY(uint8_t, 1); break;
        case 2: FLOWRT_COPY(uint16_t, 1); break;
        case 4: memcpy(dst, src, n * 4); break;
        default: FLOWRT_COPY(uint64_t, p[i] <= 0xFFFFFFFFULL); break;
        }
    }
#undef FLOWRT_COPY
    return -1;
}

/* Whether `item` is an exact int of one machine word in [0, 2^32), read straight from its
 * digits (what nearly every token id is); it stores the value in *value. The C API call this
 * saves costs more than the rest of the conversion. Anything else goes the general way. */
FLOWRT_INLINE int flowrt_small_int(PyObject *item, uint32_t *value) {
    if (!PyLong_CheckExact(item)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)item)) return 0;
    Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)item);
    if (v < 0 || (uint64_t)v > 0xFFFFFFFFULL) return 0;
    *value = (uint32_t)v;
    return 1;
#else
    const Py_ssize_t size = Py_SIZE(item);
    const digit *digits = ((PyLongObject *)item)->ob_digit;
    if (size == 0 || size == 1) {
        *value = size ? (uint32_t)digits[0] : 0;
        return 1;
    }
    if (size == 2) {
        const uint64_t v = (uint64_t)digits[0] | ((uint64_t)digits[1] << PyLong_SHIFT);
        if (v > 0xFFFFFFFFULL) return 0;
        *value = (uint32_t)v;
        return 1;
    }
    return 0;
#endif
}

/* Items start..start+n-1 of a list of Python ints as uint32 (with the GIL; the list holds
 * them). Returns -1 when all are ints in [0, 2^32), else the index (from start) of the first
 * that is not; any Python error it raised is cleared: the caller reports the bad token itself. */
static Py_ssize_t flowrt_list_u32(PyObject *list, Py_ssize_t start, Py_ssize_t n, uint32_t *dst) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (start + i >= PyList_GET_SIZE(list)) return i; /* an __index__ below shortened it */
        PyObject *item = PyList_GET_ITEM(list, start + i);
        int overflow = 0;
        long long value;
        if (flowrt_small_int(item, &dst[i])) continue;
        if (PyLong_Check(item)) {
            value = PyLong_AsLongLongAndOverflow(item, &overflow);
        } else {
            Py_INCREF(item); /* numpy integers: their __index__ is Python code, which may change the list */
            PyObject *index = PyNumber_Index(item);
            Py_DECREF(item);
            if (index == NULL) {
                PyErr_Clear();
                return i;
            }
            value = PyLong_AsLongLongAndOverflow(index, &overflow);
            Py_DECREF(index);
        }
        if (overflow || value < 0 || value > 0xFFFFFFFFLL) {
            PyErr_Clear();
            return i;
        }
        dst[i] = (uint32_t)value;
    }
    return -1;
}

/* The 32 lowercase hex digits of a 16-byte digest. */
#if defined(__SSE2__) /* every x86-64 CPU */
#include <emmintrin.h>
FLOWRT_INLINE void flowrt_hex16(char *dst, const uint8_t *d) {
    const __m128i x = _mm_loadu_si128((const __m128i *)d);
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), nibble), lo = _mm_and_si128(x, nibble);
    const __m128i first = _mm_unpacklo_epi8(hi, lo), second = _mm_unpackhi_epi8(hi, lo); /* one nibble a byte, in order */
    /* nibble n -> '0' + n, and 'a' - '0' - 10 = 39 more where n > 9 */
    const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9), gap = _mm_set1_epi8('a' - '0' - 10);
    _mm_storeu_si128((__m128i *)dst, _mm_add_epi8(_mm_add_epi8(first, zero), _mm_and_si128(_mm_cmpgt_epi8(first, nine), gap)));
    _mm_storeu_si128((__m128i *)(dst + 16),
                     _mm_add_epi8(_mm_add_epi8(second, zero), _mm_and_si128(_mm_cmpgt_epi8(second, nine), gap)));
}
#else
FLOWRT_INLINE void flowrt_hex16(char *dst, const uint8_t *d) {
    static const char digits[] = "0123456789abcdef";
    for (int j = 0; j < FLOWRT_DIGEST; j++) {
        dst[2 * j] = digits[d[j] >> 4];
        dst[2 * j + 1] = digits[d[j] & 15];
    }
}
#endif

/* A list of n str, each the 32 lowercase hex digits of one 16-byte digest (with the GIL). */
static PyObject *flowrt_hex_list(const uint8_t *digests, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_New(2 * FLOWRT_DIGEST, 127);
        if (s == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        flowrt_hex16((char *)PyUnicode_1BYTE_DATA(s), digests + FLOWRT_DIGEST * i);
        PyList_SET_ITEM(list, i, s);
    }
    return list;
}

#endif /* FLOWRT_PAGEHASH_H */
