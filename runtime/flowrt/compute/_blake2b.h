/* BLAKE2b (RFC 7693) in C, for flowrt.compute's page hashing (_pagehash.h).
 *
 * Written from RFC 7693's description: the compression function F (section 3.2), the mixing
 * function G (3.1), the message schedule SIGMA (2.7) and the IV (2.6). The parameter block is
 * the default one: digest length nn, no key, fanout 1, depth 1 (h[0] ^= 0x01010000 ^ nn).
 * Two compression functions give the same results: a portable one, and one for x86 CPUs with
 * SSSE3 that runs G on two columns (then two diagonals) at once in 128-bit registers, about
 * 12% faster on the development machine; _pagehash.h picks one when the module loads.
 * hashlib.blake2b is the reference: tests/compute checks both against it.
 */
#ifndef FLOWRT_BLAKE2B_H
#define FLOWRT_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) /* and clang */
#define FLOWRT_INLINE static inline __attribute__((always_inline))
#define FLOWRT_NOINLINE static __attribute__((noinline)) /* a function of its own: registers to itself */
#define FLOWRT_CONSTANT(x) __builtin_constant_p(x)
#else
#define FLOWRT_CONSTANT(x) 0
#define FLOWRT_INLINE static inline
#define FLOWRT_NOINLINE static
#endif

#define FLOWRT_B2B_BLOCK 128

static const uint64_t flowrt_b2b_iv[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL,
};

/* SIGMA: round r uses row r mod 10 */
static const uint8_t flowrt_b2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FLOWRT_LITTLE_ENDIAN 1
#elif defined(_WIN32)
#define FLOWRT_LITTLE_ENDIAN 1
#else
#define FLOWRT_LITTLE_ENDIAN 0
#endif

