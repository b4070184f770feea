/* N-gram statistics: for each n-gram, how often each token followed it.
 *
 * Two open-addressing tables with linear probing and backward-shift deletion
 * (no tombstones, so probe chains stay short after a decay):
 *   - `gidx` maps an n-gram to its entry in the dense `grams` array, which
 *     keeps the totals and the most frequent continuation (updated in O(1) as
 *     counts rise: only the incremented token can overtake the best);
 *   - `pairs` maps (n-gram entry, token) to a count.
 * Entry indices never move (freed entries go on a free list), so pairs can
 * refer to them across rehashes. Everything is reserved before a token is
 * counted, so a token is counted for all its orders or not at all. */
#include <string.h>

#include "es_internal.h"

typedef struct {
    int32_t tok[ES_NGSTAT_MAX_N]; /* the n-gram, oldest first; zeros past its order */
    uint64_t hash;                /* seeded hash of (order, tokens) */
    uint32_t total;               /* sum of its pairs' counts */
    uint32_t best_count;
    int32_t best;                 /* most frequent continuation; on a free entry: next free + 1 */
    int32_t order;                /* 0 marks a free entry */
} gram_t;

typedef struct {
    uint32_t gram;  /* 1 + entry index; 0 marks an empty slot */
    int32_t tok;
    uint32_t count;
} pair_t;

/* A linear-probing table whose slots start with a uint32 that is 0 when empty;
 * capacity a power of two, at most 3/4 full. */
typedef struct {
    void *slots;
    uint64_t mask;
} table_t;

struct es_ngstat {
    int32_t min_n, max_n;
    int64_t max_bytes;
    size_t bytes;  /* all live allocations, the struct included */
    uint64_t seed;
    int64_t decays;

    int32_t hist[ES_NGSTAT_MAX_N];  /* the current sequence's last tokens, oldest first */
    int32_t hist_len;

    gram_t *grams;
    uint32_t grams_cap, grams_hw;  /* entries allocated / ever used */
    uint32_t free_head;            /* 1 + first free entry below grams_hw; 0: none */
    int64_t n_free, n_grams;       /* free entries below grams_hw / live entries */

    table_t gidx;   /* uint32_t slots: 1 + entry index, 0 empty */
    table_t pairs;  /* pair_t slots */
    int64_t n_pairs;
};

/* The typed views of the two tables. */
static uint32_t *gslots(const es_ngstat *s) { return s->gidx.slots; }
static pair_t *pslots(const es_ngstat *s) { return s->pairs.slots; }

#define MIN_GRAMS 64
#define MIN_SLOTS 128
#define MAX_GRAMS ((uint32_t)INT32_MAX)
#define MAX_SLOTS ((uint64_t)1 << 36)

static size_t bytes_for(uint64_t grams, uint64_t gslots, uint64_t pslots) {
    return sizeof(es_ngstat) + grams * sizeof(gram_t) + gslots * sizeof(uint32_t) +
           pslots * sizeof(pair_t);
}

static int fits(const es_ngstat *s, size_t extra) { return es_fits(s->bytes, extra, s->max_bytes); }

es_status es_ngstat_create(const es_ngstat_config *cfg, es_ngstat **out) {
    if (out == NULL) return ES_E_ARG;
    *out = NULL;
    if (cfg == NULL || !es_orders_ok(cfg->min_n, cfg->max_n, ES_NGSTAT_MAX_N, cfg->max_bytes)) return ES_E_ARG;
    size_t need = bytes_for(MIN_GRAMS, MIN_SLOTS, MIN_SLOTS);
    if ((uint64_t)need > (uint64_t)cfg->max_bytes) return ES_E_FULL;
    es_ngstat *s = es_calloc(1, sizeof(*s));
    if (s == NULL) return ES_E_NOMEM;
    s->grams = es_calloc(MIN_GRAMS, sizeof(gram_t));
    s->gidx.slots = es_calloc(MIN_SLOTS, sizeof(uint32_t));
    s->pairs.slots = es_calloc(MIN_SLOTS, sizeof(pair_t));
    if (s->grams == NULL || s->gidx.slots == NULL || s->pairs.slots == NULL) {
        es_ngstat_destroy(s);
        return ES_E_NOMEM;
    }
    s->min_n = cfg->min_n;
    s->max_n = cfg->max_n;
    s->max_bytes = cfg->max_bytes;
    s->bytes = need;
    s->seed = es_fresh_seed(s);
    s->grams_cap = MIN_GRAMS;
    s->gidx.mask = MIN_SLOTS - 1;
    s->pairs.mask = MIN_SLOTS - 1;
    *out = s;
    return ES_OK;
}

