/* Depth-bounded suffix tree with occurrence counts.
 *
 * Invariants (es_stree_check verifies all of them):
 *  - every suffix of every sequence, truncated to max_depth tokens, is a path
 *    from the root that ends exactly at the end of a node's edge (never inside
 *    one), so all count(node) suffixes through a node contain its whole edge;
 *  - count(node) = suffixes passing through or ending at the node; the root's
 *    count is the number of suffixes, i.e. of stored tokens;
 *  - best(node) is the child with the highest count, ties to the lowest token;
 *  - a node's edge tokens are read from the newest sequence through it
 *    (ref_seq). Sequences are evicted oldest first, so a node that refers to
 *    the evicted sequence has no other sequence through it and goes with it:
 *    no edge ever refers to freed tokens.
 *
 * Appending token x to the open sequence moves each of its live suffixes (the
 * last max_depth - 1 ones, "active") one token down. A suffix that occurs only
 * once ends in a leaf of its own that grows with the sequence ("open leaf",
 * as in Ukkonen's construction: once a leaf, always a leaf); its length is
 * implicit, so only the suffixes that occurred before cost work:
 * O(1 + longest repeated suffix) per token, at most O(max_depth).
 */
#include <math.h>
#include <string.h>

#include "es_internal.h"

#define NIL (-1)
#define ROOT 0
/* len of an open leaf: the real length is min(open sequence length - ref_pos,
 * max_depth - parent depth), see node_len(); its depth field is unused */
#define OPEN_LEAF INT32_MAX

typedef struct {
    int32_t count;       /* suffixes through or ending at this node; -1 when free */
    int32_t parent;
    int32_t first_child; /* doubly linked sibling list, for rescans and checks */
    int32_t next_sib;    /* also the free-list link of a free node */
    int32_t prev_sib;
    int32_t best;        /* most frequent child (ties: lowest token), NIL if none */
    int32_t token;       /* first token of the edge: the key under the parent */
    int32_t len;         /* edge length in tokens (0 for the root), or OPEN_LEAF */
    int32_t depth;       /* tokens from the root to the end of this edge */
    int32_t ref_seq;     /* sequence slot holding the edge: the newest through here */
    int32_t ref_pos;     /* edge = seqs[ref_seq].toks[ref_pos .. ref_pos + len) */
} node_t;

typedef struct {
    uint64_t key;        /* parent << 32 | token */
    int32_t child;       /* NIL marks an empty slot */
    int32_t pad;
} edge_t;

typedef struct {
    int32_t *toks;
    int32_t len, cap;    /* len == -1 marks a free slot */
    int32_t next_free;
    uint64_t serial;     /* insertion order: the FIFO is sorted by it */
} seq_t;

struct es_stree {
    int32_t max_depth;
    int64_t max_bytes;
    size_t bytes;            /* every live allocation, the struct included */
    uint64_t seed;
    uint64_t version;        /* bumped by every change; cursors re-match on a new one */

    node_t *nodes;
    int32_t nodes_cap, nodes_hw; /* capacity and high-water mark */
    int32_t free_nodes;          /* free list head */
    int32_t n_free;              /* free slots below the high-water mark */

    edge_t *edges;           /* (parent, token) -> child; power of two, <= 3/4 full */
    uint64_t edge_mask;
    int64_t edges_used;

    seq_t *seqs;
    int32_t seqs_cap, seq_free;
    int32_t *fifo;           /* live sequence slots, oldest first (ring) */
    int32_t fifo_cap, fifo_head, fifo_len;
    int32_t open_seq;        /* slot of the open sequence or NIL */
    uint64_t next_serial;
    int64_t total_tokens;

    int32_t *active;         /* active[i % max_depth]: node where the open sequence's suffix
                                starting at i ends, for its last n_active starts */
    int32_t n_active;        /* <= max_depth - 1 */
    int32_t leaf_bound;      /* active suffixes starting before it end in open leaves */
    int32_t *path;           /* scratch for eviction walks, max_depth + 1 */
};

struct es_cursor {
    const es_stree *tree;
    uint64_t version;        /* tree version the locations belong to */
    int32_t depth;           /* = tree max_depth */
    int32_t *ring;           /* last `depth` context tokens */
    int64_t n_ctx;           /* context tokens seen in total */
    int32_t *loc_node;       /* loc[m-1]: where the context's suffix of length m ends */
    int32_t *loc_off;        /* tokens of the node's edge consumed (1..len) */
    int32_t *tmp_node, *tmp_off;
    int32_t n_loc;
    size_t bytes;
};

#define MIN_NODES 64
#define MIN_EDGES 128
#define MIN_SEQS 4
#define MIN_SEQ_TOKS 64
#define MAX_TOTAL_TOKENS ((int64_t)INT32_MAX - 2)

/* ---------------------------------------------------------------- budget */

static int fits(const es_stree *t, size_t extra) {
    return (uint64_t)t->bytes + (uint64_t)extra <= (uint64_t)t->max_bytes;
}

/* Grows an array to `want` elements (at least `need`), as far as the budget
 * allows counting the old copy. Returns ES_E_FULL when even `need` won't fit. */
static es_status grow_array(es_stree *t, void **arr, int32_t *cap, int32_t used, int64_t need,
                            int64_t want, size_t elem) {
    if (need > INT32_MAX - 1) return ES_E_FULL;
    if (want > INT32_MAX - 1) want = INT32_MAX - 1;
    if (want < need) want = need;
    uint64_t room = (uint64_t)t->max_bytes > t->bytes ? (uint64_t)t->max_bytes - t->bytes : 0;
    if ((uint64_t)want * elem > room) want = (int64_t)(room / elem);
    if (want < need) return ES_E_FULL;
    void *fresh = es_alloc((size_t)want * elem);
    if (fresh == NULL) return ES_E_NOMEM;
    if (*arr != NULL && used > 0) memcpy(fresh, *arr, (size_t)used * elem);
    es_free(*arr);
    *arr = fresh;
    t->bytes = t->bytes - (size_t)*cap * elem + (size_t)want * elem;
    *cap = (int32_t)want;
    return ES_OK;
}

/* ----------------------------------------------------------------- edges */

static inline uint64_t edge_key(int32_t parent, int32_t token) {
    return ((uint64_t)(uint32_t)parent << 32) | (uint32_t)token;
}

static inline uint64_t edge_home(const es_stree *t, uint64_t key) {
    return es_hash_final(key ^ t->seed) & t->edge_mask;
}

static int32_t edge_get(const es_stree *t, int32_t parent, int32_t token) {
    uint64_t key = edge_key(parent, token);
    uint64_t i = edge_home(t, key);
    for (;;) {
        const edge_t *e = &t->edges[i];
        if (e->child == NIL) return NIL;
        if (e->key == key) return e->child;
        i = (i + 1) & t->edge_mask;
    }
}

/* Sets (parent, token) -> child, adding the slot if absent. Room is ensured
 * beforehand by reserve(). */
