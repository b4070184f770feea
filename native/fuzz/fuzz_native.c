/* libFuzzer target for the native proposers' C API.
 *
 * The input is a program: a few configuration bytes, then operations on an
 * n-gram index, two n-gram statistics tables (context and dynamic), a
 * per-request tree, a global tree and a cursor over it, with
 * token spans (small vocabularies for repetition, raw int32 for negative and
 * huge ids), invalid arguments, tiny byte budgets and injected allocation
 * failures. The oracles: the sanitizers, the deep integrity checks after every
 * few operations, a brute-force prompt-lookup reference, the drafts' own
 * arithmetic and a statistics export/import round trip.
 *
 * Build and run: see native/README.md (fuzz-smoke). Without libFuzzer, build
 * with -DES_FUZZ_MAIN to replay corpus files given on the command line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_native.h"

#define MAX_TOKENS 1024

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t byte(input_t *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static int32_t word(input_t *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | byte(in);
    return (int32_t)v;
}

static void die(const char *what, const char *msg) {
    fprintf(stderr, "fuzz oracle failed: %s: %s\n", what, msg);
    abort();
}

/* Brute-force prompt lookup, the definition the index must match. */
static int32_t ngram_ref(const int32_t *t, int64_t len, int32_t min_n, int32_t max_n, int32_t k,
                         int32_t *out, int32_t *match) {
    *match = 0;
    if (k <= 0) return 0;
    for (int64_t n = (max_n < len - 1 ? max_n : len - 1); n >= min_n; n--) {
        for (int64_t e = len - 1; e >= n; e--) {
            if (memcmp(t + e - n, t + len - n, (size_t)n * sizeof(int32_t)) != 0) continue;
            for (int32_t i = 0; i < k; i++) out[i] = e + i < len ? t[e + i] : out[e + i - len];
            *match = (int32_t)n;
            return k;
        }
    }
    return 0;
}

typedef struct {
    es_ngram *ix;
    int32_t min_n, max_n;
    int32_t *stream; /* mirror of what the index accepted */
    int64_t stream_len;
    es_stree *req, *glob;
    es_cursor *cur;
    es_ngstat *ctx, *dyn;
} world_t;

static int32_t read_tokens(input_t *in, int32_t *buf) {
    int32_t n = byte(in) % 64;
    uint8_t mode = byte(in) % 4;
    for (int32_t i = 0; i < n; i++) {
        switch (mode) {
        case 0: buf[i] = byte(in) % 3; break;    /* heavy repetition */
        case 1: buf[i] = byte(in) % 17; break;
        case 2: buf[i] = byte(in); break;
        default: buf[i] = word(in); break;       /* negative ids now and then */
        }
    }
    return n;
}

static void check_all(world_t *w, int deep) {
    char msg[256];
    if (w->ix && es_ngram_check(w->ix, deep, msg, sizeof msg) == ES_E_CORRUPT) die("ngram", msg);
    if (w->req && es_stree_check(w->req, deep, msg, sizeof msg) == ES_E_CORRUPT) die("request", msg);
    if (w->glob && es_stree_check(w->glob, deep, msg, sizeof msg) == ES_E_CORRUPT) die("global", msg);
    if (w->ctx && es_ngstat_check(w->ctx, deep, msg, sizeof msg) == ES_E_CORRUPT) die("context", msg);
    if (w->dyn && es_ngstat_check(w->dyn, deep, msg, sizeof msg) == ES_E_CORRUPT) die("dynamic", msg);
}

/* Draft thresholds from the input; now and then out of range on purpose. */
static void read_ngstat_params(input_t *in, es_ngstat_params *p) {
    p->max_tokens = (int32_t)(byte(in) % 40) - 2;
    for (int i = 0; i <= ES_NGSTAT_MAX_N; i++) {
        uint8_t x = byte(in);
        p->order_extra[i] = x == 255 ? -1 : x % 3;
    }
    es_ngstat_bar *bars[2] = {&p->context, &p->dynamic};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < ES_NGSTAT_POSITIONS; i++) {
            bars[b]->min_count[i] = byte(in) % 4;  /* 0 is invalid */
            uint8_t q = byte(in);
            bars[b]->min_share[i] = q == 255 ? NAN : q / 250.0;  /* > 1 now and then */
        }
}