void es_ngstat_destroy(es_ngstat *s) {
    if (s == NULL) return;
    es_free(s->grams);
    es_free(s->gidx.slots);
    es_free(s->pairs.slots);
    es_free(s);
}

int64_t es_ngstat_num_ngrams(const es_ngstat *s) { return s ? s->n_grams : 0; }
int64_t es_ngstat_num_pairs(const es_ngstat *s) { return s ? s->n_pairs : 0; }
int64_t es_ngstat_decays(const es_ngstat *s) { return s ? s->decays : 0; }
size_t es_ngstat_memory(const es_ngstat *s) { return s ? s->bytes : 0; }

/* ------------------------------------------------------------ hashing */

static uint64_t gram_hash(const es_ngstat *s, const int32_t *g, int32_t n) {
    uint64_t h = es_hash_step(s->seed, n);
    for (int32_t i = 0; i < n; i++) h = es_hash_step(h, g[i]);
    return h;
}

static uint64_t pair_key(const es_ngstat *s, uint32_t gram, int32_t tok) {
    return es_hash_final(es_hash_step(es_hash_step(~s->seed, (int32_t)gram), tok));
}

static int same_gram(const gram_t *e, uint64_t h, const int32_t *g, int32_t n) {
    return e->hash == h && e->order == n && memcmp(e->tok, g, (size_t)n * sizeof(int32_t)) == 0;
}

/* The gidx slot of the n-gram, or the empty slot where it would go. */
static uint32_t *gidx_find(const es_ngstat *s, uint64_t h, const int32_t *g, int32_t n) {
    uint64_t i = es_hash_final(h) & s->gidx.mask;
    for (;;) {
        uint32_t *slot = &gslots(s)[i];
        if (*slot == 0 || same_gram(&s->grams[*slot - 1], h, g, n)) return slot;
        i = (i + 1) & s->gidx.mask;
    }
}

static pair_t *pair_find(const es_ngstat *s, uint32_t gram, int32_t tok) {
    uint64_t i = pair_key(s, gram, tok) & s->pairs.mask;
    for (;;) {
        pair_t *p = &pslots(s)[i];
        if (p->gram == 0 || (p->gram == gram && p->tok == tok)) return p;
        i = (i + 1) & s->pairs.mask;
    }
}

/* The full hash of a gidx / pairs slot's content (callers skip empty slots). */
typedef uint64_t (*slot_hash)(const es_ngstat *s, const void *slot);

static uint64_t gidx_hash(const es_ngstat *s, const void *slot) {
    uint32_t e;
    memcpy(&e, slot, sizeof e);
    return es_hash_final(s->grams[e - 1].hash);
}

static uint64_t pair_hash(const es_ngstat *s, const void *slot) {
    const pair_t *p = slot;
    return pair_key(s, p->gram, p->tok);
}

static int slot_empty(const char *slot) {
    uint32_t head;
    memcpy(&head, slot, sizeof head);
    return head == 0;
}

/* Backward-shift deletion of slot i: each later entry of the probe run moves
 * into the hole unless its home lies (cyclically) after the hole. */