static void edge_put(es_stree *t, int32_t parent, int32_t token, int32_t child) {
    uint64_t key = edge_key(parent, token);
    uint64_t i = edge_home(t, key);
    for (;;) {
        edge_t *e = &t->edges[i];
        if (e->child == NIL) {
            e->key = key;
            e->child = child;
            t->edges_used++;
            return;
        }
        if (e->key == key) {
            e->child = child;
            return;
        }
        i = (i + 1) & t->edge_mask;
    }
}

/* Linear-probing deletion by backward shift: no tombstones, so lookups stay
 * short however many sequences come and go. */
static void edge_del(es_stree *t, int32_t parent, int32_t token) {
    uint64_t key = edge_key(parent, token);
    uint64_t i = edge_home(t, key);
    for (;;) {
        edge_t *e = &t->edges[i];
        if (e->child == NIL) return;
        if (e->key == key) break;
        i = (i + 1) & t->edge_mask;
    }
    uint64_t hole = i;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & t->edge_mask;
        edge_t *e = &t->edges[j];
        if (e->child == NIL) break;
        uint64_t home = edge_home(t, e->key);
        /* e may fill the hole if its home is not cyclically in (hole, j] */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            t->edges[hole] = *e;
            hole = j;
        }
    }
    t->edges[hole].child = NIL;
    t->edges[hole].key = 0;
    t->edges_used--;
}

static es_status grow_edges(es_stree *t) {
    uint64_t old_cap = t->edge_mask + 1;
    if (old_cap > ((uint64_t)1 << 32)) return ES_E_FULL;
    uint64_t new_cap = old_cap * 2;
    size_t bytes;
    if (!es_mul_size((size_t)new_cap, sizeof(edge_t), &bytes)) return ES_E_FULL;
    if (!fits(t, bytes)) return ES_E_FULL;
    edge_t *fresh = es_alloc(bytes);
    if (fresh == NULL) return ES_E_NOMEM;
    for (uint64_t i = 0; i < new_cap; i++) {
        fresh[i].child = NIL;
        fresh[i].key = 0;
        fresh[i].pad = 0;
    }
    edge_t *old = t->edges;
    t->edges = fresh;
    t->edge_mask = new_cap - 1;
    for (uint64_t i = 0; i < old_cap; i++) {
        if (old[i].child == NIL) continue;
        uint64_t j = edge_home(t, old[i].key);
        while (fresh[j].child != NIL) j = (j + 1) & t->edge_mask;
        fresh[j] = old[i];
    }
    es_free(old);
    t->bytes = t->bytes - (size_t)old_cap * sizeof(edge_t) + bytes;
    return ES_OK;
}

/* ----------------------------------------------------------------- nodes */

static inline int32_t seq_tok(const es_stree *t, const node_t *nd, int32_t i) {
    return t->seqs[nd->ref_seq].toks[nd->ref_pos + i];
}

static inline int32_t node_len(const es_stree *t, const node_t *nd) {
    if (nd->len != OPEN_LEAF) return nd->len;
    int32_t grown = t->seqs[nd->ref_seq].len - nd->ref_pos;
    int32_t room = t->max_depth - t->nodes[nd->parent].depth;
    return grown < room ? grown : room;
}

static inline int32_t node_depth(const es_stree *t, const node_t *nd) {
    return nd->len != OPEN_LEAF ? nd->depth : t->nodes[nd->parent].depth + node_len(t, nd);
}

/* Gives an open leaf its explicit length: when its suffix leaves the active
 * window (it reached max_depth) or its sequence closes. */
static void settle_leaf(es_stree *t, int32_t id) {
    node_t *nd = &t->nodes[id];
    if (nd->len != OPEN_LEAF) return;
    int32_t len = node_len(t, nd);
    nd->len = len;
    nd->depth = t->nodes[nd->parent].depth + len;
}

static inline int32_t active_at(const es_stree *t, int32_t start) {
    return t->active[start % t->max_depth];
}

static int32_t node_new(es_stree *t) {
    int32_t id;
    if (t->free_nodes != NIL) {
        id = t->free_nodes;
        t->free_nodes = t->nodes[id].next_sib;
        t->n_free--;
    } else {
        id = t->nodes_hw++;
    }
    node_t *nd = &t->nodes[id];
    nd->count = 0;
    nd->parent = nd->first_child = nd->next_sib = nd->prev_sib = nd->best = NIL;
    nd->token = nd->len = nd->depth = 0;
    nd->ref_seq = NIL;
    nd->ref_pos = 0;
    return id;
}

static void node_release(es_stree *t, int32_t id) {
    node_t *nd = &t->nodes[id];
    nd->count = -1;
    nd->parent = nd->first_child = nd->prev_sib = nd->best = NIL;
    nd->next_sib = t->free_nodes;
    t->free_nodes = id;
    t->n_free++;
}

static void sib_link(es_stree *t, int32_t parent, int32_t child) {
    node_t *p = &t->nodes[parent];
    node_t *c = &t->nodes[child];
    c->prev_sib = NIL;
    c->next_sib = p->first_child;
    if (p->first_child != NIL) t->nodes[p->first_child].prev_sib = child;
    p->first_child = child;
}

static void sib_unlink(es_stree *t, int32_t child) {
    node_t *c = &t->nodes[child];
    if (c->prev_sib != NIL) t->nodes[c->prev_sib].next_sib = c->next_sib;
    else t->nodes[c->parent].first_child = c->next_sib;
    if (c->next_sib != NIL) t->nodes[c->next_sib].prev_sib = c->prev_sib;
    c->prev_sib = c->next_sib = NIL;
}

/* Puts `repl` where `old` sits in its parent's sibling list. */
static void sib_replace(es_stree *t, int32_t old, int32_t repl) {
    node_t *o = &t->nodes[old];
    node_t *r = &t->nodes[repl];
    r->prev_sib = o->prev_sib;
    r->next_sib = o->next_sib;
    if (o->prev_sib != NIL) t->nodes[o->prev_sib].next_sib = repl;
    else t->nodes[o->parent].first_child = repl;
    if (o->next_sib != NIL) t->nodes[o->next_sib].prev_sib = repl;
    o->prev_sib = o->next_sib = NIL;
}

static inline int beats(const node_t *a, const node_t *b) {
    return a->count > b->count || (a->count == b->count && a->token < b->token);
}

/* After child c's count rose (or c is new): counts only rise, so c either
 * takes over or nothing changes. */
static inline void best_after_rise(es_stree *t, int32_t parent, int32_t c) {
    node_t *p = &t->nodes[parent];
    if (p->best == NIL || beats(&t->nodes[c], &t->nodes[p->best])) p->best = c;
}

static void best_rescan(es_stree *t, int32_t parent) {
    int32_t best = NIL;
    for (int32_t c = t->nodes[parent].first_child; c != NIL; c = t->nodes[c].next_sib)
        if (best == NIL || beats(&t->nodes[c], &t->nodes[best])) best = c;
    t->nodes[parent].best = best;
}

/* ------------------------------------------------------------- sequences */