/* A draft's arithmetic: shares in (0, 1], score the sum of their running products. */
static void check_ngstat_draft(const es_ngstat_params *p, const es_draft *d) {
    if (d->n < 0 || d->n > p->max_tokens) die("ngram_draft", "draft too long");
    if (d->n > 0 && (d->match_len < 1 || d->match_len > ES_NGSTAT_MAX_N ||
                     (d->source != ES_SRC_CONTEXT && d->source != ES_SRC_DYNAMIC)))
        die("ngram_draft", "bad match length or source");
    double prob = 1.0, score = 0.0;
    for (int32_t i = 0; i < d->n; i++) {
        if (d->tokens[i] < 0 || !(d->probs[i] > 0.0) || d->probs[i] > 1.0)
            die("ngram_draft", "bad token or share");
        prob *= d->probs[i];
        score += prob;
    }
    if (score != d->score) die("ngram_draft", "score is not the sum of running products");
}

/* Exports a table, imports it into a fresh one, and checks every count came across. */
static void ngstat_round_trip(const es_ngstat *s) {
    int64_t n = 0;
    if (es_ngstat_export(s, NULL, 0, &n) != ES_OK) die("export", "sizing");
    int32_t *rec = malloc((size_t)(n + 1) * ES_NGSTAT_RECORD * sizeof(int32_t));
    es_ngstat *copy = NULL;
    es_ngstat_config cfg = {1, ES_NGSTAT_MAX_N, 1 << 26};
    if (rec == NULL || es_ngstat_create(&cfg, &copy) != ES_OK) {
        free(rec);
        return;  /* an injected allocation failure */
    }
    if (es_ngstat_export(s, rec, n * ES_NGSTAT_RECORD, &n) != ES_OK) die("export", "copy");
    if (es_ngstat_import(copy, rec, n) == ES_OK) {
        for (int64_t i = 0; i < n; i++) {
            const int32_t *r = rec + i * ES_NGSTAT_RECORD;
            uint32_t c = 0;
            if (es_ngstat_count(copy, r + 3, r[0], r[1], &c) != ES_OK || c != (uint32_t)r[2])
                die("import", "a count did not come across");
        }
    }
    es_ngstat_destroy(copy);
    free(rec);
}