static void table_delete(const es_ngstat *s, table_t *t, size_t size, uint64_t i, slot_hash hash) {
    char *b = t->slots;
    uint64_t mask = t->mask, hole = i;
    for (uint64_t j = (i + 1) & mask; !slot_empty(b + j * size); j = (j + 1) & mask) {
        if (((j - (hash(s, b + j * size) & mask)) & mask) >= ((j - hole) & mask)) {
            memcpy(b + hole * size, b + j * size, size);
            hole = j;
        }
    }
    memset(b + hole * size, 0, size);
}

/* ------------------------------------------------------------ growth */

static es_status grow_grams(es_ngstat *s, int64_t want_free) {
    uint64_t have = (uint64_t)(s->grams_cap - s->grams_hw) + (uint64_t)s->n_free;
    if (have >= (uint64_t)want_free) return ES_OK;
    uint64_t cap = (uint64_t)s->grams_cap * 2;
    if (cap > MAX_GRAMS) cap = MAX_GRAMS;
    /* near the budget, grow only as far as it allows (the old copy counts too) */
    uint64_t room = (uint64_t)s->max_bytes > s->bytes ? (uint64_t)s->max_bytes - s->bytes : 0;
    if (cap * sizeof(gram_t) > room) cap = room / sizeof(gram_t);
    if (cap < (uint64_t)s->grams_cap + ((uint64_t)want_free - have)) return ES_E_FULL;
    gram_t *fresh = es_calloc((size_t)cap, sizeof(gram_t));
    if (fresh == NULL) return ES_E_NOMEM;
    memcpy(fresh, s->grams, (size_t)s->grams_hw * sizeof(gram_t));
    es_free(s->grams);
    s->grams = fresh;
    s->bytes = s->bytes - (size_t)s->grams_cap * sizeof(gram_t) + (size_t)cap * sizeof(gram_t);
    s->grams_cap = (uint32_t)cap;
    return ES_OK;
}

/* Doubles a table (the old copy counts against the budget while rehashing). */
static es_status grow_table(es_ngstat *s, table_t *t, size_t size, slot_hash hash) {
    uint64_t cap = (t->mask + 1) * 2;
    size_t bytes;
    if (cap > MAX_SLOTS || !es_mul_size((size_t)cap, size, &bytes) || !fits(s, bytes))
        return ES_E_FULL;
    char *fresh = es_calloc((size_t)cap, size);
    if (fresh == NULL) return ES_E_NOMEM;
    const char *old = t->slots;
    for (uint64_t i = 0; i <= t->mask; i++) {
        const char *slot = old + i * size;
        if (slot_empty(slot)) continue;
        uint64_t j = hash(s, slot) & (cap - 1);
        while (!slot_empty(fresh + j * size)) j = (j + 1) & (cap - 1);
        memcpy(fresh + j * size, slot, size);
    }
    es_free(t->slots);
    s->bytes = s->bytes - (size_t)(t->mask + 1) * size + bytes;
    t->slots = fresh;
    t->mask = cap - 1;
    return ES_OK;
}

/* Room for k new n-grams and k new pairs without passing 3/4 load. */
static es_status try_room(es_ngstat *s, int64_t k) {
    es_status st = grow_grams(s, k);
    while (st == ES_OK && (uint64_t)(s->n_grams + k) * 4 > (s->gidx.mask + 1) * 3)
        st = grow_table(s, &s->gidx, sizeof(uint32_t), gidx_hash);
    while (st == ES_OK && (uint64_t)(s->n_pairs + k) * 4 > (s->pairs.mask + 1) * 3)
        st = grow_table(s, &s->pairs, sizeof(pair_t), pair_hash);
    return st;
}

/* ------------------------------------------------------------ decay */

static void take_best(gram_t *g, int32_t tok, uint32_t count) {
    if (count > g->best_count || (count == g->best_count && tok < g->best)) {
        g->best = tok;
        g->best_count = count;
    }
}

