"""Offline replay of draft trees vs linear drafts on recorded greedy generations.

    python tools/tree_replay.py tests/data/spec_bench_traces_qwen15b.jsonl
    python tools/tree_replay.py --breakeven     # what a second branch must carry, per curve

Under greedy decoding the target's output does not depend on how it was speculated
(edgespec.lab.replay.generations), so a recorded generation says which tokens each pass would keep.
At every step the proposer session proposes a tree (``propose_tree``); the sizing
(edgespec.control.tree_sizing.size_tree) chooses, on each cost curve, either a tree or the
best linear cut of its first branch. Two policies are replayed on the same proposals:
``linear`` (always the linear cut) and ``tree`` (what the sizing chooses). A pass emits
its accepted path plus the target's token and costs ``cal.cost(nodes + 1)`` steps; the
speedup is tokens per step against the plain path's one. It also counts how often a
proposal had a second branch at all, and how often the accepted path left the first.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.calibration.curve import Calibration  # noqa: E402
from edgespec.control.tree_sizing import size_tree  # noqa: E402
from edgespec.api.params import SamplingParams  # noqa: E402
from edgespec.proposers.ngram import NgramProposer  # noqa: E402
from edgespec.proposers.suffix import SuffixProposer  # noqa: E402
from edgespec.lab.replay.generations import load_traces  # noqa: E402

CAL_DIR = Path.home() / ".cache" / "edgespec" / "calibration"


def curves() -> dict[str, Calibration]:
    out = {}
    for name, f in (("2 threads", "qwen-1.5b-6d43a17e032c22ac.json"),
                    ("1 thread", "qwen-1.5b-dc8dac00a1c52f21.json")):
        p = CAL_DIR / f
        if p.exists():
            out[name] = Calibration.from_costs(
                {int(n): c for n, c in json.loads(p.read_text())["points"]}, 0.1)
    out["CPU prior"] = Calibration.prior_cpu()
    out["GPU-like"] = Calibration.linear(0.02)
    return out


def walk(tree, truth) -> tuple[int, ...]:
    """The accepted path: follow the recorded tokens down the tree."""
    path, v, i = [], -1, 0
    while i < len(truth):
        nxt = next((c for c, p in enumerate(tree.parents) if p == v and tree.tokens[c] == truth[i]),
                   None)
        if nxt is None:
            break
        path.append(nxt)
        v, i = nxt, i + 1
    return tuple(path)


def replay(trace, make_session, cal, policy, max_nodes=15):
    s = make_session(trace.prompt)
    out = trace.output
    i, cost, steps, wide, off, passes, drafted, kept = 0, 0.0, 0, 0, 0, 0, 0, 0
    s.accept([out[0]], 0)  # the prefill's token
    i = 1
    while i < len(out):
        tree = s.propose_tree(max_nodes, 4)
        wide += tree.width > 1
        plan = size_tree(tree, cal, max_nodes=max_nodes)
        chosen = plan.tree if policy == "tree" else plan.linear
        path = walk(chosen, out[i:])
        n = len(path)
        if len(chosen):
            passes += 1
            drafted += len(chosen)
            kept += n
            if n and chosen.branch_of()[path[-1]] != 0:
                off += 1
        emitted = list(out[i:i + n + 1])
        cost += cal.cost(len(chosen) + 1)
        steps += 1
        s.accept(emitted, 0)
        i += len(emitted)
    return dict(tokens=len(out) - 1, cost=cost, steps=steps, wide=wide, off=off, passes=passes,
                drafted=drafted, kept=kept)


def main(path: str) -> None:
    traces = load_traces(path)
    sp = SuffixProposer(use_global=False)
    npp = NgramProposer(use_dynamic=False)
    sessions = {"suffix": lambda p: sp.open(p, SamplingParams()),
                "ngram": lambda p: npp.open(p, SamplingParams())}
    print("| proposer | curve | category | linear speedup | tree speedup | steps with a 2nd "
          "branch | tree passes off the first branch | drafted/kept per pass (tree) |")
    print("|---|---|---|---|---|---|---|---|")
    for pname, make in sessions.items():
        for cname, cal in curves().items():
            agg = defaultdict(lambda: defaultdict(float))
            for t in traces:
                for policy in ("linear", "tree"):
                    r = replay(t, make, cal, policy)
                    a = agg[(t.category, policy)]
                    for k, v in r.items():
                        a[k] += v
            for cat in sorted({c for c, _ in agg}):
                lin, tr = agg[(cat, "linear")], agg[(cat, "tree")]
                print(f"| {pname} | {cname} | {cat} | {lin['tokens'] / lin['cost']:.3f} | "
                      f"{tr['tokens'] / tr['cost']:.3f} | {tr['wide'] / tr['steps']:.0%} | "
                      f"{tr['off'] / max(tr['passes'], 1):.0%} | "
                      f"{tr['drafted'] / max(tr['passes'], 1):.1f}/"
                      f"{tr['kept'] / max(tr['passes'], 1):.1f} |")


def breakeven() -> None:
    """The smallest probability of a second first-token branch for which size_tree takes
    the tree: the first token at 0.55, each next token 0.9 of the one before, both branches
    k tokens long, against the linear draft of k."""
    from edgespec.decoding.tree import DraftTree

    print("| curve | k = 1 | k = 2 | k = 4 | k = 8 |")
    print("|---|---|---|---|---|")
    for name, cal in curves().items():
        row = []
        for k in (1, 2, 4, 8):
            lin = [0.55 * 0.9 ** i for i in range(k)]
            need = "> 0.45"
            for q100 in range(1, 46):
                alt = [q100 / 100 * 0.9 ** i for i in range(k)]
                t = DraftTree.from_paths([range(1, k + 1), range(100, 100 + k)], [lin, alt])
                if size_tree(t, cal, max_nodes=16, linear_k=k).is_tree:
                    need = f"{q100 / 100:.2f}"
                    break
            row.append(need)
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--breakeven"]:
        breakeven()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else
             "tests/data/spec_bench_traces_qwen15b.jsonl")