static es_status fifo_push(es_stree *t, int32_t slot) {
    if (t->fifo_len == t->fifo_cap) {
        /* unroll the ring into a bigger array */
        int64_t want = (int64_t)t->fifo_cap * 2;
        if (want > INT32_MAX - 1) return ES_E_FULL;
        size_t bytes = (size_t)want * sizeof(int32_t);
        if (!fits(t, bytes)) return ES_E_FULL;
        int32_t *fresh = es_alloc(bytes);
        if (fresh == NULL) return ES_E_NOMEM;
        for (int32_t i = 0; i < t->fifo_len; i++)
            fresh[i] = t->fifo[(t->fifo_head + i) % t->fifo_cap];
        es_free(t->fifo);
        t->bytes = t->bytes - (size_t)t->fifo_cap * sizeof(int32_t) + bytes;
        t->fifo = fresh;
        t->fifo_cap = (int32_t)want;
        t->fifo_head = 0;
    }
    t->fifo[(t->fifo_head + t->fifo_len) % t->fifo_cap] = slot;
    t->fifo_len++;
    return ES_OK;
}

static int32_t fifo_at(const es_stree *t, int64_t i) {
    return t->fifo[(t->fifo_head + i) % t->fifo_cap];
}

static es_status seq_slot_new(es_stree *t, int32_t *out) {
    if (t->seq_free == NIL) {
        int32_t old_cap = t->seqs_cap;
        void *arr = t->seqs;
        es_status st = grow_array(t, &arr, &t->seqs_cap, old_cap, (int64_t)old_cap + 1,
                                  (int64_t)old_cap * 2, sizeof(seq_t));
        if (st != ES_OK) return st;
        t->seqs = arr;
        for (int32_t i = t->seqs_cap - 1; i >= old_cap; i--) {
            t->seqs[i].toks = NULL;
            t->seqs[i].len = -1;
            t->seqs[i].cap = 0;
            t->seqs[i].serial = 0;
            t->seqs[i].next_free = t->seq_free;
            t->seq_free = i;
        }
    }
    *out = t->seq_free;
    t->seq_free = t->seqs[*out].next_free;
    return ES_OK;
}

static void seq_slot_release(es_stree *t, int32_t slot) {
    seq_t *s = &t->seqs[slot];
    t->bytes -= (size_t)s->cap * sizeof(int32_t);
    es_free(s->toks);
    s->toks = NULL;
    s->len = -1;
    s->cap = 0;
    s->next_free = t->seq_free;
    t->seq_free = slot;
}

/* ------------------------------------------------------------ life cycle */

es_status es_stree_create(const es_stree_config *cfg, es_stree **out) {
    if (out == NULL) return ES_E_ARG;
    *out = NULL;
    if (cfg == NULL || cfg->max_depth < 2 || cfg->max_depth > ES_MAX_DEPTH || cfg->max_bytes <= 0)
        return ES_E_ARG;
    size_t d = (size_t)cfg->max_depth;
    size_t need = sizeof(es_stree) + MIN_NODES * sizeof(node_t) + MIN_EDGES * sizeof(edge_t) +
                  MIN_SEQS * sizeof(seq_t) + MIN_SEQS * sizeof(int32_t) +
                  d * sizeof(int32_t) + (d + 1) * sizeof(int32_t);
    if ((uint64_t)need > (uint64_t)cfg->max_bytes) return ES_E_FULL;
    es_stree *t = es_calloc(1, sizeof(*t));
    if (t == NULL) return ES_E_NOMEM;
    t->nodes = es_alloc(MIN_NODES * sizeof(node_t));
    t->edges = es_alloc(MIN_EDGES * sizeof(edge_t));
    t->seqs = es_alloc(MIN_SEQS * sizeof(seq_t));
    t->fifo = es_alloc(MIN_SEQS * sizeof(int32_t));
    t->active = es_alloc(d * sizeof(int32_t));
    t->path = es_alloc((d + 1) * sizeof(int32_t));
    if (!t->nodes || !t->edges || !t->seqs || !t->fifo || !t->active || !t->path) {
        es_stree_destroy(t);  /* seqs_cap is still 0: no sequence is freed */
        return ES_E_NOMEM;
    }
    t->max_depth = cfg->max_depth;
    t->max_bytes = cfg->max_bytes;
    t->bytes = need;
    t->seed = es_fresh_seed(t);
    t->nodes_cap = MIN_NODES;
    t->free_nodes = NIL;
    for (int i = 0; i < MIN_EDGES; i++) {
        t->edges[i].child = NIL;
        t->edges[i].key = 0;
        t->edges[i].pad = 0;
    }
    t->edge_mask = MIN_EDGES - 1;
    t->seqs_cap = MIN_SEQS;
    t->seq_free = NIL;
    for (int32_t i = MIN_SEQS - 1; i >= 0; i--) {
        t->seqs[i].toks = NULL;
        t->seqs[i].len = -1;
        t->seqs[i].cap = 0;
        t->seqs[i].serial = 0;
        t->seqs[i].next_free = t->seq_free;
        t->seq_free = i;
    }
    t->fifo_cap = MIN_SEQS;
    t->open_seq = NIL;
    int32_t root = node_new(t); /* == ROOT */
    (void)root;
    *out = t;
    return ES_OK;
}

void es_stree_destroy(es_stree *t) {
    if (t == NULL) return;
    for (int32_t i = 0; i < t->seqs_cap; i++) es_free(t->seqs[i].toks);
    es_free(t->nodes);
    es_free(t->edges);
    es_free(t->seqs);
    es_free(t->fifo);
    es_free(t->active);
    es_free(t->path);
    es_free(t);
}

int64_t es_stree_num_sequences(const es_stree *t) { return t ? t->fifo_len : 0; }
int64_t es_stree_num_tokens(const es_stree *t) { return t ? t->total_tokens : 0; }
int64_t es_stree_num_nodes(const es_stree *t) { return t ? (int64_t)t->nodes_hw - t->n_free : 0; }
int32_t es_stree_max_depth(const es_stree *t) { return t ? t->max_depth : 0; }
size_t es_stree_memory(const es_stree *t) { return t ? t->bytes : 0; }

es_status es_stree_end(es_stree *t) {
    if (t == NULL) return ES_E_ARG;
    if (t->open_seq == NIL) return ES_OK;
    seq_t *s = &t->seqs[t->open_seq];
    int32_t first = s->len - t->n_active;
    for (int32_t i = first; i < t->leaf_bound; i++) settle_leaf(t, active_at(t, i));
    /* give back the unused tail of the token array; keep the old one if this fails */
    if (s->cap > s->len && s->len > 0) {
        int32_t *fresh = es_alloc((size_t)s->len * sizeof(int32_t));
        if (fresh != NULL) {
            memcpy(fresh, s->toks, (size_t)s->len * sizeof(int32_t));
            es_free(s->toks);
            t->bytes -= (size_t)(s->cap - s->len) * sizeof(int32_t);
            s->toks = fresh;
            s->cap = s->len;
        }
    }
    t->open_seq = NIL;
    t->n_active = 0;
    t->leaf_bound = 0;
    t->version++;
    return ES_OK;
}

/* --------------------------------------------------------------- eviction */

