/* Internals shared by the native proposers: budgeted allocation and hashing. */
#ifndef ES_INTERNAL_H
#define ES_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "es_native.h"

/* Every allocation goes through these so that the byte budget covers all of
 * an object's memory, and so that tests can make any allocation fail. */
void *es_alloc(size_t bytes);
void *es_calloc(size_t n, size_t size);
void es_free(void *p);

/* Multiplies without overflow; returns 0 (and leaves *out alone) if it would. */
static inline int es_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* One step of an order-sensitive hash over token ids. */
static inline uint64_t es_hash_step(uint64_t h, int32_t tok) {
    h ^= (uint64_t)(uint32_t)tok;
    h *= 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 31);
}

/* splitmix64's finaliser: spreads every input bit over the table index. */
static inline uint64_t es_hash_final(uint64_t h) {
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

/* A per-object hash seed, so that an adversarial token stream cannot be
 * prepared once to collide in every index. Never changes any result. */
uint64_t es_fresh_seed(const void *obj);

/* Whether `extra` more bytes keep an object at `used` bytes within its budget. */
static inline int es_fits(size_t used, size_t extra, int64_t max_bytes) {
    return (uint64_t)used + (uint64_t)extra <= (uint64_t)max_bytes;
}

/* A valid order range 1 <= min_n <= max_n <= top and a positive budget. */
static inline int es_orders_ok(int32_t min_n, int32_t max_n, int32_t top, int64_t max_bytes) {
    return min_n >= 1 && max_n >= min_n && max_n <= top && max_bytes > 0;
}

/* Empties a draft; ES_E_ARG if its buffers cannot take max_tokens. */
es_status es_draft_reset(es_draft *out, int32_t max_tokens);

/* Formats an integrity-check failure into msg and returns ES_E_CORRUPT. */
es_status es_fail(char *msg, size_t cap, const char *fmt, ...);

#endif