es_status es_ngstat_decay(es_ngstat *s) {
    if (s == NULL) return ES_E_ARG;
    for (uint32_t e = 0; e < s->grams_hw; e++) {
        gram_t *g = &s->grams[e];
        if (g->order == 0) continue;
        g->total = 0;
        g->best_count = 0;
        g->best = INT32_MAX;
    }
    for (uint64_t i = 0; i <= s->pairs.mask; i++) {
        pair_t *p = &pslots(s)[i];
        if (p->gram == 0) continue;
        p->count >>= 1;
        if (p->count == 0) continue;
        gram_t *g = &s->grams[p->gram - 1];
        g->total += p->count;
        take_best(g, p->tok, p->count);
    }
    /* a deletion refills slot i from later in its run, so look at i again */
    for (uint64_t i = 0; i <= s->pairs.mask; i++) {
        while (pslots(s)[i].gram != 0 && pslots(s)[i].count == 0) {
            table_delete(s, &s->pairs, sizeof(pair_t), i, pair_hash);
            s->n_pairs--;
        }
    }
    for (uint32_t e = 0; e < s->grams_hw; e++) {
        gram_t *g = &s->grams[e];
        if (g->order == 0 || g->total > 0) continue;
        uint32_t *slot = gidx_find(s, g->hash, g->tok, g->order);
        table_delete(s, &s->gidx, sizeof(uint32_t), (uint64_t)(slot - gslots(s)), gidx_hash);
        memset(g, 0, sizeof *g);
        g->best = (int32_t)s->free_head;
        s->free_head = e + 1;
        s->n_free++;
        s->n_grams--;
    }
    s->decays++;
    return ES_OK;
}

/* ------------------------------------------------------------ counting */

/* Makes room for k new n-grams and pairs, and for `amount` more samples on
 * each of the k existing n-grams at grams[0..k), decaying while the budget
 * (or the count ceiling) says no. */
static es_status prepare(es_ngstat *s, const int32_t *const *grams, const int32_t *orders, int32_t k,
                         uint32_t amount) {
    for (;;) {
        int saturated = 0;
        for (int32_t i = 0; i < k && !saturated; i++) {
            uint32_t *slot = gidx_find(s, gram_hash(s, grams[i], orders[i]), grams[i], orders[i]);
            saturated = *slot != 0 && s->grams[*slot - 1].total > ES_NGSTAT_COUNT_MAX - amount;
        }
        es_status st = saturated ? ES_E_FULL : try_room(s, k);
        if (st != ES_E_FULL) return st;
        es_ngstat_decay(s);
    }
}

/* Adds `amount` samples of tok after g[0..n); prepare() made room. */
static void add(es_ngstat *s, const int32_t *g, int32_t n, int32_t tok, uint32_t amount) {
    uint64_t h = gram_hash(s, g, n);
    uint32_t *slot = gidx_find(s, h, g, n);
    if (*slot == 0) {
        uint32_t e;
        if (s->free_head != 0) {
            e = s->free_head - 1;
            s->free_head = (uint32_t)s->grams[e].best;
            s->n_free--;
        } else {
            e = s->grams_hw++;
        }
        gram_t *fresh = &s->grams[e];
        memset(fresh, 0, sizeof *fresh);
        memcpy(fresh->tok, g, (size_t)n * sizeof(int32_t));
        fresh->hash = h;
        fresh->order = n;
        fresh->best = INT32_MAX;
        *slot = e + 1;
        s->n_grams++;
    }
    gram_t *gr = &s->grams[*slot - 1];
    pair_t *p = pair_find(s, *slot, tok);
    if (p->gram == 0) {
        p->gram = *slot;
        p->tok = tok;
        p->count = 0;
        s->n_pairs++;
    }
    p->count += amount;
    gr->total += amount;
    take_best(gr, tok, p->count);
}

static void push_history(es_ngstat *s, int32_t tok) {
    if (s->hist_len == ES_NGSTAT_MAX_N) {
        memmove(s->hist, s->hist + 1, (ES_NGSTAT_MAX_N - 1) * sizeof(int32_t));
        s->hist_len--;
    }
    s->hist[s->hist_len++] = tok;
}

static es_status check_tokens(const int32_t *tokens, int64_t n) {
    if (n < 0 || (tokens == NULL && n > 0)) return ES_E_ARG;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0) return ES_E_RANGE;
    return ES_OK;
}

