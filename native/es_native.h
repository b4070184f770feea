/*
 * edgespec native proposers: a prompt-lookup n-gram index, n-gram statistics
 * (after llama.cpp's ngram-cache) and depth-bounded suffix trees with
 * occurrence counts (after SuffixDecoding, Oliaro et al. 2025).
 *
 * Plain C11, no Python. Tokens come in as int32 spans; every function returns
 * a status code and never aborts, whatever the input. Every object has a hard
 * byte budget (max_bytes) that covers all of its allocations, transient ones
 * included. Objects are not thread-safe: the caller serialises access to each
 * object (and to a cursor together with its tree).
 */
#ifndef ES_NATIVE_H
#define ES_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ES_OK = 0,
    ES_E_ARG = 1,      /* a null pointer, a bad size, a parameter out of its range */
    ES_E_RANGE = 2,    /* a token id is negative */
    ES_E_NOMEM = 3,    /* the allocator refused */
    ES_E_FULL = 4,     /* the byte budget (or an int32 index space) is exhausted */
    ES_E_STATE = 5,    /* the call does not fit the object's state (nothing to evict...) */
    ES_E_CORRUPT = 6   /* an integrity check failed: a bug, never the caller's input */
} es_status;

const char *es_strerror(es_status st);

/* Upper bounds that keep every loop and buffer small and fixed. */
#define ES_MAX_DRAFT 256     /* tokens one propose/speculate call may return */
#define ES_MAX_NGRAM 64      /* largest n-gram order */
#define ES_MAX_DEPTH 1024    /* largest suffix-tree depth */

/* ------------------------------------------------------------------------ */
/* Prompt lookup: the longest suffix of the stream (max_n down to min_n
 * tokens) that occurred before, continued from its most recent earlier
 * occurrence. Example, min_n=1 max_n=3, stream a b c d a b:
 *   "d a b" never occurred before; "a b" did, ending at index 2, so the
 *   draft is c d a b c ... (past the end of the stream the continuation
 *   wraps onto the draft itself, so a repeating pattern drafts a full k).
 * extend is O(max_n - min_n + 1) per token, propose O(max_n + k), both
 * independent of the stream length. */

typedef struct es_ngram es_ngram;

typedef struct {
    int32_t min_n;      /* 1 <= min_n <= max_n */
    int32_t max_n;      /* <= ES_MAX_NGRAM */
    int64_t max_bytes;  /* budget for the stream and the index */
} es_ngram_config;

es_status es_ngram_create(const es_ngram_config *cfg, es_ngram **out);
void es_ngram_destroy(es_ngram *ix);

/* Appends n tokens. Tokens are validated first (nothing changes on
 * ES_E_RANGE); on ES_E_FULL/ES_E_NOMEM the index holds a prefix of them
 * (es_ngram_length says how many) and stays consistent. */
es_status es_ngram_extend(es_ngram *ix, const int32_t *tokens, int64_t n);

/* Writes up to k (<= ES_MAX_DRAFT) tokens to out; *out_n = 0 when nothing
 * matched. *match_n is the matched n-gram order (0 when none). */
es_status es_ngram_propose(const es_ngram *ix, int32_t k, int32_t *out, int32_t *out_n,
                           int32_t *match_n);

int64_t es_ngram_length(const es_ngram *ix);
size_t es_ngram_memory(const es_ngram *ix);
/* Checks every invariant; deep also re-finds every stored n-gram (O(len * n)).
 * On failure writes a reason into msg (if msg_cap > 0) and returns ES_E_CORRUPT. */
es_status es_ngram_check(const es_ngram *ix, int deep, char *msg, size_t msg_cap);

/* ------------------------------------------------------------------------ */
/* Suffix tree over a FIFO of token sequences. Every suffix of every sequence,
 * truncated to max_depth tokens, is a path from the root; each node counts the
 * suffixes that pass through or end at it, so count(child)/count(node) is the
 * empirical probability of the child's token after the node's string. Edges
 * are compressed (they reference a stored sequence), so nodes grow O(tokens).
 *
 * Sequences are appended to one "open" sequence at a time (begin, extend...,
 * end). A per-request tree keeps its one sequence open and speculates from its
 * end; a global tree closes each response and evicts the oldest closed
 * sequences whenever an append would pass max_bytes. Extending costs
 * O(max_depth) per token, independent of the size of the tree. */