es_status es_stree_evict_oldest(es_stree *t) {
    if (t == NULL) return ES_E_ARG;
    if (t->fifo_len == 0) return ES_E_STATE;
    int32_t slot = fifo_at(t, 0);
    if (slot == t->open_seq) return ES_E_STATE;
    const seq_t *s = &t->seqs[slot];
    const int32_t *toks = s->toks;
    int32_t n = s->len;
    for (int32_t i = 0; i < n; i++) {
        int32_t want = n - i < t->max_depth ? n - i : t->max_depth;
        int32_t depth = 0, node = ROOT, k = 0;
        t->nodes[ROOT].count--;
        /* the suffix ends at a node end (invariant), so each step is one node */
        while (depth < want) {
            int32_t c = edge_get(t, node, toks[i + depth]);
            if (c == NIL || t->nodes[c].count <= 0) return ES_E_CORRUPT;
            t->nodes[c].count--;
            t->path[k++] = c;
            depth += node_len(t, &t->nodes[c]);
            node = c;
        }
        if (depth != want) return ES_E_CORRUPT;
        for (int32_t j = k - 1; j >= 0; j--) {
            int32_t c = t->path[j];
            int32_t p = t->nodes[c].parent;
            if (t->nodes[c].count == 0) {
                edge_del(t, p, t->nodes[c].token);
                sib_unlink(t, c);
                if (t->nodes[p].best == c) t->nodes[p].best = NIL;
                node_release(t, c);
                if (t->nodes[p].best == NIL) best_rescan(t, p);
            } else if (t->nodes[p].best == c) {
                best_rescan(t, p);
            }
        }
    }
    t->total_tokens -= n;
    t->fifo_head = (t->fifo_head + 1) % t->fifo_cap;
    t->fifo_len--;
    seq_slot_release(t, slot);
    t->version++;
    return ES_OK;
}

/* Frees room by evicting the oldest closed sequence; ES_E_FULL if none. */
static es_status make_room(es_stree *t) {
    if (t->fifo_len == 0 || fifo_at(t, 0) == t->open_seq) return ES_E_FULL;
    return es_stree_evict_oldest(t);
}

/* -------------------------------------------------------------- appending */

es_status es_stree_begin(es_stree *t) {
    if (t == NULL) return ES_E_ARG;
    es_stree_end(t);
    int32_t slot;
    es_status st;
    for (;;) {
        st = seq_slot_new(t, &slot);
        if (st == ES_OK) break;
        if (st != ES_E_FULL || make_room(t) != ES_OK) return st;
    }
    for (;;) {
        st = fifo_push(t, slot);
        if (st == ES_OK) break;
        if (st != ES_E_FULL || make_room(t) != ES_OK) {
            t->seqs[slot].len = 0;
            seq_slot_release(t, slot);
            return st;
        }
    }
    seq_t *s = &t->seqs[slot];
    s->toks = NULL;
    s->len = 0;
    s->cap = 0;
    s->serial = t->next_serial++;
    t->open_seq = slot;
    t->n_active = 0;
    t->leaf_bound = 0;
    t->version++;
    return ES_OK;
}

/* Ensures one more token can be appended without any allocation: room in the
 * open sequence, max_depth free nodes and max_depth free edge slots (each
 * active suffix adds at most one node and one edge). */
static es_status reserve(es_stree *t) {
    for (;;) {
        es_status st = ES_OK;
        seq_t *s = &t->seqs[t->open_seq];
        int64_t free_nodes = (int64_t)t->nodes_cap - t->nodes_hw + t->n_free;
        if (t->total_tokens >= MAX_TOTAL_TOKENS) return ES_E_FULL;
        if (s->len == s->cap) {
            void *arr = s->toks;
            int64_t want = s->cap < MIN_SEQ_TOKS ? MIN_SEQ_TOKS : (int64_t)s->cap * 2;
            st = grow_array(t, &arr, &s->cap, s->len, (int64_t)s->len + 1, want, sizeof(int32_t));
            if (st == ES_OK) s->toks = arr;
        } else if (free_nodes < t->max_depth) {
            void *arr = t->nodes;
            int64_t need = (int64_t)t->nodes_hw + t->max_depth - t->n_free;
            st = grow_array(t, &arr, &t->nodes_cap, t->nodes_hw, need,
                            (int64_t)t->nodes_cap + t->nodes_cap / 2 + t->max_depth, sizeof(node_t));
            if (st == ES_OK) t->nodes = arr;
        } else if ((uint64_t)(t->edges_used + t->max_depth) * 4 > (t->edge_mask + 1) * 3) {
            st = grow_edges(t);
        } else {
            return ES_OK;
        }
        if (st == ES_E_FULL) {
            st = make_room(t);
            /* the open sequence's storage may have moved; loop re-reads it */
        }
        if (st != ES_OK) return st;
    }
}

/* Moves the suffix that ends at `nd` (not an open leaf) one token down: x, at
 * position pos of the open sequence. Returns the node where it now ends and
 * sets *leaf when that is a new open leaf. */
static int32_t step(es_stree *t, int32_t nd, int32_t x, int32_t pos, int *leaf) {
    int32_t s = t->open_seq;
    int32_t c = edge_get(t, nd, x);
    if (c == NIL) {
        int32_t id = node_new(t);
        node_t *l = &t->nodes[id];
        l->count = 1;
        l->parent = nd;
        l->token = x;
        l->len = OPEN_LEAF;
        l->ref_seq = s;
        l->ref_pos = pos;
        edge_put(t, nd, x, id);
        sib_link(t, nd, id);
        best_after_rise(t, nd, id);
        *leaf = 1;
        return id;
    }
    node_t *cn = &t->nodes[c];
    if (node_len(t, cn) == 1) {
        /* (an open leaf is only ever entered by a shorter suffix, which splits
         * it; settling keeps the tree valid should that ever change) */
        settle_leaf(t, c);
        cn->count++;
        cn->ref_seq = s;
        cn->ref_pos = pos;
        best_after_rise(t, nd, c);
        return c;
    }
    /* split c after its first token: the new node m ends where this suffix does */
    int32_t m = node_new(t);
    node_t *mn = &t->nodes[m];
    node_t *n = &t->nodes[nd];
    cn = &t->nodes[c];
    mn->count = cn->count + 1;
    mn->parent = nd;
    mn->token = x;
    mn->len = 1;
    mn->depth = n->depth + 1;
    mn->ref_seq = s;
    mn->ref_pos = pos;
    edge_put(t, nd, x, m);
    sib_replace(t, c, m);
    if (n->best == c) n->best = m;
    cn->parent = m;
    cn->ref_pos++;
    if (cn->len != OPEN_LEAF) cn->len--; /* an open leaf's length follows from its parent */
    cn->token = seq_tok(t, cn, 0);
    edge_put(t, m, cn->token, c);
    mn->first_child = c;
    mn->best = c;
    best_after_rise(t, nd, m);
    return m;
}