es_status es_ngstat_begin(es_ngstat *s, const int32_t *context, int64_t n) {
    if (s == NULL) return ES_E_ARG;
    es_status st = check_tokens(context, n);
    if (st != ES_OK) return st;
    s->hist_len = 0;
    for (int64_t i = n > ES_NGSTAT_MAX_N ? n - ES_NGSTAT_MAX_N : 0; i < n; i++)
        push_history(s, context[i]);
    return ES_OK;
}

es_status es_ngstat_extend(es_ngstat *s, const int32_t *tokens, int64_t n) {
    if (s == NULL) return ES_E_ARG;
    es_status st = check_tokens(tokens, n);
    if (st != ES_OK) return st;
    const int32_t *grams[ES_NGSTAT_MAX_N];
    int32_t orders[ES_NGSTAT_MAX_N];
    for (int64_t i = 0; i < n; i++) {
        int32_t k = 0;
        for (int32_t o = s->min_n; o <= s->max_n && o <= s->hist_len; o++, k++) {
            grams[k] = s->hist + s->hist_len - o;
            orders[k] = o;
        }
        if (k > 0) {
            st = prepare(s, grams, orders, k, 1);
            if (st != ES_OK) return st;
            for (int32_t j = 0; j < k; j++) add(s, grams[j], orders[j], tokens[i], 1);
        }
        push_history(s, tokens[i]);
    }
    return ES_OK;
}

/* ------------------------------------------------------------ reading */

static const gram_t *lookup(const es_ngstat *s, const int32_t *g, int32_t n) {
    if (n < s->min_n || n > s->max_n) return NULL;
    uint32_t slot = *gidx_find(s, gram_hash(s, g, n), g, n);
    return slot ? &s->grams[slot - 1] : NULL;
}

static es_status check_gram(const es_ngstat *s, const int32_t *gram, int32_t n) {
    if (s == NULL || n < 1 || n > ES_NGSTAT_MAX_N) return ES_E_ARG;
    return check_tokens(gram, n);
}

es_status es_ngstat_lookup(const es_ngstat *s, const int32_t *gram, int32_t n,
                           es_ngstat_entry *out, int *found) {
    if (out == NULL || found == NULL) return ES_E_ARG;
    es_status st = check_gram(s, gram, n);
    if (st != ES_OK) return st;
    const gram_t *g = lookup(s, gram, n);
    *found = g != NULL;
    out->total = g ? g->total : 0;
    out->best_count = g ? g->best_count : 0;
    out->best = g ? g->best : -1;
    return ES_OK;
}

es_status es_ngstat_count(const es_ngstat *s, const int32_t *gram, int32_t n, int32_t token,
                          uint32_t *out) {
    if (out == NULL) return ES_E_ARG;
    es_status st = check_gram(s, gram, n);
    if (st == ES_OK && token < 0) st = ES_E_RANGE;
    if (st != ES_OK) return st;
    *out = 0;
    const gram_t *g = lookup(s, gram, n);
    if (g != NULL) *out = pair_find(s, (uint32_t)(g - s->grams) + 1, token)->count;
    return ES_OK;
}