typedef struct es_stree es_stree;

typedef struct {
    int32_t max_depth;  /* 2 <= max_depth <= ES_MAX_DEPTH */
    int64_t max_bytes;  /* budget for nodes, edges, stored sequences */
} es_stree_config;

es_status es_stree_create(const es_stree_config *cfg, es_stree **out);
void es_stree_destroy(es_stree *t);

/* Opens a new sequence (closing the open one, if any). */
es_status es_stree_begin(es_stree *t);
/* Appends to the open sequence (ES_E_STATE if none). Tokens are validated
 * first; on ES_E_FULL/ES_E_NOMEM a prefix was appended and the tree is
 * consistent. Evicts the oldest closed sequences to stay within max_bytes. */
es_status es_stree_extend(es_stree *t, const int32_t *tokens, int64_t n);
/* Closes the open sequence (no-op if none). */
es_status es_stree_end(es_stree *t);
/* Drops the oldest closed sequence and every suffix it contributed
 * (ES_E_STATE when there is none). */
es_status es_stree_evict_oldest(es_stree *t);

int64_t es_stree_num_sequences(const es_stree *t);   /* open one included */
int64_t es_stree_num_tokens(const es_stree *t);
int64_t es_stree_num_nodes(const es_stree *t);      /* root included */
int32_t es_stree_max_depth(const es_stree *t);
size_t es_stree_memory(const es_stree *t);
/* Copies sequence i (0 = oldest) into out (capacity cap); *len = its length.
 * With out == NULL only *len is set. ES_E_ARG if i is out of range or cap short. */
es_status es_stree_sequence(const es_stree *t, int64_t i, int32_t *out, int64_t cap,
                            int64_t *len);
/* deep also recounts every suffix of every sequence (O(tokens * max_depth)). */
es_status es_stree_check(const es_stree *t, int deep, char *msg, size_t msg_cap);

/* ------------------------------------------------------------------------ */
/* A cursor follows a context (a request's tokens) through a tree it does not
 * modify (the global tree): it keeps where each suffix of the context, up to
 * max_depth tokens, sits in the tree, in O(max_depth) per token. When the tree
 * changes the cursor re-matches lazily from the last max_depth tokens. The
 * tree must outlive the cursor. */

typedef struct es_cursor es_cursor;

es_status es_cursor_create(const es_stree *t, es_cursor **out);
void es_cursor_destroy(es_cursor *c);
es_status es_cursor_extend(es_cursor *c, const int32_t *tokens, int64_t n);
/* Longest matched suffix of the context, in tokens (re-matches if stale). */
es_status es_cursor_match_length(es_cursor *c, int32_t *out);
size_t es_cursor_memory(const es_cursor *c);

/* ------------------------------------------------------------------------ */
/* Speculation. For each match length m (the context's last m tokens found in
 * the tree), follow the most frequent child (ties: the lowest token id) for up
 * to min(max_tokens, floor(factor * m + offset)) tokens, multiplying the
 * probability count(child)/count(node) and stopping before a token whose
 * probability would fall below min_prob. A draft's score is the sum of its
 * token probabilities (the expected number of accepted tokens); the highest
 * score over all m wins, ties going to the longer match. In the per-request
 * tree the context's own occurrence is left out of the first denominator. */

typedef struct {
    int32_t max_tokens;  /* 0..ES_MAX_DRAFT */
    double factor;       /* >= 0 */
    double offset;       /* finite */
    double min_prob;     /* 0..1 */
} es_spec_params;

enum { ES_SRC_NONE = 0, ES_SRC_REQUEST = 1, ES_SRC_GLOBAL = 2, ES_SRC_CONTEXT = 3, ES_SRC_DYNAMIC = 4 };

typedef struct {
    int32_t *tokens;     /* caller's buffer, capacity >= max_tokens */
    double *probs;       /* caller's buffer, capacity >= max_tokens */
    int32_t n;
    int32_t match_len;
    double score;
    int32_t source;      /* ES_SRC_* */
} es_draft;

/* Speculates from the end of request's open sequence (if request is not
 * NULL) and from global's context (if global is not NULL); the higher score
 * wins, ties going to the request tree. Either may be NULL. */
es_status es_speculate(const es_stree *request, es_cursor *global, const es_spec_params *p,
                       es_draft *out);

