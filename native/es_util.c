/* Allocation with fault injection, hash seeds, status strings. */
#include <stdio.h>
#include <stdlib.h>

#include "es_internal.h"

/* Countdown to an injected allocation failure; negative means never. Only
 * the fault-injection tests touch it, from one thread. */
static int64_t fail_countdown = -1;

void es_debug_fail_alloc_after(int64_t n) { fail_countdown = n; }

static int should_fail(void) {
    if (fail_countdown < 0) return 0;
    if (fail_countdown == 0) {
        fail_countdown = -1;
        return 1;
    }
    fail_countdown--;
    return 0;
}

void *es_alloc(size_t bytes) {
    if (should_fail()) return NULL;
    return malloc(bytes ? bytes : 1);
}

void *es_calloc(size_t n, size_t size) {
    if (should_fail()) return NULL;
    if (n == 0 || size == 0) return calloc(1, 1);
    return calloc(n, size);
}

void es_free(void *p) { free(p); }

uint64_t es_fresh_seed(const void *obj) {
    static uint64_t counter = 0x243F6A8885A308D3ULL;
    counter += 0x9E3779B97F4A7C15ULL;
    return es_hash_final(counter ^ (uint64_t)(uintptr_t)obj);
}

es_status es_fail(char *msg, size_t cap, const char *fmt, ...) {
    if (msg != NULL && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return ES_E_CORRUPT;
}

es_status es_draft_reset(es_draft *out, int32_t max_tokens) {
    if (out == NULL || (max_tokens > 0 && (out->tokens == NULL || out->probs == NULL))) return ES_E_ARG;
    out->n = 0;
    out->match_len = 0;
    out->score = 0.0;
    out->source = ES_SRC_NONE;
    return ES_OK;
}

const char *es_strerror(es_status st) {
    switch (st) {
    case ES_OK: return "ok";
    case ES_E_ARG: return "invalid argument";
    case ES_E_RANGE: return "token id out of range (must be >= 0)";
    case ES_E_NOMEM: return "out of memory";
    case ES_E_FULL: return "memory budget exhausted";
    case ES_E_STATE: return "operation does not fit the object's state";
    case ES_E_CORRUPT: return "integrity check failed";
    }
    return "unknown status";
}