es_status es_ngstat_top(const es_ngstat *s, const int32_t *gram, int32_t n, int32_t k,
                        int32_t *tokens, uint32_t *counts, int32_t *out_n, uint32_t *total) {
    if (out_n == NULL || total == NULL || k < 0 || k > ES_MAX_TREE_CHILDREN ||
        (k > 0 && (tokens == NULL || counts == NULL)))
        return ES_E_ARG;
    es_status st = check_gram(s, gram, n);
    if (st != ES_OK) return st;
    *out_n = 0;
    *total = 0;
    const gram_t *g = lookup(s, gram, n);
    if (g == NULL) return ES_OK;
    *total = g->total;
    uint32_t entry = (uint32_t)(g - s->grams) + 1;
    int32_t have = 0;
    /* one pass over the pair table (its size is bounded by the byte budget), keeping the
     * k best in order: count descending, ties to the lowest token */
    for (uint64_t i = 0; i <= s->pairs.mask && k > 0; i++) {
        const pair_t *p = &pslots(s)[i];
        if (p->gram != entry) continue;
        int32_t at = have < k ? have++ : k;
        if (at == k) {
            if (!(p->count > counts[k - 1] || (p->count == counts[k - 1] && p->tok < tokens[k - 1])))
                continue;
            at = k - 1;
        }
        while (at > 0 && (p->count > counts[at - 1] ||
                          (p->count == counts[at - 1] && p->tok < tokens[at - 1]))) {
            tokens[at] = tokens[at - 1];
            counts[at] = counts[at - 1];
            at--;
        }
        tokens[at] = p->tok;
        counts[at] = p->count;
    }
    *out_n = have;
    return ES_OK;
}

es_status es_ngstat_export(const es_ngstat *s, int32_t *out, int64_t cap, int64_t *n) {
    if (s == NULL || n == NULL) return ES_E_ARG;
    *n = s->n_pairs;
    if (out == NULL) return ES_OK;
    if (cap < 0 || cap / ES_NGSTAT_RECORD < s->n_pairs) return ES_E_ARG;
    int32_t *r = out;
    for (uint64_t i = 0; i <= s->pairs.mask; i++) {
        const pair_t *p = &pslots(s)[i];
        if (p->gram == 0) continue;
        const gram_t *g = &s->grams[p->gram - 1];
        r[0] = g->order;
        r[1] = p->tok;
        r[2] = (int32_t)p->count;
        memcpy(r + 3, g->tok, sizeof g->tok);
        r += ES_NGSTAT_RECORD;
    }
    return ES_OK;
}

es_status es_ngstat_import(es_ngstat *s, const int32_t *records, int64_t n) {
    if (s == NULL || n < 0 || (records == NULL && n > 0)) return ES_E_ARG;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *r = records + i * ES_NGSTAT_RECORD;
        if (r[0] < 1 || r[0] > ES_NGSTAT_MAX_N) return ES_E_ARG;
        if (r[1] < 0 || r[2] < 1 || check_tokens(r + 3, r[0]) != ES_OK) return ES_E_RANGE;
    }
    for (int64_t i = 0; i < n; i++) {
        const int32_t *r = records + i * ES_NGSTAT_RECORD;
        if (r[0] < s->min_n || r[0] > s->max_n) continue;
        uint32_t amount = r[2] > ES_NGSTAT_COUNT_MAX ? ES_NGSTAT_COUNT_MAX : (uint32_t)r[2];
        const int32_t *gram = r + 3;
        es_status st = prepare(s, &gram, &r[0], 1, amount);
        if (st != ES_OK) return st;
        add(s, gram, r[0], r[1], amount);
    }
    return ES_OK;
}

/* ------------------------------------------------------------ drafting */

static int bar_ok(const es_ngstat_bar *b) {
    for (int i = 0; i < ES_NGSTAT_POSITIONS; i++)
        if (b->min_count[i] < 1 || b->min_count[i] > ES_NGSTAT_COUNT_MAX ||
            !(b->min_share[i] >= 0.0 && b->min_share[i] <= 1.0))
            return 0;
    return 1;
}

es_status es_ngstat_params_check(const es_ngstat_params *p) {
    if (p == NULL || p->max_tokens < 0 || p->max_tokens > ES_MAX_DRAFT || !bar_ok(&p->context) ||
        !bar_ok(&p->dynamic))
        return ES_E_ARG;
    for (int i = 0; i <= ES_NGSTAT_MAX_N; i++)
        if (p->order_extra[i] < 0 || p->order_extra[i] > ES_NGSTAT_COUNT_MAX) return ES_E_ARG;
    return ES_OK;
}

/* The longest n-gram of `s` ending at win[have] whose evidence passes the
 * bar at draft position pos; NULL when none does. */