FLOWRT_INLINE uint64_t flowrt_load64(const uint8_t *p) {
#if FLOWRT_LITTLE_ENDIAN
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
           (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
#endif
}

FLOWRT_INLINE void flowrt_store64(uint8_t *p, uint64_t v) {
#if FLOWRT_LITTLE_ENDIAN
    memcpy(p, &v, 8);
#else
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
#endif
}

FLOWRT_INLINE uint64_t flowrt_rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

/* G (RFC 7693 3.1): mixes two message words x, y into four words a, b, c, d of the working vector */
#define FLOWRT_G(a, b, c, d, x, y)         \
    do {                                   \
        a = a + b + (x);                   \
        d = flowrt_rotr64(d ^ a, 32);      \
        c = c + d;                         \
        b = flowrt_rotr64(b ^ c, 24);      \
        a = a + b + (y);                   \
        d = flowrt_rotr64(d ^ a, 16);      \
        c = c + d;                         \
        b = flowrt_rotr64(b ^ c, 63);      \
    } while (0)

/* message word SIGMA[r][i] of the block being compressed; words from `words` on are known to be
 * zero (the padding), and where `words` is a constant the compiler drops their additions */
#define FLOWRT_M(r, i) (flowrt_b2b_sigma[r][i] < words ? flowrt_load64(block + 8 * flowrt_b2b_sigma[r][i]) : 0)

/* one round: columns, then diagonals; r is a constant, so SIGMA folds into the offsets. The
 * working vector v[0..15] is sixteen locals (v0..v15) so the compiler keeps what it can in registers. */
#define FLOWRT_ROUND(r)                                                          \
    do {                                                                         \
        FLOWRT_G(v0, v4, v8, v12, FLOWRT_M(r, 0), FLOWRT_M(r, 1));               \
        FLOWRT_G(v1, v5, v9, v13, FLOWRT_M(r, 2), FLOWRT_M(r, 3));               \
        FLOWRT_G(v2, v6, v10, v14, FLOWRT_M(r, 4), FLOWRT_M(r, 5));              \
        FLOWRT_G(v3, v7, v11, v15, FLOWRT_M(r, 6), FLOWRT_M(r, 7));              \
        FLOWRT_G(v0, v5, v10, v15, FLOWRT_M(r, 8), FLOWRT_M(r, 9));              \
        FLOWRT_G(v1, v6, v11, v12, FLOWRT_M(r, 10), FLOWRT_M(r, 11));            \
        FLOWRT_G(v2, v7, v8, v13, FLOWRT_M(r, 12), FLOWRT_M(r, 13));             \
        FLOWRT_G(v3, v4, v9, v14, FLOWRT_M(r, 14), FLOWRT_M(r, 15));             \
    } while (0)

/* F (RFC 7693 3.2): compresses one 128-byte block into the state h; t counts the bytes hashed
 * so far including this block (messages here are far below 2^64 bytes: its high word is 0).
 * The block's words from `words` on are zero: callers that do not know which pass 16. */
FLOWRT_INLINE void flowrt_b2b_compress(uint64_t h[8], const uint8_t *block, uint64_t t, int last, unsigned words) {
    const uint64_t *iv = flowrt_b2b_iv;
    uint64_t v0 = h[0], v1 = h[1], v2 = h[2], v3 = h[3], v4 = h[4], v5 = h[5], v6 = h[6], v7 = h[7];
    uint64_t v8 = iv[0], v9 = iv[1], v10 = iv[2], v11 = iv[3];
    uint64_t v12 = iv[4] ^ t, v13 = iv[5], v14 = last ? ~iv[6] : iv[6], v15 = iv[7];
    FLOWRT_ROUND(0);
    FLOWRT_ROUND(1);
    FLOWRT_ROUND(2);
    FLOWRT_ROUND(3);
    FLOWRT_ROUND(4);
    FLOWRT_ROUND(5);
    FLOWRT_ROUND(6);
    FLOWRT_ROUND(7);
    FLOWRT_ROUND(8);
    FLOWRT_ROUND(9);
    FLOWRT_ROUND(10);
    FLOWRT_ROUND(11);
    h[0] ^= v0 ^ v8;
    h[1] ^= v1 ^ v9;
    h[2] ^= v2 ^ v10;
    h[3] ^= v3 ^ v11;
    h[4] ^= v4 ^ v12;
    h[5] ^= v5 ^ v13;
    h[6] ^= v6 ^ v14;
    h[7] ^= v7 ^ v15;
}

/* F again, for x86 CPUs with SSSE3 (the caller checks the CPU has it). The working vector's
 * rows (v0..v3, v4..v7, v8..v11, v12..v15) lie in two registers each, lo and hi, two words a
 * register: one G2 runs G on the two columns (or diagonals) of a register at once. Before the
 * diagonal step rows b, c and d turn left by one, two and three words, so that the diagonals
 * (v0, v5, v10, v15)... line up as columns; after it they turn back. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FLOWRT_HAVE_SSSE3 1
#include <tmmintrin.h>
#define FLOWRT_SSSE3 static inline __attribute__((always_inline, target("ssse3")))

/* one register of each row: G on its two words, message words x and y */
FLOWRT_SSSE3 void flowrt_g2(__m128i *a, __m128i *b, __m128i *c, __m128i *d, __m128i x, __m128i y) {
    const __m128i rot24 = _mm_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10);
    const __m128i rot16 = _mm_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9);
    *a = _mm_add_epi64(_mm_add_epi64(*a, x), *b);
    *d = _mm_shuffle_epi32(_mm_xor_si128(*d, *a), _MM_SHUFFLE(2, 3, 0, 1)); /* rotr 32 */
    *c = _mm_add_epi64(*c, *d);
    *b = _mm_shuffle_epi8(_mm_xor_si128(*b, *c), rot24);
    *a = _mm_add_epi64(_mm_add_epi64(*a, y), *b);
    *d = _mm_shuffle_epi8(_mm_xor_si128(*d, *a), rot16);
    *c = _mm_add_epi64(*c, *d);
    *b = _mm_xor_si128(*b, *c);
    *b = _mm_xor_si128(_mm_srli_epi64(*b, 63), _mm_add_epi64(*b, *b)); /* rotr 63 = rotl 1 */
}

/* (the high word of lo, the low word of hi) */
FLOWRT_SSSE3 __m128i flowrt_across(__m128i lo, __m128i hi) { return _mm_alignr_epi8(hi, lo, 8); }

/* message words SIGMA[r][i] (low) and SIGMA[r][j] (high); the padding (from `words` on) is zero */
#define FLOWRT_M2(r, i, j) _mm_set_epi64x((long long)FLOWRT_M(r, j), (long long)FLOWRT_M(r, i))

#define FLOWRT_ROUND2(r)                                                                   \
    do {                                                                                   \
        __m128i t0, t1;                                                                    \
        flowrt_g2(&al, &bl, &cl, &dl, FLOWRT_M2(r, 0, 2), FLOWRT_M2(r, 1, 3));             \
        flowrt_g2(&ah, &bh, &ch, &dh, FLOWRT_M2(r, 4, 6), FLOWRT_M2(r, 5, 7));             \
        t0 = flowrt_across(bl, bh), t1 = flowrt_across(bh, bl), bl = t0, bh = t1;         \
        t0 = cl, cl = ch, ch = t0;                                                         \
        t0 = flowrt_across(dh, dl), t1 = flowrt_across(dl, dh), dl = t0, dh = t1;         \
        flowrt_g2(&al, &bl, &cl, &dl, FLOWRT_M2(r, 8, 10), FLOWRT_M2(r, 9, 11));           \
        flowrt_g2(&ah, &bh, &ch, &dh, FLOWRT_M2(r, 12, 14), FLOWRT_M2(r, 13, 15));         \
        t0 = flowrt_across(bh, bl), t1 = flowrt_across(bl, bh), bl = t0, bh = t1;         \
        t0 = cl, cl = ch, ch = t0;                                                         \
        t0 = flowrt_across(dl, dh), t1 = flowrt_across(dh, dl), dl = t0, dh = t1;         \
    } while (0)

