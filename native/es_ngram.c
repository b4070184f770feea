/* Prompt-lookup n-gram index: one open-addressing table maps every n-gram of
 * the stream (min_n <= n <= max_n) to the end of its most recent occurrence.
 *
 * The n-grams that end at the stream's current end are not in the table yet:
 * they go in when the next token arrives. So a lookup of the stream's own
 * trailing n-gram finds its most recent *earlier* occurrence directly. */
#include <string.h>

#include "es_internal.h"

typedef struct {
    uint64_t key;  /* hash of the n-gram (seeded) */
    int32_t end;   /* one past the n-gram's most recent earlier occurrence */
    int32_t n;     /* the n-gram's order; 0 marks an empty slot */
} ngram_slot;

struct es_ngram {
    int32_t min_n, max_n;
    int64_t max_bytes;
    size_t bytes;       /* all live allocations of this object, the struct included */
    uint64_t seed;

    int32_t *toks;      /* the stream */
    int64_t len, cap;

    ngram_slot *slots;  /* capacity a power of two, at most 3/4 full */
    uint64_t mask;
    int64_t used;
};

#define NGRAM_MIN_TOKS 256
#define NGRAM_MIN_SLOTS 1024

/* Largest index the int32 positions can hold. */
#define NGRAM_MAX_LEN ((int64_t)INT32_MAX - 1)

static int fits(const es_ngram *ix, size_t extra) { return es_fits(ix->bytes, extra, ix->max_bytes); }

es_status es_ngram_create(const es_ngram_config *cfg, es_ngram **out) {
    if (out == NULL) return ES_E_ARG;
    *out = NULL;
    if (cfg == NULL || !es_orders_ok(cfg->min_n, cfg->max_n, ES_MAX_NGRAM, cfg->max_bytes)) return ES_E_ARG;
    size_t need = sizeof(es_ngram) + NGRAM_MIN_TOKS * sizeof(int32_t) +
                  NGRAM_MIN_SLOTS * sizeof(ngram_slot);
    if ((uint64_t)need > (uint64_t)cfg->max_bytes) return ES_E_FULL;
    es_ngram *ix = es_calloc(1, sizeof(*ix));
    if (ix == NULL) return ES_E_NOMEM;
    ix->toks = es_alloc(NGRAM_MIN_TOKS * sizeof(int32_t));
    ix->slots = es_calloc(NGRAM_MIN_SLOTS, sizeof(ngram_slot));
    if (ix->toks == NULL || ix->slots == NULL) {
        es_ngram_destroy(ix);
        return ES_E_NOMEM;
    }
    ix->min_n = cfg->min_n;
    ix->max_n = cfg->max_n;
    ix->max_bytes = cfg->max_bytes;
    ix->bytes = need;
    ix->seed = es_fresh_seed(ix);
    ix->cap = NGRAM_MIN_TOKS;
    ix->mask = NGRAM_MIN_SLOTS - 1;
    *out = ix;
    return ES_OK;
}

void es_ngram_destroy(es_ngram *ix) {
    if (ix == NULL) return;
    es_free(ix->toks);
    es_free(ix->slots);
    es_free(ix);
}

int64_t es_ngram_length(const es_ngram *ix) { return ix ? ix->len : 0; }
size_t es_ngram_memory(const es_ngram *ix) { return ix ? ix->bytes : 0; }

/* Hashes of the n-grams ending at `end`, for n = 1..nmax, into h[1..nmax]. */
static void ngram_hashes(const es_ngram *ix, int64_t end, int32_t nmax, uint64_t *h) {
    uint64_t acc = ix->seed;
    for (int32_t n = 1; n <= nmax; n++) {
        acc = es_hash_step(acc, ix->toks[end - n]);
        h[n] = acc;
    }
}

static int same_ngram(const es_ngram *ix, int64_t end_a, int64_t end_b, int32_t n) {
    return memcmp(ix->toks + end_a - n, ix->toks + end_b - n, (size_t)n * sizeof(int32_t)) == 0;
}

/* Slot holding the n-gram that ends at `end` (hash key), or its empty slot. */
static ngram_slot *find_slot(const es_ngram *ix, ngram_slot *slots, uint64_t mask, uint64_t key,
                             int32_t n, int64_t end) {
    uint64_t i = es_hash_final(key) & mask;
    for (;;) {
        ngram_slot *s = &slots[i];
        if (s->n == 0) return s;
        if (s->key == key && s->n == n && same_ngram(ix, s->end, end, n)) return s;
        i = (i + 1) & mask;
    }
}