es_status es_stree_extend(es_stree *t, const int32_t *tokens, int64_t n) {
    if (t == NULL || n < 0 || (tokens == NULL && n > 0)) return ES_E_ARG;
    if (t->open_seq == NIL) return ES_E_STATE;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0) return ES_E_RANGE;
    int32_t d = t->max_depth;
    /* before any change: cursors must not trust their locations even if this
     * call stops early */
    if (n > 0) t->version++;
    for (int64_t i = 0; i < n; i++) {
        es_status st = reserve(t);
        if (st != ES_OK) return st;
        seq_t *s = &t->seqs[t->open_seq];
        int32_t x = tokens[i];
        int32_t pos = s->len;
        s->toks[pos] = x;
        s->len = pos + 1; /* every open leaf grows by x here */
        int32_t first = pos - t->n_active;
        int32_t start = first > t->leaf_bound ? first : t->leaf_bound;
        /* the suffixes that occurred before, longest first; the ones that turn
         * into leaves now are the longest of them */
        for (int32_t j = start; j <= pos; j++) {
            int leaf = 0;
            int32_t from = j < pos ? active_at(t, j) : ROOT;
            if (j == pos) t->nodes[ROOT].count++;
            t->active[j % d] = step(t, from, x, pos, &leaf);
            if (leaf) t->leaf_bound = j + 1;
        }
        /* the longest suffix reached max_depth: it leaves the window for good */
        if (t->n_active == d - 1) settle_leaf(t, active_at(t, first));
        else t->n_active++;
        t->total_tokens++;
    }
    return ES_OK;
}

es_status es_stree_sequence(const es_stree *t, int64_t i, int32_t *out, int64_t cap,
                            int64_t *len) {
    if (t == NULL || len == NULL || i < 0 || i >= t->fifo_len) return ES_E_ARG;
    const seq_t *s = &t->seqs[fifo_at(t, i)];
    *len = s->len;
    if (out == NULL) return ES_OK;
    if (cap < s->len) return ES_E_ARG;
    if (s->len > 0) memcpy(out, s->toks, (size_t)s->len * sizeof(int32_t));
    return ES_OK;
}

/* ------------------------------------------------------------ speculation */

static int32_t spec_budget(const es_spec_params *p, int32_t m) {
    double x = p->factor * (double)m + p->offset;
    if (!(x > 0.0)) return 0;
    if (x >= (double)p->max_tokens) return p->max_tokens;
    return (int32_t)x;
}

/* Follows the most frequent continuation from (node, off): off tokens of the
 * node's edge are already matched. `excl` occurrences are left out of the
 * first denominator (the context itself, in the per-request tree). */
static void spec_path(const es_stree *t, int32_t node, int32_t off, int32_t excl, int32_t budget,
                      double min_prob, int32_t *toks, double *probs, int32_t *n_out,
                      double *score_out) {
    double prob = 1.0, score = 0.0;
    int32_t n = 0;
    int first = 1;
    while (n < budget) {
        const node_t *nd = &t->nodes[node];
        if (off < node_len(t, nd)) {
            toks[n] = seq_tok(t, nd, off);
            probs[n] = prob;
            score += prob;
            n++;
            off++;
            continue;
        }
        if (nd->best == NIL) break;
        int32_t denom = nd->count - (first ? excl : 0);
        first = 0;
        if (denom <= 0) break;
        int32_t c = t->nodes[nd->best].count;
        /* a ratio of one leaves prob bit-identical (no rounding through c/c) */
        if (c != denom) {
            double q = prob * (double)c / (double)denom;
            if (q < min_prob) break;
            prob = q;
        }
        node = nd->best;
        off = 0;
    }
    *n_out = n;
    *score_out = score;
}

typedef struct {
    int32_t n, match_len;
    double score;
} spec_best;

/* Tries match lengths m = n_loc..1 (location of m at loc_node[m-1],
 * loc_off[m-1]) and keeps the strictly best score in out. */
static void spec_over(const es_stree *t, const int32_t *loc_node, const int32_t *loc_off,
                      int32_t n_loc, int32_t excl, const es_spec_params *p, int32_t *toks,
                      double *probs, spec_best *best) {
    int32_t tk[ES_MAX_DRAFT];
    double pr[ES_MAX_DRAFT];
    for (int32_t m = n_loc; m >= 1; m--) {
        int32_t budget = spec_budget(p, m);
        /* scores are sums of at most `budget` probabilities <= 1 and the budget
         * shrinks with m, so once it cannot beat the best nothing shorter can */
        if (budget <= 0 || (double)budget + 1e-9 <= best->score) break;
        int32_t n;
        double score;
        spec_path(t, loc_node[m - 1], loc_off[m - 1], excl, budget, p->min_prob, tk, pr, &n, &score);
        if (n > 0 && score > best->score) {
            memcpy(toks, tk, (size_t)n * sizeof(int32_t));
            memcpy(probs, pr, (size_t)n * sizeof(double));
            best->n = n;
            best->match_len = m;
            best->score = score;
        }
    }
}

/* Longest m whose pattern also occurred earlier in the open sequence: counts
 * along the active list never rise with m, so binary search. */
