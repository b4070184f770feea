"""Structured-extraction workload: the default (speculative) path vs the plain path, both
constrained by each prompt's JSON schema, interleaved per prompt on one loaded engine.

    nice -n 19 .venv/bin/python tools/structured_bench.py --target qwen-1.5b --max-tokens 160

Prompts: edgespec/lab/bench/data/structured/extraction.jsonl (Spec-Bench extraction questions
paired with a schema, plus schema-driven prompts of our own; SOURCES.md beside it). Reports
per prompt and overall: decode rate of each path, speedup, the share of emitted tokens that
were grammar-forced drafts, the grammar's own cost per step, whether the two outputs are
identical and valid under the schema.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import jsonschema

from edgespec import Engine, GenerationParams
from edgespec.grammar import state as grammar_mod

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "edgespec" / "bench" / "data"


def prompts() -> list[tuple[str, str, dict]]:
    spec = {}
    for line in open(DATA / "spec_bench_question.jsonl", encoding="utf-8"):
        r = json.loads(line)
        spec[r["question_id"]] = r["turns"][0]
    out = []
    for line in open(DATA / "structured" / "extraction.jsonl", encoding="utf-8"):
        r = json.loads(line)
        text = spec[r["spec_bench_id"]] if "spec_bench_id" in r else r["prompt"]
        out.append((r["id"], text + "\nAnswer with JSON only.", r["schema"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen-1.5b")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()

    opened: list = []
    real_open = grammar_mod.GrammarState.open.__func__

    def spy(cls, constraint, model):  # the grammar's own cost per request
        st = real_open(cls, constraint, model)
        opened.append(st)
        return st
    grammar_mod.GrammarState.open = classmethod(spy)

    eng = Engine.load(a.target, threads=a.threads)
    print(f"target {a.target}, default proposer {eng.default_proposer}")
    tot = {"none": [0, 0.0], "default": [0, 0.0]}
    forced = emitted = 0
    gsec = steps = 0.0
    for pid, text, schema in prompts():
        if a.only and pid not in a.only:
            continue
        p = GenerationParams(max_tokens=a.max_tokens, json_schema=schema)
        res = {}
        for label in ("none", "default"):
            opened.clear()
            r = eng.generate(text, p, proposer=None if label == "default" else "none")
            st = r.stats
            dec = st.generated_tokens / st.decode_tokens_per_second if st.decode_tokens_per_second else 0
            tot[label][0] += st.generated_tokens
            tot[label][1] += dec
            n_steps = st.verify_passes + st.plain_steps
            if label == "default":
                forced += st.proposer_tokens.get("grammar", 0)
                emitted += st.generated_tokens
                gsec += opened[0].seconds if opened else 0.0
                steps += n_steps
            valid = "eos"
            if r.stop_reason == "eos":
                try:
                    jsonschema.validate(json.loads(r.text), schema)
                    valid = "valid"
                except (ValueError, jsonschema.ValidationError) as e:
                    valid = f"INVALID {e}"[:60]
            else:
                valid = r.stop_reason
            res[label] = (r.tokens, st, valid, opened[0].seconds / max(1, n_steps) if opened else 0)
        (t0, s0, v0, _), (t1, s1, v1, g1) = res["none"], res["default"]
        print(f"{pid:10s} plain {s0.decode_tokens_per_second:6.2f} tok/s  default "
              f"{s1.decode_tokens_per_second:6.2f} tok/s  x{s1.decode_tokens_per_second / s0.decode_tokens_per_second:.2f}"
              f"  tokens {len(t1)}  forced {s1.proposer_tokens.get('grammar', 0)}  "
              f"by proposer {dict(s1.proposer_tokens)}  grammar {1e3 * g1:.2f} ms/step  "
              f"same={t0 == t1}  {v0}/{v1}")
    r0 = tot["none"][0] / tot["none"][1]
    r1 = tot["default"][0] / tot["default"][1]
    print(f"overall decode: plain {r0:.2f} tok/s, default {r1:.2f} tok/s, speedup x{r1 / r0:.2f}; "
          f"forced share {forced / max(1, emitted):.1%} of emitted tokens; grammar cost "
          f"{1e3 * gsec / max(1, steps):.2f} ms per step (default path)")
    eng.close()


if __name__ == "__main__":
    main()