static const gram_t *passing(const es_ngstat *s, const es_ngstat_bar *bar, const es_ngstat_params *p,
                             const int32_t *win, int32_t have, int32_t pos) {
    int32_t q = pos < ES_NGSTAT_POSITIONS ? pos : ES_NGSTAT_POSITIONS - 1;
    for (int32_t o = s->max_n < have ? s->max_n : have; o >= s->min_n; o--) {
        const gram_t *g = lookup(s, win + have - o, o);
        if (g == NULL) continue;
        if ((int64_t)g->total < (int64_t)bar->min_count[q] + p->order_extra[o]) continue;
        if ((double)g->best_count < bar->min_share[q] * (double)g->total) continue;
        return g;
    }
    return NULL;
}

es_status es_ngstat_draft(const es_ngstat *context, const es_ngstat *dynamic,
                          const es_ngstat_params *p, es_draft *out) {
    if (es_ngstat_params_check(p) != ES_OK || es_draft_reset(out, p->max_tokens) != ES_OK)
        return ES_E_ARG;
    const es_ngstat *hist = context != NULL ? context : dynamic;
    if (hist == NULL) return ES_OK;
    int32_t win[ES_NGSTAT_MAX_N + ES_MAX_DRAFT];
    int32_t h = hist->hist_len;
    memcpy(win, hist->hist, (size_t)h * sizeof(int32_t));
    double prob = 1.0;
    for (int32_t pos = 0; pos < p->max_tokens; pos++) {
        const gram_t *g = NULL;
        int32_t src = ES_SRC_CONTEXT;
        if (context != NULL) g = passing(context, &p->context, p, win, h + pos, pos);
        if (g == NULL && dynamic != NULL) {
            g = passing(dynamic, &p->dynamic, p, win, h + pos, pos);
            src = ES_SRC_DYNAMIC;
        }
        if (g == NULL) break;
        double share = (double)g->best_count / (double)g->total;
        win[h + pos] = g->best;
        out->tokens[pos] = g->best;
        out->probs[pos] = share;
        prob *= share;
        out->score += prob;
        out->n = pos + 1;
        if (pos == 0) {
            out->match_len = g->order;
            out->source = src;
        }
    }
    return ES_OK;
}

/* ------------------------------------------------------------ integrity */

static es_status check_gram_entry(const es_ngstat *s, uint32_t e, char *msg, size_t cap) {
    const gram_t *g = &s->grams[e];
    if (g->order < s->min_n || g->order > s->max_n)
        return es_fail(msg, cap, "entry %u has order %d", e, g->order);
    for (int32_t i = 0; i < ES_NGSTAT_MAX_N; i++)
        if (g->tok[i] < 0 || (i >= g->order && g->tok[i] != 0))
            return es_fail(msg, cap, "entry %u has a bad token at %d", e, i);
    if (g->hash != gram_hash(s, g->tok, g->order)) return es_fail(msg, cap, "entry %u has a stale hash", e);
    if (g->total < 1 || g->total > ES_NGSTAT_COUNT_MAX || g->best_count < 1 ||
        g->best_count > g->total || g->best < 0)
        return es_fail(msg, cap, "entry %u has total %u, best %d x %u", e, g->total, g->best, g->best_count);
    if (*gidx_find(s, g->hash, g->tok, g->order) != e + 1)
        return es_fail(msg, cap, "entry %u is unreachable or duplicated", e);
    return ES_OK;
}

static es_status check_pair(const es_ngstat *s, uint64_t i, uint64_t *sum, char *msg, size_t cap) {
    const pair_t *p = &pslots(s)[i];
    if (p->gram > s->grams_hw || s->grams[p->gram - 1].order == 0)
        return es_fail(msg, cap, "pair %llu refers to a free entry", (unsigned long long)i);
    const gram_t *g = &s->grams[p->gram - 1];
    if (p->tok < 0 || p->count < 1 || p->count > g->best_count ||
        (p->count == g->best_count && p->tok < g->best))
        return es_fail(msg, cap, "pair %llu (token %d x %u) contradicts its entry's best %d x %u",
                       (unsigned long long)i, p->tok, p->count, g->best, g->best_count);
    if (pair_find(s, p->gram, p->tok) != p)
        return es_fail(msg, cap, "pair %llu is unreachable or duplicated", (unsigned long long)i);
    *sum += p->count;
    return ES_OK;
}