static es_status grow_slots(es_ngram *ix) {
    uint64_t old_cap = ix->mask + 1;
    if (old_cap > ((uint64_t)1 << 40)) return ES_E_FULL;
    uint64_t new_cap = old_cap * 2;
    size_t bytes;
    if (!es_mul_size((size_t)new_cap, sizeof(ngram_slot), &bytes)) return ES_E_FULL;
    if (!fits(ix, bytes)) return ES_E_FULL;  /* old and new coexist while rehashing */
    ngram_slot *fresh = es_calloc((size_t)new_cap, sizeof(ngram_slot));
    if (fresh == NULL) return ES_E_NOMEM;
    for (uint64_t i = 0; i < old_cap; i++) {
        ngram_slot *s = &ix->slots[i];
        if (s->n == 0) continue;
        uint64_t j = es_hash_final(s->key) & (new_cap - 1);
        while (fresh[j].n != 0) j = (j + 1) & (new_cap - 1);
        fresh[j] = *s;
    }
    es_free(ix->slots);
    ix->slots = fresh;
    ix->mask = new_cap - 1;
    ix->bytes = ix->bytes - (size_t)old_cap * sizeof(ngram_slot) + bytes;
    return ES_OK;
}

static es_status grow_toks(es_ngram *ix) {
    if (ix->cap >= NGRAM_MAX_LEN) return ES_E_FULL;
    int64_t want = ix->cap * 2;
    if (want > NGRAM_MAX_LEN) want = NGRAM_MAX_LEN;
    /* Near the budget, grow only as far as it allows (the old copy counts too). */
    uint64_t room = (uint64_t)ix->max_bytes > ix->bytes ? (uint64_t)ix->max_bytes - ix->bytes : 0;
    if ((uint64_t)want * sizeof(int32_t) > room) want = (int64_t)(room / sizeof(int32_t));
    if (want <= ix->cap) return ES_E_FULL;
    int32_t *fresh = es_alloc((size_t)want * sizeof(int32_t));
    if (fresh == NULL) return ES_E_NOMEM;
    memcpy(fresh, ix->toks, (size_t)ix->len * sizeof(int32_t));
    es_free(ix->toks);
    ix->toks = fresh;
    ix->bytes = ix->bytes - (size_t)ix->cap * sizeof(int32_t) + (size_t)want * sizeof(int32_t);
    ix->cap = want;
    return ES_OK;
}

/* Records the n-grams ending at the current end (they become "earlier"). */
static void index_tail(es_ngram *ix) {
    int64_t end = ix->len;
    int32_t nmax = ix->max_n < end ? ix->max_n : (int32_t)end;
    if (nmax < ix->min_n) return;
    uint64_t h[ES_MAX_NGRAM + 1];
    ngram_hashes(ix, end, nmax, h);
    for (int32_t n = ix->min_n; n <= nmax; n++) {
        ngram_slot *s = find_slot(ix, ix->slots, ix->mask, h[n], n, end);
        if (s->n == 0) {
            s->key = h[n];
            s->n = n;
            ix->used++;
        }
        s->end = (int32_t)end;
    }
}

es_status es_ngram_extend(es_ngram *ix, const int32_t *tokens, int64_t n) {
    if (ix == NULL || n < 0 || (tokens == NULL && n > 0)) return ES_E_ARG;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0) return ES_E_RANGE;
    int64_t per_token = ix->max_n - ix->min_n + 1;
    for (int64_t i = 0; i < n; i++) {
        /* Make room first, so that a token is either fully indexed or not at all. */
        if (ix->len >= NGRAM_MAX_LEN) return ES_E_FULL;
        if (ix->len == ix->cap) {
            es_status st = grow_toks(ix);
            if (st != ES_OK) return st;
        }
        while ((uint64_t)(ix->used + per_token) * 4 > (ix->mask + 1) * 3) {
            es_status st = grow_slots(ix);
            if (st != ES_OK) return st;
        }
        index_tail(ix);
        ix->toks[ix->len++] = tokens[i];
    }
    return ES_OK;
}