static const int64_t BUDGETS[4] = {4096, 40000, 200000, 1 << 24};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input_t in = {data, size};
    world_t w;
    memset(&w, 0, sizeof w);
    int32_t buf[64], out[ES_MAX_DRAFT], ref[ES_MAX_DRAFT];
    double probs[ES_MAX_DRAFT];

    w.min_n = 1 + byte(&in) % 4;
    w.max_n = w.min_n + byte(&in) % 5;
    es_ngram_config nc = {w.min_n, w.max_n, BUDGETS[byte(&in) % 4]};
    es_stree_config rc = {2 + byte(&in) % 12, BUDGETS[byte(&in) % 4]};
    es_stree_config gc = {rc.max_depth, BUDGETS[byte(&in) % 4]};
    int32_t lo = 1 + byte(&in) % 4;
    es_ngstat_config sc = {lo, lo + byte(&in) % (ES_NGSTAT_MAX_N - lo + 1), BUDGETS[byte(&in) % 4]};
    es_ngstat_config dc = {1 + byte(&in) % 2, 2 + byte(&in) % 3, BUDGETS[byte(&in) % 4]};
    es_ngstat_create(&sc, &w.ctx);
    es_ngstat_create(&dc, &w.dyn);
    es_ngram_create(&nc, &w.ix);
    es_stree_create(&rc, &w.req);
    es_stree_create(&gc, &w.glob);
    if (w.glob) es_cursor_create(w.glob, &w.cur);
    if (w.req) es_stree_begin(w.req);
    w.stream = malloc(MAX_TOKENS * sizeof(int32_t));
    int ngram_exact = 1; /* the mirror stays exact until an extend fails midway */

    for (int ops = 0; in.n > 0 && ops < 2000; ops++) {
        uint8_t op = byte(&in) % 18;
        switch (op) {
        case 0: { /* n-gram extend, mirrored for the reference */
            int32_t n = read_tokens(&in, buf);
            if (!w.ix) break;
            int64_t before = es_ngram_length(w.ix);
            es_status st = es_ngram_extend(w.ix, buf, n);
            int64_t after = es_ngram_length(w.ix);
            if (st == ES_E_RANGE && after != before) die("ngram", "range error changed the index");
            if (after - before > n || after < before) die("ngram", "length moved oddly");
            for (int64_t i = before; i < after && w.stream_len < MAX_TOKENS; i++)
                w.stream[w.stream_len++] = buf[i - before];
            if (after > MAX_TOKENS) ngram_exact = 0;
            break;
        }
        case 1: { /* n-gram propose vs the reference */
            int32_t k = byte(&in) % 40, n = -1, m = -1, rm;
            if (!w.ix) break;
            if (es_ngram_propose(w.ix, k, out, &n, &m) != ES_OK) die("ngram", "propose failed");
            if (ngram_exact) {
                int32_t rn = ngram_ref(w.stream, w.stream_len, w.min_n, w.max_n, k, ref, &rm);
                if (rn != n || rm != m || memcmp(out, ref, (size_t)n * sizeof(int32_t)) != 0)
                    die("ngram", "differs from the reference");
            }
            break;
        }
        case 2: { /* request tree extend */
            int32_t n = read_tokens(&in, buf);
            if (w.req) es_stree_extend(w.req, buf, n);
            break;
        }
        case 3: { /* a response into the global tree */
            int32_t n = read_tokens(&in, buf);
            if (w.glob && es_stree_begin(w.glob) == ES_OK) {
                es_stree_extend(w.glob, buf, n);
                es_stree_end(w.glob);
            }
            break;
        }
        case 4:
            if (w.glob) es_stree_evict_oldest(w.glob);
            break;
        case 5: { /* cursor follows a context */
            int32_t n = read_tokens(&in, buf);
            if (w.cur) es_cursor_extend(w.cur, buf, n);
            break;
        }
        case 6: { /* speculate with arbitrary (sometimes invalid) parameters */
            es_spec_params p;
            p.max_tokens = (int32_t)(byte(&in) % 40) - 2;
            uint8_t f = byte(&in);
            p.factor = f == 255 ? NAN : f == 254 ? -1.0 : f / 16.0;
            p.offset = ((int)byte(&in) - 128) / 8.0;
            uint8_t q = byte(&in);
            p.min_prob = q == 255 ? 1.5 : q / 254.0;
            es_draft d = {out, probs, 0, 0, 0.0, 0};
            es_stree *sreq = byte(&in) & 1 ? w.req : NULL;
            es_cursor *scur = byte(&in) & 1 ? w.cur : NULL;
            es_status st = es_speculate(sreq, scur, &p, &d);
            if (st == ES_OK) {
                if (d.n < 0 || d.n > p.max_tokens) die("speculate", "draft too long");
                double score = 0.0;
                for (int32_t i = 0; i < d.n; i++) {
                    if (out[i] < 0 || !(probs[i] > 0.0) || probs[i] > 1.0 || probs[i] < p.min_prob ||
                        (i > 0 && probs[i] > probs[i - 1]))
                        die("speculate", "bad token or probability");
                    score += probs[i];
                }
                if (score != d.score) die("speculate", "score is not the sum of probabilities");
            } else if (st != ES_E_ARG) {
                die("speculate", "unexpected status");
            }
            /* the tree from the same match: well formed, and with one child per node
             * exactly the linear draft */
            int32_t width = byte(&in) % (ES_MAX_TREE_CHILDREN + 2);
            int32_t tt[ES_MAX_DRAFT], tp[ES_MAX_DRAFT];
            double tq[ES_MAX_DRAFT];
            es_tree_draft td = {tt, tp, tq, 0, 0, 0.0, 0};
            es_status ts = es_speculate_tree(sreq, scur, &p, width, &td);
            int tree_args_ok = st != ES_E_ARG && width >= 1 && width <= ES_MAX_TREE_CHILDREN;
            if (ts == ES_OK) {
                if (!tree_args_ok) die("speculate_tree", "accepted bad arguments");
                if (td.n < 0 || td.n > p.max_tokens) die("speculate_tree", "too many nodes");
                double score = 0.0;
                for (int32_t i = 0; i < td.n; i++) {
                    if (tt[i] < 0 || tp[i] < -1 || tp[i] >= i || !(tq[i] > 0.0) || tq[i] > 1.0 ||
                        tq[i] < p.min_prob || (tp[i] >= 0 && tq[i] > tq[tp[i]]) ||
                        (i > 0 && tq[i] > tq[i - 1]))
                        die("speculate_tree", "bad node");
                    score += tq[i];
                }
                if (score != td.score) die("speculate_tree", "score is not the sum of probabilities");
                if (width == 1 && st == ES_OK &&
                    (td.n != d.n || memcmp(tt, out, (size_t)d.n * sizeof(int32_t)) != 0 ||
                     memcmp(tq, probs, (size_t)d.n * sizeof(double)) != 0 ||
                     (d.n > 0 && (td.match_len != d.match_len || td.source != d.source))))
                    die("speculate_tree", "one child per node is not the linear draft");
            } else if (ts != ES_E_ARG || tree_args_ok) {
                if (!(ts == ES_E_NOMEM && tree_args_ok)) die("speculate_tree", "unexpected status");
            }
            break;
        }
        case 7:
            check_all(&w, 1);
            break;
        case 8: /* open / close sequences out of order */
            if (w.glob) (byte(&in) & 1 ? es_stree_begin : es_stree_end)(w.glob);
            break;
        case 9: /* inject an allocation failure a few allocations from now */
            es_debug_fail_alloc_after(byte(&in) % 8);
            break;
        case 10: { /* read back a stored sequence */
            int64_t len = 0;
            if (w.glob && es_stree_num_sequences(w.glob) > 0) {
                int64_t i = byte(&in) % es_stree_num_sequences(w.glob);
                if (es_stree_sequence(w.glob, i, NULL, 0, &len) != ES_OK) die("sequence", "length");
                int32_t *tmp = malloc((size_t)(len + 1) * sizeof(int32_t));
                if (tmp && es_stree_sequence(w.glob, i, tmp, len, &len) != ES_OK) die("sequence", "copy");
                free(tmp);
            }
            break;
        }
        case 12: { /* context statistics follow the stream */
            int32_t n = read_tokens(&in, buf);
            if (w.ctx) es_ngstat_extend(w.ctx, buf, n);
            break;
        }
        case 13: { /* a generation into the dynamic statistics, continuing a context */
            int32_t m = read_tokens(&in, buf);
            if (w.dyn && es_ngstat_begin(w.dyn, buf, m) == ES_OK) {
                int32_t n = read_tokens(&in, buf);
                es_ngstat_extend(w.dyn, buf, n);
            }
            break;
        }
        case 14: { /* draft with arbitrary (sometimes invalid) thresholds */
            es_ngstat_params p;
            read_ngstat_params(&in, &p);
            es_draft d = {out, probs, 0, 0, 0.0, 0};
            uint8_t which = byte(&in);
            es_status st = es_ngstat_draft(which & 1 ? w.ctx : NULL, which & 2 ? w.dyn : NULL, &p, &d);
            if (st == ES_OK) check_ngstat_draft(&p, &d);
            else if (st != ES_E_ARG || es_ngstat_params_check(&p) == ES_OK) die("ngram_draft", "unexpected status");
            break;
        }
        case 15: /* export / import round trip, then raw (mostly invalid) records */
            if (w.ctx) {
                ngstat_round_trip(w.ctx);
                int32_t n = read_tokens(&in, buf) / ES_NGSTAT_RECORD;
                es_ngstat_import(w.ctx, buf, n);
            }
            break;
        case 16:
            if (w.dyn) es_ngstat_decay(w.dyn);
            break;
        case 17: { /* lookups of arbitrary n-grams, orders out of range included */
            int32_t n = read_tokens(&in, buf) % (ES_NGSTAT_MAX_N + 2);
            es_ngstat_entry e;
            int found = 0;
            es_status st = es_ngstat_lookup(w.ctx, buf, n, &e, &found);
            if (st == ES_OK && found && (e.total < 1 || e.best_count < 1 || e.best_count > e.total || e.best < 0))
                die("lookup", "inconsistent entry");
            /* the alternatives agree with the entry: the best first, sorted, within the total */
            int32_t k = byte(&in) % (ES_MAX_TREE_CHILDREN + 2), tn = 0;
            int32_t tt[ES_MAX_TREE_CHILDREN + 1];
            uint32_t tc[ES_MAX_TREE_CHILDREN + 1], total = 0;
            es_status ts = es_ngstat_top(w.ctx, buf, n, k, tt, tc, &tn, &total);
            if (ts == ES_OK) {
                if (k > ES_MAX_TREE_CHILDREN || st != ES_OK) die("top", "accepted bad arguments");
                if (total != (found ? e.total : 0u) || tn < 0 || tn > k) die("top", "bad total or count");
                uint64_t sum = 0;
                for (int32_t i = 0; i < tn; i++) {
                    if (tt[i] < 0 || tc[i] < 1 || (i > 0 && (tc[i] > tc[i - 1] ||
                        (tc[i] == tc[i - 1] && tt[i] <= tt[i - 1]))))
                        die("top", "not sorted");
                    sum += tc[i];
                }
                if (sum > total) die("top", "counts exceed the total");
                if (found && k > 0 && (tn < 1 || tt[0] != e.best || tc[0] != e.best_count))
                    die("top", "the first is not the entry's best");
            } else if (ts != ES_E_ARG && ts != ES_E_RANGE) {
                die("top", "unexpected status");
            }
            break;
        }
        default: { /* invalid arguments must be refused, not crash */
            int32_t n = 0, m = 0, ml = 0;
            if (es_ngram_extend(w.ix, NULL, 3) != ES_E_ARG || es_ngram_extend(w.ix, buf, -1) != ES_E_ARG)
                die("args", "ngram extend");
            if (es_ngram_propose(w.ix, ES_MAX_DRAFT + 1, out, &n, &m) != ES_E_ARG) die("args", "propose k");
            if (es_stree_extend(w.req, NULL, 2) != ES_E_ARG) die("args", "stree extend");
            if (es_cursor_extend(w.cur, buf, -5) != ES_E_ARG) die("args", "cursor extend");
            if (es_cursor_match_length(NULL, &ml) != ES_E_ARG) die("args", "cursor match");
            if (es_speculate(NULL, NULL, NULL, NULL) != ES_E_ARG) die("args", "speculate");
            if (es_speculate_tree(NULL, NULL, NULL, 1, NULL) != ES_E_ARG) die("args", "speculate_tree");
            if (es_ngstat_top(w.ctx, buf, 1, 1, NULL, NULL, &n, NULL) != ES_E_ARG) die("args", "ngstat top");
            if (es_ngstat_extend(w.ctx, NULL, 4) != ES_E_ARG || es_ngstat_begin(w.ctx, buf, -1) != ES_E_ARG)
                die("args", "ngstat extend");
            if (es_ngstat_draft(w.ctx, w.dyn, NULL, NULL) != ES_E_ARG) die("args", "ngstat draft");
            if (es_ngstat_export(w.ctx, out, -1, NULL) != ES_E_ARG) die("args", "ngstat export");
            break;
        }
        }
        if ((ops & 15) == 15) check_all(&w, 0);
    }
    es_debug_fail_alloc_after(-1);
    check_all(&w, 1);
    es_cursor_destroy(w.cur);
    es_stree_destroy(w.req);
    es_stree_destroy(w.glob);
    es_ngram_destroy(w.ix);
    es_ngstat_destroy(w.ctx);
    es_ngstat_destroy(w.dyn);
    free(w.stream);
    return 0;
}

#ifdef ES_FUZZ_MAIN
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) continue;
        static uint8_t data[1 << 20];
        size_t n = fread(data, 1, sizeof data, f);
        fclose(f);
        LLVMFuzzerTestOneInput(data, n);
    }
    return 0;
}
#endif