/* Speculation trees (SuffixDecoding's speculation tree). The match is chosen as
 * es_speculate chooses it (the best linear score over both trees and every m);
 * from there the tree of continuations is grown best first: the next node is
 * always the most probable continuation not yet taken (its path probability,
 * the product of count(child)/count(node) from the match), among at most
 * max_children children per branching node (the most frequent ones). Nodes
 * below min_prob, deeper than min(max_tokens, floor(factor * m + offset)), or
 * past max_tokens nodes are not taken. So the n nodes returned are the n most
 * probable continuations, prefix-closed, and following each node's first
 * child from the root gives the linear draft's path as far as the nodes
 * reach. Nodes come out in the order they were taken: parents before
 * children, the most probable sibling first. */
#define ES_MAX_TREE_CHILDREN 8

typedef struct {
    int32_t *tokens;     /* caller's buffers, capacity >= max_tokens each */
    int32_t *parents;    /* node index of each node's parent, -1: a child of the root */
    double *probs;       /* path probability of each node */
    int32_t n;
    int32_t match_len;
    double score;        /* sum of probs: the expected accepted tokens of the tree */
    int32_t source;      /* ES_SRC_* */
} es_tree_draft;

/* max_children in 1..ES_MAX_TREE_CHILDREN (1: a chain, the linear draft's path
 * cut where its budget of nodes ends). */
es_status es_speculate_tree(const es_stree *request, es_cursor *global, const es_spec_params *p,
                            int32_t max_children, es_tree_draft *out);

/* ------------------------------------------------------------------------ */
/* N-gram statistics (after llama.cpp's ngram-cache): for every n-gram of
 * orders min_n..max_n, how often each token followed it. A per-request
 * "context" table counts prompt + output; a "dynamic" table counts earlier
 * generations. Drafting takes, token by token, the most frequent continuation
 * of the longest n-gram whose evidence passes a bar (minimum samples, minimum
 * share of the best continuation) that depends on the draft position and the
 * order, and stops where no continuation passes. Example, orders 1..2, the
 * stream a b c a b: (a b) was followed by c once, (b) by c once, so a bar of
 * 1 sample and 50% drafts c with confidence 1.0; then (b c) -> a, and so on.
 *
 * Counts are uint32 kept below ES_NGSTAT_COUNT_MAX. Over its byte budget the
 * table *decays* instead of failing: every count is halved (rounding down) and
 * what reaches zero is forgotten, so the least evidence goes first and
 * memory stays bounded whatever the input. Extend is O(max_n - min_n + 1) per
 * token (amortised), a draft O(k * orders); both independent of the context
 * length. */

#define ES_NGSTAT_MAX_N 8        /* largest order of the statistics */
#define ES_NGSTAT_POSITIONS 8    /* draft positions with a bar of their own; the last holds beyond */
#define ES_NGSTAT_COUNT_MAX (1 << 30)
/* An exported record: order, continuation token, count, then the n-gram
 * (oldest token first), padded with zeros to ES_NGSTAT_MAX_N tokens. */
#define ES_NGSTAT_RECORD (3 + ES_NGSTAT_MAX_N)

typedef struct es_ngstat es_ngstat;

typedef struct {
    int32_t min_n;      /* 1 <= min_n <= max_n */
    int32_t max_n;      /* <= ES_NGSTAT_MAX_N */
    int64_t max_bytes;  /* budget for the tables */
} es_ngstat_config;

es_status es_ngstat_create(const es_ngstat_config *cfg, es_ngstat **out);
void es_ngstat_destroy(es_ngstat *s);
/* Starts a new sequence: n-grams no longer span from what was counted before.
 * The last max_n tokens of `context` (n of them; NULL when n == 0) become the
 * history the next tokens continue, without being counted themselves. */
es_status es_ngstat_begin(es_ngstat *s, const int32_t *context, int64_t n);
/* Counts each token as the continuation of the n-grams that end just before
 * it, then appends it to the history. Tokens are validated first (nothing
 * changes on ES_E_RANGE); on ES_E_NOMEM a prefix was counted. */
es_status es_ngstat_extend(es_ngstat *s, const int32_t *tokens, int64_t n);