es_status es_ngram_propose(const es_ngram *ix, int32_t k, int32_t *out, int32_t *out_n,
                           int32_t *match_n) {
    if (ix == NULL || out_n == NULL || match_n == NULL || k < 0 || k > ES_MAX_DRAFT ||
        (out == NULL && k > 0))
        return ES_E_ARG;
    *out_n = 0;
    *match_n = 0;
    int64_t len = ix->len;
    if (k == 0 || len < 2) return ES_OK;
    /* An earlier occurrence of n tokens needs len >= n + 1. */
    int32_t nmax = ix->max_n < len - 1 ? ix->max_n : (int32_t)(len - 1);
    if (nmax < ix->min_n) return ES_OK;
    uint64_t h[ES_MAX_NGRAM + 1];
    ngram_hashes(ix, len, nmax, h);
    for (int32_t n = nmax; n >= ix->min_n; n--) {
        const ngram_slot *s = find_slot(ix, ix->slots, ix->mask, h[n], n, len);
        if (s->n == 0) continue;
        int64_t e = s->end;
        for (int32_t i = 0; i < k; i++) {
            int64_t src = e + i;
            /* past the end, the continuation repeats the draft (period len - e) */
            out[i] = src < len ? ix->toks[src] : out[src - len];
        }
        *out_n = k;
        *match_n = n;
        return ES_OK;
    }
    return ES_OK;
}

es_status es_ngram_check(const es_ngram *ix, int deep, char *msg, size_t msg_cap) {
    if (ix == NULL) return ES_E_ARG;
    if (ix->len < 0 || ix->len > ix->cap) return es_fail(msg, msg_cap, "len %lld > cap", (long long)ix->len);
    size_t bytes = sizeof(es_ngram) + (size_t)ix->cap * sizeof(int32_t) +
                   (size_t)(ix->mask + 1) * sizeof(ngram_slot);
    if (bytes != ix->bytes) return es_fail(msg, msg_cap, "byte count %zu, expected %zu", ix->bytes, bytes);
    if ((int64_t)ix->bytes > ix->max_bytes) return es_fail(msg, msg_cap, "over budget");
    for (int64_t i = 0; i < ix->len; i++)
        if (ix->toks[i] < 0) return es_fail(msg, msg_cap, "negative token at %lld", (long long)i);
    int64_t used = 0;
    uint64_t h[ES_MAX_NGRAM + 1];
    for (uint64_t i = 0; i <= ix->mask; i++) {
        const ngram_slot *s = &ix->slots[i];
        if (s->n == 0) continue;
        used++;
        if (s->n < ix->min_n || s->n > ix->max_n)
            return es_fail(msg, msg_cap, "slot %llu has order %d", (unsigned long long)i, s->n);
        /* stored occurrences end strictly before the stream's end */
        if (s->end < s->n || s->end >= ix->len)
            return es_fail(msg, msg_cap, "slot %llu ends at %d (len %lld)", (unsigned long long)i,
                           s->end, (long long)ix->len);
        ngram_hashes(ix, s->end, s->n, h);
        if (h[s->n] != s->key) return es_fail(msg, msg_cap, "slot %llu has a stale key", (unsigned long long)i);
        if (find_slot(ix, ix->slots, ix->mask, s->key, s->n, s->end) != s)
            return es_fail(msg, msg_cap, "slot %llu is unreachable or duplicated", (unsigned long long)i);
    }
    if (used != ix->used) return es_fail(msg, msg_cap, "used %lld, counted %lld", (long long)ix->used, (long long)used);
    if ((uint64_t)used * 4 > (ix->mask + 1) * 3) return es_fail(msg, msg_cap, "table over-full");
    if (deep) {
        /* every earlier n-gram is indexed, at its latest occurrence or later */
        for (int64_t e = 1; e < ix->len; e++) {
            int32_t nmax = ix->max_n < e ? ix->max_n : (int32_t)e;
            if (nmax < ix->min_n) continue;
            ngram_hashes(ix, e, nmax, h);
            for (int32_t n = ix->min_n; n <= nmax; n++) {
                const ngram_slot *s = find_slot(ix, ix->slots, ix->mask, h[n], n, e);
                if (s->n == 0 || s->end < e)
                    return es_fail(msg, msg_cap, "%d-gram ending at %lld is not indexed", n, (long long)e);
            }
        }
    }
    return ES_OK;
}
