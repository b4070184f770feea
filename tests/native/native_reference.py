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