static int32_t request_matches(const es_stree *t) {
    int32_t len = t->seqs[t->open_seq].len;
    int32_t lo = 0, hi = t->n_active;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (t->nodes[active_at(t, len - mid)].count >= 2) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static es_status cursor_sync(es_cursor *c);

static int params_ok(const es_spec_params *p) {
    return p != NULL && p->max_tokens >= 0 && p->max_tokens <= ES_MAX_DRAFT &&
           isfinite(p->factor) && p->factor >= 0.0 && isfinite(p->offset) &&
           p->min_prob >= 0.0 && p->min_prob <= 1.0;
}

es_status es_speculate(const es_stree *request, es_cursor *global, const es_spec_params *p,
                       es_draft *out) {
    if (!params_ok(p) || es_draft_reset(out, p->max_tokens) != ES_OK) return ES_E_ARG;
    if (p->max_tokens == 0) return ES_OK;
    spec_best best = {0, 0, 0.0};
    if (request != NULL && request->open_seq != NIL) {
        int32_t m = request_matches(request);
        int32_t len = request->seqs[request->open_seq].len;
        int32_t node[ES_MAX_DEPTH], off[ES_MAX_DEPTH];
        for (int32_t i = 0; i < m; i++) {
            node[i] = active_at(request, len - 1 - i);
            off[i] = node_len(request, &request->nodes[node[i]]);
        }
        spec_over(request, node, off, m, 1, p, out->tokens, out->probs, &best);
        if (best.n > 0) out->source = ES_SRC_REQUEST;
    }
    if (global != NULL) {
        es_status st = cursor_sync(global);
        if (st != ES_OK) return st;
        spec_best g = best;
        int32_t tk[ES_MAX_DRAFT];
        double pr[ES_MAX_DRAFT];
        spec_over(global->tree, global->loc_node, global->loc_off, global->n_loc, 0, p, tk, pr, &g);
        if (g.score > best.score) {
            memcpy(out->tokens, tk, (size_t)g.n * sizeof(int32_t));
            memcpy(out->probs, pr, (size_t)g.n * sizeof(double));
            best = g;
            out->source = ES_SRC_GLOBAL;
        }
    }
    out->n = best.n;
    out->match_len = best.match_len;
    out->score = best.score;
    return ES_OK;
}

/* ---------------------------------------------------------------- cursors */

es_status es_cursor_create(const es_stree *t, es_cursor **out) {
    if (out == NULL) return ES_E_ARG;
    *out = NULL;
    if (t == NULL) return ES_E_ARG;
    es_cursor *c = es_calloc(1, sizeof(*c));
    if (c == NULL) return ES_E_NOMEM;
    size_t d = (size_t)t->max_depth;
    c->ring = es_alloc(d * sizeof(int32_t));
    c->loc_node = es_alloc(d * sizeof(int32_t));
    c->loc_off = es_alloc(d * sizeof(int32_t));
    c->tmp_node = es_alloc(d * sizeof(int32_t));
    c->tmp_off = es_alloc(d * sizeof(int32_t));
    if (!c->ring || !c->loc_node || !c->loc_off || !c->tmp_node || !c->tmp_off) {
        es_cursor_destroy(c);
        return ES_E_NOMEM;
    }
    c->tree = t;
    c->depth = t->max_depth;
    c->version = t->version;
    c->bytes = sizeof(*c) + 5 * d * sizeof(int32_t);
    *out = c;
    return ES_OK;
}

void es_cursor_destroy(es_cursor *c) {
    if (c == NULL) return;
    es_free(c->ring);
    es_free(c->loc_node);
    es_free(c->loc_off);
    es_free(c->tmp_node);
    es_free(c->tmp_off);
    es_free(c);
}

size_t es_cursor_memory(const es_cursor *c) { return c ? c->bytes : 0; }

/* Where (node, off) goes on token x; 0 if the tree has no such continuation. */
static int advance(const es_stree *t, int32_t *node, int32_t *off, int32_t x) {
    const node_t *nd = &t->nodes[*node];
    if (*off < node_len(t, nd)) {
        if (seq_tok(t, nd, *off) != x) return 0;
        (*off)++;
        return 1;
    }
    int32_t ch = edge_get(t, *node, x);
    if (ch == NIL) return 0;
    *node = ch;
    *off = 1;
    return 1;
}

/* Feeds token x to the locations: suffix m+1 is suffix m moved by x, and a
 * suffix that does not continue means no longer one does either. */
static void cursor_feed(es_cursor *c, int32_t x) {
    const es_stree *t = c->tree;
    int32_t n = 0;
    int32_t node = ROOT, off = 0;
    if (advance(t, &node, &off, x)) {
        c->tmp_node[0] = node;
        c->tmp_off[0] = off;
        n = 1;
        for (int32_t m = 1; m <= c->n_loc && n < c->depth; m++) {
            node = c->loc_node[m - 1];
            off = c->loc_off[m - 1];
            if (!advance(t, &node, &off, x)) break;
            c->tmp_node[n] = node;
            c->tmp_off[n] = off;
            n++;
        }
    }
    int32_t *sw = c->loc_node;
    c->loc_node = c->tmp_node;
    c->tmp_node = sw;
    sw = c->loc_off;
    c->loc_off = c->tmp_off;
    c->tmp_off = sw;
    c->n_loc = n;
}

static es_status cursor_sync(es_cursor *c) {
    if (c->version == c->tree->version) return ES_OK;
    c->n_loc = 0;
    int64_t have = c->n_ctx < c->depth ? c->n_ctx : c->depth;
    for (int64_t i = c->n_ctx - have; i < c->n_ctx; i++) cursor_feed(c, c->ring[i % c->depth]);
    c->version = c->tree->version;
    return ES_OK;
}

es_status es_cursor_extend(es_cursor *c, const int32_t *tokens, int64_t n) {
    if (c == NULL || n < 0 || (tokens == NULL && n > 0)) return ES_E_ARG;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0) return ES_E_RANGE;
    int live = c->version == c->tree->version;
    for (int64_t i = 0; i < n; i++) {
        c->ring[c->n_ctx % c->depth] = tokens[i];
        c->n_ctx++;
        /* a stale cursor only records tokens; it re-matches when next asked */
        if (live) cursor_feed(c, tokens[i]);
    }
    return ES_OK;
}

es_status es_cursor_match_length(es_cursor *c, int32_t *out) {
    if (c == NULL || out == NULL) return ES_E_ARG;
    es_status st = cursor_sync(c);
    if (st != ES_OK) return st;
    *out = c->n_loc;
    return ES_OK;
}

/* ------------------------------------------------------------------ check */

