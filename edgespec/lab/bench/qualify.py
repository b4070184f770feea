"""What `edgespec qualify` records per workload slice, built from a finished run."""
from __future__ import annotations

from typing import Mapping

from .results import slice_results


def qualification_records(data: Mapping, config: str, m, evidence: str) -> dict[str, dict]:
    """{slice: measured figures + the run's identity stamp}, for registry.record_qualification."""
    ident = data["identity"]
    stamp = {
        "measured_at": ident.get("date"),
        "edgespec_commit": ident.get("edgespec", {}).get("commit"),
        "llama_cpp_python": ident.get("llama_cpp", {}).get("llama_cpp_python"),
        "cpu_model": ident.get("machine", {}).get("cpu_model"),
        "threads": ident.get("engine", {}).get("threads"),
        "max_new_tokens": m.max_new_tokens,
        "temperature": m.temperature,
        "evidence": evidence,
    }
    # "acceptance": per drafted token, the figure the planner weighs for --proposer auto
    # (edgespec.planner.acceptance_priors reads it; the report calls it acceptance_rate)
    return {s: {**r, "acceptance": r.get("acceptance_rate"), **stamp}
            for s, r in slice_results(data, config).items()}
