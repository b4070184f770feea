"""Pure-Python references for the native proposers, written from the definitions
(brute force, no index, no tree), for differential tests.

Prompt lookup: the longest tail of the stream (max_n down to min_n tokens) that
occurred earlier; the draft continues its most recent earlier occurrence, the
continuation reading on into the draft itself past the end of the stream.

Suffix speculation: the multiset of suffix strings (every suffix of every
stored sequence, cut to max_depth tokens) defines C(w), the number of suffix
strings that start with w. From a matched pattern w the draft takes, step by
step, the x with the largest C(w + x) (ties: the lowest token), with cumulative
probability prob * C(w + x) / C(w) (prob unchanged when the ratio is one), and
stops before a token whose probability would fall below min_prob. In the
per-request tree the context's own occurrence is left out of the first
denominator. Over match lengths m the strictly highest score wins, ties to the
longer match; between trees the global one wins only with a strictly higher score.
"""
from __future__ import annotations

from collections import Counter, defaultdict


def ngram_propose(tokens: list[int], min_n: int, max_n: int, k: int) -> tuple[list[int], int]:
    L = len(tokens)
    if k <= 0:
        return [], 0
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = tokens[L - n:]
        for end in range(L - 1, n - 1, -1):
            if tokens[end - n:end] == tail:
                ext = list(tokens)
                for i in range(k):
                    ext.append(ext[end + i])
                return ext[L:], n
    return [], 0


class SuffixModel:
    """The counts C(w) of a set of sequences, kept as a prefix counter."""

    def __init__(self, max_depth: int, sequences: list[list[int]]):
        self.max_depth = max_depth
        self.count: Counter = Counter()
        self.children: dict[tuple, set] = defaultdict(set)
        for seq in sequences:
            for i in range(len(seq)):
                s = tuple(seq[i:i + max_depth])
                self.count[()] += 1
                for j in range(1, len(s) + 1):
                    self.count[s[:j]] += 1
                    self.children[s[:j - 1]].add(s[j - 1])

    def path(self, w: tuple, excl: int, budget: int, min_prob: float):
        toks, probs = [], []
        prob, score, first = 1.0, 0.0, True
        while len(toks) < budget:
            denom = self.count[w] - (excl if first else 0)
            first = False
            kids = self.children.get(w)
            if denom <= 0 or not kids:
                break
            c, neg_x = max((self.count[w + (x,)], -x) for x in kids)
            if c != denom:
                q = prob * c / denom
                if q < min_prob:
                    break
                prob = q
            toks.append(-neg_x)
            probs.append(prob)
            score += prob
            w = w + (-neg_x,)
        return toks, probs, score


def spec_budget(m: int, max_tokens: int, factor: float, offset: float) -> int:
    x = factor * m + offset
    if not x > 0:
        return 0
    return max_tokens if x >= max_tokens else int(x)


def best_over(model: SuffixModel, context: list[int], max_m: int, excl: int, max_tokens: int,
              factor: float, offset: float, min_prob: float):
    """(tokens, probs, match_len, score) of the best match length, or None."""
    best = None
    for m in range(max_m, 0, -1):
        w = tuple(context[len(context) - m:])
        if model.count[w] == 0:
            continue
        budget = spec_budget(m, max_tokens, factor, offset)
        toks, probs, score = model.path(w, excl, budget, min_prob)
        if toks and score > (best[3] if best else 0.0):
            best = (toks, probs, m, score)
    return best


def speculate(request_seq: list[int] | None, global_seqs: list[list[int]] | None,
              context: list[int], max_depth: int, max_tokens: int, factor: float,
              offset: float, min_prob: float):
    """(tokens, probs, match_len, score, source) like edgespec._native.speculate;
    the request tree holds request_seq (== context), the global tree global_seqs."""
    result = ((), (), 0, 0.0, 0)
    if max_tokens == 0:
        return result
    if request_seq is not None:
        model = SuffixModel(max_depth, [request_seq])
        b = best_over(model, request_seq, min(max_depth - 1, len(request_seq)), 1, max_tokens,
                      factor, offset, min_prob)
        if b:
            result = (tuple(b[0]), tuple(b[1]), b[2], b[3], 1)
    if global_seqs is not None:
        model = SuffixModel(max_depth, global_seqs)
        b = best_over(model, context, min(max_depth, len(context)), 0, max_tokens, factor,
                      offset, min_prob)
        if b and b[3] > result[3]:
            result = (tuple(b[0]), tuple(b[1]), b[2], b[3], 2)
    return result


def longest_match(global_seqs: list[list[int]], context: list[int], max_depth: int) -> int:
    model = SuffixModel(max_depth, global_seqs)
    m = 0
    while m < min(max_depth, len(context)) and model.count[tuple(context[len(context) - m - 1:])]:
        m += 1
    return m