es_status es_stree_check(const es_stree *t, int deep, char *msg, size_t cap) {
    if (t == NULL) return ES_E_ARG;
    if ((int64_t)t->bytes > t->max_bytes) return es_fail(msg, cap, "over budget: %zu bytes", t->bytes);
    size_t bytes = sizeof(es_stree) + (size_t)t->nodes_cap * sizeof(node_t) +
                   (size_t)(t->edge_mask + 1) * sizeof(edge_t) + (size_t)t->seqs_cap * sizeof(seq_t) +
                   (size_t)t->fifo_cap * sizeof(int32_t) +
                   (size_t)(2 * t->max_depth + 1) * sizeof(int32_t);
    int64_t tokens = 0;
    for (int64_t i = 0; i < t->fifo_len; i++) {
        int32_t slot = fifo_at(t, i);
        if (slot < 0 || slot >= t->seqs_cap || t->seqs[slot].len < 0)
            return es_fail(msg, cap, "fifo entry %lld is not a live sequence", (long long)i);
        const seq_t *s = &t->seqs[slot];
        if (s->len > s->cap) return es_fail(msg, cap, "sequence %d overflows", slot);
        if (i > 0 && s->serial <= t->seqs[fifo_at(t, i - 1)].serial)
            return es_fail(msg, cap, "fifo out of order at %lld", (long long)i);
        for (int32_t j = 0; j < s->len; j++)
            if (s->toks[j] < 0) return es_fail(msg, cap, "negative token in sequence %d", slot);
        tokens += s->len;
        bytes += (size_t)s->cap * sizeof(int32_t);
    }
    if (t->open_seq != NIL && (t->fifo_len == 0 || fifo_at(t, t->fifo_len - 1) != t->open_seq))
        return es_fail(msg, cap, "open sequence is not the newest");
    int64_t live_slots = 0;
    for (int32_t i = 0; i < t->seqs_cap; i++) live_slots += t->seqs[i].len >= 0;
    if (live_slots != t->fifo_len) return es_fail(msg, cap, "%lld live slots, %d in fifo", (long long)live_slots, t->fifo_len);
    if (bytes != t->bytes) return es_fail(msg, cap, "byte count %zu, expected %zu", t->bytes, bytes);
    if (tokens != t->total_tokens) return es_fail(msg, cap, "token count %lld, expected %lld", (long long)t->total_tokens, (long long)tokens);

    const node_t *root = &t->nodes[ROOT];
    if (root->count != t->total_tokens || root->len != 0 || root->depth != 0 || root->parent != NIL)
        return es_fail(msg, cap, "bad root");
    int64_t n_live = 0, n_free = 0, n_open = 0;
    for (int32_t f = t->free_nodes; f != NIL; f = t->nodes[f].next_sib) {
        if (f <= ROOT || f >= t->nodes_hw || t->nodes[f].count != -1 || ++n_free > t->nodes_hw)
            return es_fail(msg, cap, "bad free list at %d", f);
    }
    if (n_free != t->n_free) return es_fail(msg, cap, "free count %d, counted %lld", t->n_free, (long long)n_free);
    for (int32_t id = 0; id < t->nodes_hw; id++) {
        const node_t *nd = &t->nodes[id];
        if (nd->count == -1) continue;
        n_live++;
        int64_t child_sum = 0;
        int32_t best = NIL, n_children = 0;
        for (int32_t ch = nd->first_child; ch != NIL; ch = t->nodes[ch].next_sib) {
            if (ch <= ROOT || ch >= t->nodes_hw || ++n_children > t->nodes_hw)
                return es_fail(msg, cap, "node %d: bad child list", id);
            const node_t *cn = &t->nodes[ch];
            if (cn->count <= 0 || cn->parent != id) return es_fail(msg, cap, "node %d: child %d does not point back", id, ch);
            if (cn->next_sib != NIL && t->nodes[cn->next_sib].prev_sib != ch)
                return es_fail(msg, cap, "node %d: broken sibling links", id);
            child_sum += cn->count;
            if (best == NIL || beats(cn, &t->nodes[best])) best = ch;
        }
        if (best != nd->best) return es_fail(msg, cap, "node %d: best is %d, expected %d", id, nd->best, best);
        if (child_sum > nd->count) return es_fail(msg, cap, "node %d: children count %lld > %d", id, (long long)child_sum, nd->count);
        if (id == ROOT) continue;
        if (nd->parent < 0 || nd->parent >= t->nodes_hw || t->nodes[nd->parent].count <= 0 ||
            t->nodes[nd->parent].len == OPEN_LEAF)
            return es_fail(msg, cap, "node %d: bad parent", id);
        if (nd->ref_seq < 0 || nd->ref_seq >= t->seqs_cap || t->seqs[nd->ref_seq].len < 0)
            return es_fail(msg, cap, "node %d: refers to a dead sequence", id);
        if (nd->len == OPEN_LEAF) {
            n_open++;
            if (nd->ref_seq != t->open_seq || nd->count != 1 || nd->first_child != NIL)
                return es_fail(msg, cap, "node %d: open leaf outside the open sequence's suffixes", id);
        }
        int32_t len = node_len(t, nd);
        if (node_depth(t, nd) > t->max_depth) return es_fail(msg, cap, "node %d: depth %d", id, node_depth(t, nd));
        if (nd->count <= 0 || len <= 0) return es_fail(msg, cap, "node %d: empty", id);
        if (node_depth(t, nd) != t->nodes[nd->parent].depth + len) return es_fail(msg, cap, "node %d: depth mismatch", id);
        if (nd->ref_pos < 0 || nd->ref_pos + len > t->seqs[nd->ref_seq].len)
            return es_fail(msg, cap, "node %d: edge outside its sequence", id);
        if (seq_tok(t, nd, 0) != nd->token) return es_fail(msg, cap, "node %d: token mismatch", id);
        if (edge_get(t, nd->parent, nd->token) != id) return es_fail(msg, cap, "node %d: not in the edge table", id);
    }
    if (n_live + n_free != t->nodes_hw) return es_fail(msg, cap, "node accounting");
    if (t->edges_used != n_live - 1) return es_fail(msg, cap, "%lld edges for %lld nodes", (long long)t->edges_used, (long long)n_live);
    int64_t used = 0;
    for (uint64_t i = 0; i <= t->edge_mask; i++) {
        const edge_t *e = &t->edges[i];
        if (e->child == NIL) continue;
        used++;
        if (e->child <= ROOT || e->child >= t->nodes_hw || t->nodes[e->child].count <= 0 ||
            edge_key(t->nodes[e->child].parent, t->nodes[e->child].token) != e->key)
            return es_fail(msg, cap, "edge slot %llu is stale", (unsigned long long)i);
    }
    if (used != t->edges_used) return es_fail(msg, cap, "edge count");
    if ((uint64_t)used * 4 > (t->edge_mask + 1) * 3) return es_fail(msg, cap, "edge table over-full");
    if (t->open_seq == NIL && t->n_active != 0) return es_fail(msg, cap, "active suffixes without an open sequence");
    if (t->open_seq != NIL) {
        int32_t len = t->seqs[t->open_seq].len;
        int32_t want = len < t->max_depth - 1 ? len : t->max_depth - 1;
        if (t->n_active != want) return es_fail(msg, cap, "%d active suffixes, expected %d", t->n_active, want);
        for (int32_t m = 1; m <= t->n_active; m++) {
            int32_t a = active_at(t, len - m);
            if (a <= ROOT || a >= t->nodes_hw || t->nodes[a].count <= 0 || node_depth(t, &t->nodes[a]) != m)
                return es_fail(msg, cap, "active suffix %d is wrong", m);
            if ((len - m < t->leaf_bound) != (t->nodes[a].len == OPEN_LEAF))
                return es_fail(msg, cap, "active suffix %d: open-leaf bound is wrong", m);
        }
        int32_t first = len - t->n_active;
        if (n_open != (t->leaf_bound > first ? t->leaf_bound - first : 0))
            return es_fail(msg, cap, "%lld open leaves outside the active window", (long long)n_open);
    } else if (n_open != 0) {
        return es_fail(msg, cap, "open leaves without an open sequence");
    }
    if (!deep) return ES_OK;

    /* Recount: walk every suffix, compare tokens along the edges, count the
     * nodes passed, and find the newest sequence through each node. */
    int32_t *cnt = es_calloc((size_t)t->nodes_hw, sizeof(int32_t));
    int64_t *newest = es_calloc((size_t)t->nodes_hw, sizeof(int64_t));
    if (cnt == NULL || newest == NULL) {
        es_free(cnt);
        es_free(newest);
        return ES_E_NOMEM;
    }
    es_status st = ES_OK;
    for (int64_t q = 0; q < t->fifo_len && st == ES_OK; q++) {
        const seq_t *s = &t->seqs[fifo_at(t, q)];
        for (int32_t i = 0; i < s->len && st == ES_OK; i++) {
            int32_t want = s->len - i < t->max_depth ? s->len - i : t->max_depth;
            int32_t node = ROOT, depth = 0;
            cnt[ROOT]++;
            while (depth < want) {
                int32_t c = edge_get(t, node, s->toks[i + depth]);
                if (c == NIL) {
                    st = es_fail(msg, cap, "suffix %d of sequence %lld is missing", i, (long long)q);
                    break;
                }
                const node_t *cn = &t->nodes[c];
                int32_t clen = node_len(t, cn);
                if (depth + clen > want) {
                    st = es_fail(msg, cap, "suffix %d of sequence %lld ends inside an edge", i, (long long)q);
                    break;
                }
                for (int32_t j = 0; j < clen; j++) {
                    if (seq_tok(t, cn, j) != s->toks[i + depth + j]) {
                        st = es_fail(msg, cap, "edge of node %d disagrees with sequence %lld", c, (long long)q);
                        break;
                    }
                }
                if (st != ES_OK) break;
                cnt[c]++;
                newest[c] = q + 1;
                depth += clen;
                node = c;
            }
        }
    }
    for (int32_t id = 0; id < t->nodes_hw && st == ES_OK; id++) {
        const node_t *nd = &t->nodes[id];
        if (nd->count == -1) continue;
        if (cnt[id] != nd->count) st = es_fail(msg, cap, "node %d counts %d, recount %d", id, nd->count, cnt[id]);
        else if (id != ROOT && fifo_at(t, newest[id] - 1) != nd->ref_seq)
            st = es_fail(msg, cap, "node %d refers to an older sequence than the newest through it", id);
    }
    es_free(cnt);
    es_free(newest);
    return st;
}