FLOWRT_SSSE3 void flowrt_b2b_compress_ssse3(uint64_t h[8], const uint8_t *block, uint64_t t, int last, unsigned words) {
    const __m128i *state = (const __m128i *)h, *iv = (const __m128i *)flowrt_b2b_iv;
    __m128i al = _mm_loadu_si128(state), ah = _mm_loadu_si128(state + 1);
    __m128i bl = _mm_loadu_si128(state + 2), bh = _mm_loadu_si128(state + 3);
    __m128i cl = _mm_loadu_si128(iv), ch = _mm_loadu_si128(iv + 1);
    __m128i dl = _mm_xor_si128(_mm_loadu_si128(iv + 2), _mm_set_epi64x(0, (long long)t));
    __m128i dh = _mm_xor_si128(_mm_loadu_si128(iv + 3), _mm_set_epi64x(0, last ? -1LL : 0));
    FLOWRT_ROUND2(0);
    FLOWRT_ROUND2(1);
    FLOWRT_ROUND2(2);
    FLOWRT_ROUND2(3);
    FLOWRT_ROUND2(4);
    FLOWRT_ROUND2(5);
    FLOWRT_ROUND2(6);
    FLOWRT_ROUND2(7);
    FLOWRT_ROUND2(8);
    FLOWRT_ROUND2(9);
    FLOWRT_ROUND2(10);
    FLOWRT_ROUND2(11);
    __m128i *out = (__m128i *)h;
    _mm_storeu_si128(out, _mm_xor_si128(_mm_loadu_si128(out), _mm_xor_si128(al, cl)));
    _mm_storeu_si128(out + 1, _mm_xor_si128(_mm_loadu_si128(out + 1), _mm_xor_si128(ah, ch)));
    _mm_storeu_si128(out + 2, _mm_xor_si128(_mm_loadu_si128(out + 2), _mm_xor_si128(bl, dl)));
    _mm_storeu_si128(out + 3, _mm_xor_si128(_mm_loadu_si128(out + 3), _mm_xor_si128(bh, dh)));
}
#else
#define FLOWRT_HAVE_SSSE3 0
#endif

/* The digest (first nn bytes of the state) of a message already laid out in `buf`, which holds
 * its `len` bytes (len >= 1) followed by zeros up to a multiple of 128 bytes. */
static void flowrt_b2b_padded(uint8_t *out, size_t nn, const uint8_t *buf, size_t len) {
    uint64_t h[8];
    uint8_t word[8];
    for (int i = 0; i < 8; i++) h[i] = flowrt_b2b_iv[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)nn;
    size_t done = 0;
    while (len - done > FLOWRT_B2B_BLOCK) {
        done += FLOWRT_B2B_BLOCK;
        flowrt_b2b_compress(h, buf + done - FLOWRT_B2B_BLOCK, (uint64_t)done, 0, 16);
    }
    flowrt_b2b_compress(h, buf + done, (uint64_t)len, 1, 16);
    for (size_t i = 0; i < nn; i += 8) {
        flowrt_store64(word, h[i / 8]);
        memcpy(out + i, word, nn - i < 8 ? nn - i : 8);
    }
}

/* BLAKE2b-nn of any message (1 <= nn <= 64), portable: for the tests' direct check against hashlib. */
static int flowrt_blake2b(uint8_t *out, size_t nn, const uint8_t *msg, size_t len) {
    size_t padded = len == 0 ? FLOWRT_B2B_BLOCK : (len + FLOWRT_B2B_BLOCK - 1) / FLOWRT_B2B_BLOCK * FLOWRT_B2B_BLOCK;
    uint8_t *buf = (uint8_t *)calloc(padded, 1);
    if (buf == NULL) return -1;
    if (len) memcpy(buf, msg, len);
    flowrt_b2b_padded(out, nn, buf, len); /* an empty message: one zero block with t = 0 */
    free(buf);
    return 0;
}

#endif /* FLOWRT_BLAKE2B_H */