es_status es_ngstat_check(const es_ngstat *s, int deep, char *msg, size_t msg_cap) {
    if (s == NULL) return ES_E_ARG;
    size_t bytes = bytes_for(s->grams_cap, s->gidx.mask + 1, s->pairs.mask + 1);
    if (bytes != s->bytes) return es_fail(msg, msg_cap, "byte count %zu, expected %zu", s->bytes, bytes);
    if ((int64_t)s->bytes > s->max_bytes) return es_fail(msg, msg_cap, "over budget");
    if (s->hist_len < 0 || s->hist_len > ES_NGSTAT_MAX_N) return es_fail(msg, msg_cap, "history length");
    for (int32_t i = 0; i < s->hist_len; i++)
        if (s->hist[i] < 0) return es_fail(msg, msg_cap, "negative token in the history");
    if (s->grams_hw > s->grams_cap || s->n_grams + s->n_free != (int64_t)s->grams_hw)
        return es_fail(msg, msg_cap, "entries: %lld live + %lld free != %u used", (long long)s->n_grams,
                       (long long)s->n_free, s->grams_hw);
    if ((uint64_t)s->n_grams * 4 > (s->gidx.mask + 1) * 3 ||
        (uint64_t)s->n_pairs * 4 > (s->pairs.mask + 1) * 3)
        return es_fail(msg, msg_cap, "a table is over-full");
    if (!deep) return ES_OK;
    int64_t free_n = 0;
    for (uint32_t f = s->free_head; f != 0; f = (uint32_t)s->grams[f - 1].best, free_n++)
        if (f > s->grams_hw || s->grams[f - 1].order != 0 || free_n > s->n_free)
            return es_fail(msg, msg_cap, "broken free list at entry %u", f - 1);
    if (free_n != s->n_free) return es_fail(msg, msg_cap, "free list holds %lld, expected %lld",
                                            (long long)free_n, (long long)s->n_free);
    uint64_t totals = 0, counts = 0;
    for (uint32_t e = 0; e < s->grams_hw; e++) {
        if (s->grams[e].order == 0) continue;
        es_status st = check_gram_entry(s, e, msg, msg_cap);
        if (st != ES_OK) return st;
        totals += s->grams[e].total;
        const pair_t *best = pair_find(s, e + 1, s->grams[e].best);
        if (best->gram == 0 || best->count != s->grams[e].best_count)
            return es_fail(msg, msg_cap, "entry %u's best continuation is not counted as such", e);
    }
    int64_t slots = 0, pairs = 0;
    for (uint64_t i = 0; i <= s->gidx.mask; i++) {
        uint32_t e = gslots(s)[i];
        if (e == 0) continue;
        slots++;
        if (e > s->grams_hw || s->grams[e - 1].order == 0)
            return es_fail(msg, msg_cap, "index slot %llu refers to a free entry", (unsigned long long)i);
    }
    for (uint64_t i = 0; i <= s->pairs.mask; i++) {
        if (pslots(s)[i].gram == 0) continue;
        pairs++;
        es_status st = check_pair(s, i, &counts, msg, msg_cap);
        if (st != ES_OK) return st;
    }
    if (slots != s->n_grams || pairs != s->n_pairs)
        return es_fail(msg, msg_cap, "tables hold %lld n-grams and %lld pairs, expected %lld and %lld",
                       (long long)slots, (long long)pairs, (long long)s->n_grams, (long long)s->n_pairs);
    if (counts != totals)
        return es_fail(msg, msg_cap, "pair counts add up to %llu, totals to %llu",
                       (unsigned long long)counts, (unsigned long long)totals);
    return ES_OK;
}