/* ------------------------------------------------------- speculation trees */

/* A continuation not yet taken: the token at (node, off) of the tree, as a
 * child of output node `parent`, with its path probability. */
typedef struct {
    double prob;
    int32_t node, off, parent, depth;
    int32_t order;       /* push order: ties go to the earlier (the more frequent sibling) */
} tree_cand;

/* The frontier keeps at most the `room` best candidates (room = nodes still
 * to take): a candidate with `room` better ones is never taken, because each of
 * those (and their descendants, which are no more probable than they) is taken
 * before it and the budget ends first. So it fits ES_MAX_DRAFT entries. */
typedef struct {
    tree_cand c[ES_MAX_DRAFT];
    int32_t n, pushed, room;
} tree_frontier;

static inline int cand_before(const tree_cand *a, const tree_cand *b) {
    return a->prob > b->prob || (a->prob == b->prob && a->order < b->order);
}

static void frontier_push(tree_frontier *f, double prob, int32_t node, int32_t off,
                          int32_t parent, int32_t depth) {
    tree_cand c = {prob, node, off, parent, depth, f->pushed++};
    int32_t cap = f->room < ES_MAX_DRAFT ? f->room : ES_MAX_DRAFT;
    if (f->n < cap) {
        f->c[f->n++] = c;
        return;
    }
    int32_t worst = -1;
    for (int32_t i = 0; i < f->n; i++)
        if (worst < 0 || cand_before(&f->c[worst], &f->c[i])) worst = i;
    if (worst >= 0 && cand_before(&c, &f->c[worst])) f->c[worst] = c;
}

static int frontier_pop(tree_frontier *f, tree_cand *out) {
    if (f->n == 0) return 0;
    int32_t best = 0;
    for (int32_t i = 1; i < f->n; i++)
        if (cand_before(&f->c[i], &f->c[best])) best = i;
    *out = f->c[best];
    f->c[best] = f->c[--f->n];
    f->room--;
    return 1;
}

/* Pushes the continuations after (node, off) with path probability `prob` as
 * children of output node `parent`: the next edge token, or at an edge's end the
 * max_children most frequent children (excl left out of the denominator). */
static void tree_expand(const es_stree *t, tree_frontier *f, int32_t node, int32_t off,
                        int32_t excl, double prob, int32_t parent, int32_t depth,
                        int32_t budget, int32_t max_children, double min_prob) {
    if (depth > budget) return; /* never on the frontier: it would crowd out takeable ones */
    const node_t *nd = &t->nodes[node];
    if (off < node_len(t, nd)) {
        frontier_push(f, prob, node, off, parent, depth);
        return;
    }
    int32_t denom = nd->count - excl;
    if (denom <= 0) return;
    int32_t picked[ES_MAX_TREE_CHILDREN];
    int32_t n = 0;
    /* the max_children most frequent (ties: the lowest token), most frequent first */
    for (int32_t c = nd->first_child; c != NIL; c = t->nodes[c].next_sib) {
        int32_t at = n < max_children ? n++ : max_children;
        if (at == max_children) {
            if (!beats(&t->nodes[c], &t->nodes[picked[max_children - 1]])) continue;
            at = max_children - 1;
        }
        while (at > 0 && beats(&t->nodes[c], &t->nodes[picked[at - 1]])) {
            picked[at] = picked[at - 1];
            at--;
        }
        picked[at] = c;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t c = t->nodes[picked[i]].count;
        /* a ratio of one leaves prob bit-identical, as in spec_path */
        double q = c == denom ? prob : prob * (double)c / (double)denom;
        if (q < min_prob) break; /* sorted by count: no later sibling passes either */
        frontier_push(f, q, picked[i], 0, parent, depth);
    }
}

/* Grows the tree from the match at (node, off), depth at most `budget`. */
static void tree_grow(const es_stree *t, int32_t node, int32_t off, int32_t excl, int32_t budget,
                      const es_spec_params *p, int32_t max_children, es_tree_draft *out,
                      tree_frontier *f) {
    f->n = f->pushed = 0;
    f->room = p->max_tokens;
    tree_expand(t, f, node, off, excl, 1.0, -1, 1, budget, max_children, p->min_prob);
    tree_cand c;
    while (out->n < p->max_tokens && frontier_pop(f, &c)) {
        int32_t me = out->n++;
        out->tokens[me] = seq_tok(t, &t->nodes[c.node], c.off);
        out->parents[me] = c.parent;
        out->probs[me] = c.prob;
        out->score += c.prob;
        tree_expand(t, f, c.node, c.off + 1, 0, c.prob, me, c.depth + 1, budget, max_children,
                    p->min_prob);
    }
}

es_status es_speculate_tree(const es_stree *request, es_cursor *global, const es_spec_params *p,
                            int32_t max_children, es_tree_draft *out) {
    if (!params_ok(p) || out == NULL || max_children < 1 || max_children > ES_MAX_TREE_CHILDREN ||
        (p->max_tokens > 0 && (out->tokens == NULL || out->parents == NULL || out->probs == NULL)))
        return ES_E_ARG;
    out->n = 0;
    out->match_len = 0;
    out->score = 0.0;
    out->source = ES_SRC_NONE;
    if (p->max_tokens == 0) return ES_OK;
    /* which match: the one es_speculate's linear draft comes from */
    int32_t tk[ES_MAX_DRAFT];
    double pr[ES_MAX_DRAFT];
    spec_best best = {0, 0, 0.0};
    int32_t node[ES_MAX_DEPTH], off[ES_MAX_DEPTH];
    int32_t source = ES_SRC_NONE;
    if (request != NULL && request->open_seq != NIL) {
        int32_t m = request_matches(request);
        int32_t len = request->seqs[request->open_seq].len;
        for (int32_t i = 0; i < m; i++) {
            node[i] = active_at(request, len - 1 - i);
            off[i] = node_len(request, &request->nodes[node[i]]);
        }
        spec_over(request, node, off, m, 1, p, tk, pr, &best);
        if (best.n > 0) source = ES_SRC_REQUEST;
    }
    if (global != NULL) {
        es_status st = cursor_sync(global);
        if (st != ES_OK) return st;
        spec_best g = best;
        spec_over(global->tree, global->loc_node, global->loc_off, global->n_loc, 0, p, tk, pr, &g);
        if (g.score > best.score) {
            best = g;
            source = ES_SRC_GLOBAL;
        }
    }
    if (source == ES_SRC_NONE) return ES_OK;
    int32_t m = best.match_len;
    tree_frontier f;
    if (source == ES_SRC_REQUEST)
        tree_grow(request, node[m - 1], off[m - 1], 1, spec_budget(p, m), p, max_children, out, &f);
    else
        tree_grow(global->tree, global->loc_node[m - 1], global->loc_off[m - 1], 0,
                  spec_budget(p, m), p, max_children, out, &f);
    out->match_len = m;
    out->source = source;
    return ES_OK;
}
