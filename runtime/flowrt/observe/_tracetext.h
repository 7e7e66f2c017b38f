/* The text flowrt.observe._tracewriter writes a trace into: a C buffer that grows by doubling,
   and its writes. They are inline, so a literal's length is known when compiled and its copy is
   a few moves; numbers are written from whole integers, so no float is ever formatted. */
#ifndef FLOWRT_TRACETEXT_H
#define FLOWRT_TRACETEXT_H

#include <stdlib.h>
#include <string.h>

typedef struct { char *data; Py_ssize_t size; Py_ssize_t capacity; } flowrt_text;

static int flowrt_grow(flowrt_text *text, Py_ssize_t more) {
    Py_ssize_t capacity = text->capacity ? text->capacity : 8192;
    char *data;
    while (capacity < text->size + more) capacity *= 2;
    data = (char *)realloc(text->data, (size_t)capacity);
    if (data == NULL) { PyErr_NoMemory(); return -1; }
    text->data = data;
    text->capacity = capacity;
    return 0;
}

static inline __attribute__((always_inline)) int flowrt_put(flowrt_text *text, const char *chars, Py_ssize_t n) {
    if (text->size + n > text->capacity && flowrt_grow(text, n) < 0) return -1;
    memcpy(text->data + text->size, chars, (size_t)n);
    text->size += n;
    return 0;
}

static inline __attribute__((always_inline)) int flowrt_lit(flowrt_text *text, const char *chars) {
    return flowrt_put(text, chars, (Py_ssize_t)strlen(chars));
}

/* `value` in decimal, ending just before `end`; returns where it starts (20 characters at most). */
static inline char *flowrt_decimal(char *end, long long value) {
    unsigned long long magnitude = value < 0 ? (unsigned long long)(-(value + 1)) + 1 : (unsigned long long)value;
    do { *--end = (char)('0' + magnitude % 10); magnitude /= 10; } while (magnitude);
    if (value < 0) *--end = '-';
    return end;
}

static int flowrt_put_int(flowrt_text *text, long long value) {
    char digits[24];
    char *at = flowrt_decimal(digits + 24, value);
    return flowrt_put(text, at, digits + 24 - at);
}

/* `value` / 1000 as a JSON number: the decimal digits of the float `value / 1e3` as msgspec
   writes them ("12.345", "12.5", "12.0", "-0.005"). */
static int flowrt_put_thousandths(flowrt_text *text, long long value) {
    char digits[40];
    unsigned long long magnitude = value < 0 ? (unsigned long long)(-(value + 1)) + 1 : (unsigned long long)value;
    unsigned rest = (unsigned)(magnitude % 1000);
    char *at = digits + 28, *end = digits + 32;
    digits[28] = '.';
    digits[29] = (char)('0' + rest / 100);
    digits[30] = (char)('0' + rest / 10 % 10);
    digits[31] = (char)('0' + rest % 10);
    while (end > digits + 30 && end[-1] == '0') end--;  /* (one digit after the point at least) */
    at = flowrt_decimal(at, (long long)(magnitude / 1000));  /* (its magnitude: "-0.005" gets its sign below) */
    if (value < 0) *--at = '-';
    return flowrt_put(text, at, end - at);
}

#endif
