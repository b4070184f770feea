"""The report's plots stand alone: titled with the model, machine and date; acceptance plots
leave out configurations that never drafted; each plot is announced as it is drawn."""
from __future__ import annotations

import pytest

from edgespec.lab.bench import plots
from test_bench_report import rec, run_dict

pytest.importorskip("matplotlib")  # the [bench] extra


def _run():
    records = []
    for i, cat in enumerate(("qa", "coding")):
        p = f"p{i}"
        records += [rec("none", p, cat, 10.0, 1.0),
                    rec("ngram", p, cat, 14.0, 0.8, drafted=6, accepted=3, hist={"1": 2, "3": 1}),
                    rec("llama-completion", p, cat, 9.0, 1.1)]  # an anchor that never drafts
    run = run_dict(records)
    run["matrix"]["configs"].append({"label": "llama-completion", "baseline": "none"})
    run["identity"].update(models={"target": {"name": "/x/models/smollm2-135m.gguf"}},
                           machine={"cpu_model": "AMD EPYC"}, engine={"threads": 1},
                           date="2026-12-04T22:55:01+00:00")
    return run


def test_titles_say_model_machine_date_and_busy():
    run = _run()
    assert plots.subtitle(run) == "smollm2-135m.gguf · AMD EPYC, 1 thread · 2026-12-04 22:55"
    run["busy"] = {"limit": 0.25, "at_start": 0.9, "busy_units": 0, "units": 2, "max_unit": 0.0}
    assert plots.subtitle(run).endswith("BUSY machine: timings are noise")


def test_acceptance_plots_leave_out_configurations_that_never_drafted(tmp_path, monkeypatch):
    drawn: dict[str, list[str]] = {}
    real_acc, real_req = plots._accepted_length, plots._request_acceptance

    def spy(name, real):
        def draw(plt, run, configs, out_dir):
            drawn[name] = list(configs)
            return real(plt, run, configs, out_dir)
        return draw
    monkeypatch.setattr(plots, "_accepted_length", spy("accepted", real_acc))
    monkeypatch.setattr(plots, "_request_acceptance", spy("requests", real_req))
    said: list[str] = []
    made = plots.render_plots(_run(), tmp_path, say=said.append)
    assert drawn == {"accepted": ["ngram"], "requests": ["ngram"]}
    assert sorted(made.values()) == sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(made) == 4 and said[-1] == "report: plot 4/4 latency.png"
