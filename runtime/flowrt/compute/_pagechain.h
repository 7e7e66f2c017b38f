/* The page-hash chain of _pagehash.h, once per compression function: a template.
 *
 * _pagehash.h includes this file once for each compression function, having defined
 *   FLOWRT_CHAIN(name)     the name of this copy's function `name` (e.g. name##_ssse3)
 *   FLOWRT_COMPRESS        its compression function (_blake2b.h)
 *   FLOWRT_CHAIN_INLINE    the attributes of its inlined helpers (a target, where the
 *   FLOWRT_CHAIN_ENTRY     compression function needs one) and of its entry point
 * and undefines them after. No include guard: that is the point.
 */

/* One page's digest: h = the BLAKE2b-128 state after the message of `len` bytes laid out in
 * buf (zero-padded to whole blocks), from the initial state h0. */
FLOWRT_CHAIN_INLINE void FLOWRT_CHAIN(flowrt_page_digest)(uint64_t h[8], const uint64_t h0[8], const uint8_t *buf, size_t len) {
    for (int j = 0; j < 8; j++) h[j] = h0[j];
    size_t done = 0;
    while (len - done > FLOWRT_B2B_BLOCK) {
        done += FLOWRT_B2B_BLOCK;
        FLOWRT_COMPRESS(h, buf + done - FLOWRT_B2B_BLOCK, (uint64_t)done, 0, 16);
    }
    /* where len is a constant (a page size of its own, below) so is the count of words before
     * the padding; elsewhere a count known only at run time would cost more than it saves */
    FLOWRT_COMPRESS(h, buf + done, (uint64_t)len, 1, FLOWRT_CONSTANT(len) ? (unsigned)((len - done + 7) / 8) : 16);
}

/* The chain for one page size; inlined with a constant page_tokens for the common sizes, so
 * the copies, lengths and block counts fold into the code. */
FLOWRT_CHAIN_INLINE void FLOWRT_CHAIN(flowrt_chain_pages)(const uint32_t *tokens, size_t page_tokens, size_t n_pages,
                                                          uint8_t *buf, const uint8_t *page_tag, const uint8_t *media_tag,
                                                          const int64_t *extra_pages, const uint8_t *extra_digests,
                                                          size_t n_extras, size_t first_page, uint8_t *out) {
    const size_t head = FLOWRT_TAG + FLOWRT_DIGEST;
    const size_t plain = head + 4 * page_tokens;
    uint64_t h0[8], h[8];
    for (int j = 0; j < 8; j++) h0[j] = flowrt_b2b_iv[j];
    h0[0] ^= 0x01010000ULL ^ FLOWRT_DIGEST;
    size_t next_extra = 0;
    for (size_t i = 0; i < n_pages; i++) {
        const uint32_t *page = tokens + i * page_tokens;
#if FLOWRT_LITTLE_ENDIAN
        memcpy(buf + head, page, 4 * page_tokens);
#else
        for (size_t j = 0; j < page_tokens; j++) {
            uint8_t *p = buf + head + 4 * j;
            p[0] = (uint8_t)page[j];
            p[1] = (uint8_t)(page[j] >> 8);
            p[2] = (uint8_t)(page[j] >> 16);
            p[3] = (uint8_t)(page[j] >> 24);
        }
#endif
        if (next_extra < n_extras && (size_t)extra_pages[next_extra] == first_page + i) {
            memcpy(buf, media_tag, FLOWRT_TAG);
            memcpy(buf + plain, extra_digests + FLOWRT_DIGEST * next_extra, FLOWRT_DIGEST);
            FLOWRT_CHAIN(flowrt_page_digest)(h, h0, buf, plain + FLOWRT_DIGEST);
            memset(buf + plain, 0, FLOWRT_DIGEST); /* back to padding */
            memcpy(buf, page_tag, FLOWRT_TAG);
            next_extra++;
        } else {
            FLOWRT_CHAIN(flowrt_page_digest)(h, h0, buf, plain);
        }
        flowrt_store64(out + FLOWRT_DIGEST * i, h[0]);
        flowrt_store64(out + FLOWRT_DIGEST * i + 8, h[1]);
        flowrt_store64(buf + FLOWRT_TAG, h[0]); /* the next page's parent */
        flowrt_store64(buf + FLOWRT_TAG + 8, h[1]);
    }
}

/* The entry point: flowrt_page_chain's arguments, and buf, the message buffer it laid out. */
FLOWRT_CHAIN_ENTRY void FLOWRT_CHAIN(flowrt_chain)(const uint32_t *tokens, size_t page_tokens, size_t n_pages, uint8_t *buf,
                                                   const uint8_t *page_tag, const uint8_t *media_tag,
                                                   const int64_t *extra_pages, const uint8_t *extra_digests,
                                                   size_t n_extras, size_t first_page, uint8_t *out) {
#define FLOWRT_PAGES(p)                                                                                                \
    FLOWRT_CHAIN(flowrt_chain_pages)(tokens, p, n_pages, buf, page_tag, media_tag, extra_pages, extra_digests, n_extras, \
                                     first_page, out)
    switch (page_tokens) { /* the usual page sizes get code of their own, with constant lengths */
    case 16: FLOWRT_PAGES(16); break;
    case 32: FLOWRT_PAGES(32); break;
    default: FLOWRT_PAGES(page_tokens); break;
    }
#undef FLOWRT_PAGES
}