typedef struct {
    uint32_t total;       /* samples: how often the n-gram was followed by anything */
    uint32_t best_count;  /* how often by its most frequent continuation */
    int32_t best;         /* that continuation (ties: the lowest token id) */
} es_ngstat_entry;

/* Looks up the n-gram gram[0..n) (oldest first); *found = 0 when it was never
 * counted (or its order is outside min_n..max_n). */
es_status es_ngstat_lookup(const es_ngstat *s, const int32_t *gram, int32_t n,
                           es_ngstat_entry *out, int *found);
/* The count of `token` after the n-gram (0 when never seen). */
es_status es_ngstat_count(const es_ngstat *s, const int32_t *gram, int32_t n, int32_t token,
                          uint32_t *out);

/* The k (<= ES_MAX_TREE_CHILDREN) most frequent continuations of gram[0..n)
 * (ties: the lowest token), most frequent first: tokens[i], counts[i], *out_n of
 * them, and *total the n-gram's samples (0, none, when it was never counted). A
 * draft tree's alternatives at a position. Scans the pair table once: O(its
 * slots), which the byte budget bounds; meant for the per-request context table. */
es_status es_ngstat_top(const es_ngstat *s, const int32_t *gram, int32_t n, int32_t k,
                        int32_t *tokens, uint32_t *counts, int32_t *out_n, uint32_t *total);

int64_t es_ngstat_num_ngrams(const es_ngstat *s);
int64_t es_ngstat_num_pairs(const es_ngstat *s);  /* (n-gram, continuation) counts */
int64_t es_ngstat_decays(const es_ngstat *s);     /* how often the budget forced a decay */
size_t es_ngstat_memory(const es_ngstat *s);
/* Halves every count and forgets what reaches zero (what the budget does). */
es_status es_ngstat_decay(es_ngstat *s);
/* Writes every (n-gram, continuation, count) as an ES_NGSTAT_RECORD-int32
 * record into out (capacity cap int32s); *n = the number of records. With
 * out == NULL only *n is set; ES_E_ARG if cap is short. */
es_status es_ngstat_export(const es_ngstat *s, int32_t *out, int64_t cap, int64_t *n);
/* Adds n records (as exported; counts above ES_NGSTAT_COUNT_MAX are clamped).
 * All are validated first (ES_E_RANGE: a negative token or a count < 1,
 * ES_E_ARG: an order outside 1..ES_NGSTAT_MAX_N), so a bad batch changes
 * nothing; records of orders outside min_n..max_n are skipped. */
es_status es_ngstat_import(es_ngstat *s, const int32_t *records, int64_t n);
/* deep also checks every count against its n-gram's totals (O(pairs)). */
es_status es_ngstat_check(const es_ngstat *s, int deep, char *msg, size_t msg_cap);

typedef struct {
    int32_t min_count[ES_NGSTAT_POSITIONS];  /* samples the n-gram needs, by draft position (>= 1) */
    double min_share[ES_NGSTAT_POSITIONS];   /* share its best continuation needs (0..1) */
} es_ngstat_bar;

typedef struct {
    int32_t max_tokens;                       /* 0..ES_MAX_DRAFT */
    int32_t order_extra[ES_NGSTAT_MAX_N + 1]; /* extra samples an n-gram of order n needs (>= 0) */
    es_ngstat_bar context;                    /* the bar for the context table */
    es_ngstat_bar dynamic;                    /* the bar for the dynamic table */
} es_ngstat_params;

/* ES_OK when the parameters are in range, else ES_E_ARG. */
es_status es_ngstat_params_check(const es_ngstat_params *p);

/* Drafts from the end of the context table's history (the dynamic table's
 * when context is NULL; either may be NULL): at each position, the longest
 * n-gram of the context table that passes its bar, else of the dynamic
 * table. out->probs[i] is token i's share, out->score the sum of
 * their running products (the expected accepted length), out->match_len the
 * first token's order, out->source the first token's table (ES_SRC_CONTEXT or
 * ES_SRC_DYNAMIC). */
es_status es_ngstat_draft(const es_ngstat *context, const es_ngstat *dynamic,
                          const es_ngstat_params *p, es_draft *out);

/* Test hook: make the n-th allocation from now fail (n < 0: never). Process
 * wide and not thread-safe: for fault-injection tests only. */
void es_debug_fail_alloc_after(int64_t n);

#ifdef __cplusplus
}
#endif
#endif