class StatsModel:
    """N-gram statistics from the definition: for each n-gram of orders min_n..max_n,
    a Counter of the tokens that followed it; begin() starts a new sequence whose
    history is the last 8 tokens of its context (not counted); decay() halves every
    count and drops the zeros."""

    HISTORY = 8

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.counts: dict[tuple, Counter] = defaultdict(Counter)
        self.hist: list[int] = []

    def begin(self, context) -> None:
        self.hist = list(context)[-self.HISTORY:]

    def extend(self, tokens) -> None:
        for t in tokens:
            for n in range(self.min_n, min(self.max_n, len(self.hist)) + 1):
                self.counts[tuple(self.hist[len(self.hist) - n:])][t] += 1
            self.hist = (self.hist + [t])[-self.HISTORY:]

    def lookup(self, gram):
        """(total, best, best_count) or None; ties go to the lowest token."""
        c = self.counts.get(tuple(gram))
        if not c or not self.min_n <= len(gram) <= self.max_n:
            return None
        best = min(c, key=lambda t: (-c[t], t))
        return sum(c.values()), best, c[best]

    def decay(self) -> None:
        for g in list(self.counts):
            c = Counter({t: v // 2 for t, v in self.counts[g].items() if v // 2})
            if c:
                self.counts[g] = c
            else:
                del self.counts[g]

    def records(self) -> set[tuple]:
        return {(len(g), t, v, g) for g, c in self.counts.items() for t, v in c.items()}


def stats_draft(context: StatsModel | None, dynamic: StatsModel | None, max_tokens: int,
                order_extra, bars) -> tuple:
    """(tokens, shares, match_len, score, source) like edgespec._native.ngram_draft.
    bars = ((context_counts, context_shares), (dynamic_counts, dynamic_shares)), each
    list indexed by draft position (the last value holds beyond); order_extra by order."""
    hist = context if context is not None else dynamic
    if hist is None:
        return (), (), 0, 0.0, 0
    win = list(hist.hist)

    def at(seq, i):
        return seq[min(i, len(seq) - 1)]

    toks, shares, first, score, prob = [], [], None, 0.0, 1.0
    for pos in range(max_tokens):
        pick = None
        for src, (table, (counts, shr)) in enumerate(zip((context, dynamic), bars)):
            if table is None:
                continue
            for n in range(min(table.max_n, len(win)), table.min_n - 1, -1):
                e = table.lookup(win[len(win) - n:])
                if e and e[0] >= at(counts, pos) + at(order_extra, n) and e[2] >= at(shr, pos) * e[0]:
                    pick = (e, n, 3 + src)
                    break
            if pick:
                break
        if pick is None:
            break
        (total, best, bc), n, src = pick
        share = bc / total
        toks.append(best)
        shares.append(share)
        prob *= share
        score += prob
        win.append(best)
        if first is None:
            first = (n, src)
    if not toks:
        return (), (), 0, 0.0, 0
    return tuple(toks), tuple(shares), first[0], score, first[1]


def speculate_tree(request_seq: list[int] | None, global_seqs: list[list[int]] | None,
                   context: list[int], max_depth: int, max_tokens: int, factor: float,
                   offset: float, min_prob: float, max_children: int):
    """(tokens, parents, probs, match_len, score, source) like
    edgespec._native.speculate_tree: from the match speculate() drafts from, take the
    most probable continuation not yet taken (path probability; ties: taken in the order
    they became available, most frequent sibling first), over at most max_children
    children of each string, none deeper than the match's budget, max_tokens in all."""
    if max_tokens == 0:
        return ((), (), (), 0, 0.0, 0)
    src, m = 0, 0
    chosen = None
    if request_seq is not None:
        model = SuffixModel(max_depth, [request_seq])
        b = best_over(model, request_seq, min(max_depth - 1, len(request_seq)), 1, max_tokens,
                      factor, offset, min_prob)
        if b:
            chosen, src, m = (model, request_seq, 1), 1, b[2]
            best_score = b[3]
    if global_seqs is not None:
        model = SuffixModel(max_depth, global_seqs)
        b = best_over(model, context, min(max_depth, len(context)), 0, max_tokens, factor,
                      offset, min_prob)
        if b and b[3] > (best_score if chosen else 0.0):
            chosen, src, m = (model, context, 0), 2, b[2]
    if chosen is None:
        return ((), (), (), 0, 0.0, 0)
    model, ctx, excl = chosen
    budget = spec_budget(m, max_tokens, factor, offset)
    frontier: list[tuple[float, int, tuple, int, int]] = []  # (prob, order, string, parent, depth)
    order = [0]

    def expand(w, ex, prob, parent, depth):
        if depth > budget:
            return
        denom = model.count[w] - ex
        kids = sorted(model.children.get(w, ()), key=lambda x: (-model.count[w + (x,)], x))
        if denom <= 0:
            return
        for x in kids[:max_children]:
            c = model.count[w + (x,)]
            q = prob if c == denom else prob * c / denom
            if q < min_prob:
                break
            frontier.append((q, order[0], w + (x,), parent, depth))
            order[0] += 1

    expand(tuple(ctx[len(ctx) - m:]), excl, 1.0, -1, 1)
    toks, parents, probs, score = [], [], [], 0.0
    while frontier and len(toks) < max_tokens:
        i = min(range(len(frontier)), key=lambda j: (-frontier[j][0], frontier[j][1]))
        q, _, w, parent, depth = frontier.pop(i)
        toks.append(w[-1])
        parents.append(parent)
        probs.append(q)
        score += q
        expand(w, 0, q, len(toks) - 1, depth + 1)
    return (tuple(toks), tuple(parents), tuple(probs), m, score, src)
