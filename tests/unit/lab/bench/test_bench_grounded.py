"""The grounded preset's builder (edgespec.lab.bench.grounded) on this Python's real stdlib: the
fixed list, digests, skip-by-name, the planted bug, multi-turn histories, the report section."""
import fnmatch
import statistics
import sys

import pytest

from edgespec.api.events import Finished, Step
from edgespec.api.stats import RequestStats
from edgespec.lab.bench import grounded
from edgespec.lab.bench.matrix import ConfigSpec, Matrix
from edgespec.lab.bench.presets import preset
from edgespec.lab.bench.report import render_markdown
from edgespec.lab.bench.runner import BenchRun, Runner, collect_prompts
from edgespec.errors import InvalidInputError

#: the interpreter the digests in grounded.SOURCES were taken on
PINNED_ON = "3.11.7"


def test_the_set_follows_the_fixed_list_and_records_digests_and_the_python():
    s = grounded.build("all")
    assert s.python == sys.version.split()[0]
    skipped = {name for k in s.skipped for name in k.tasks}
    assert [p.id for p in s.prompts] == [f"grounded/{t.id}" for t in grounded.TASKS
                                         if t.id not in skipped]
    for u in s.used:  # every used text is the pinned one, read again here
        text, _ = grounded.read_source(next(x for x in grounded.SOURCES if x.name == u.name))
        assert u.sha256 == grounded.digest(text) and u.chars == len(text)
        assert u.sha256 in next(x.sha256 for x in grounded.SOURCES if x.name == u.name)
    if s.python == PINNED_ON:  # on the pinned interpreter nothing may be skipped
        assert s.skipped == () and len(s.prompts) == len(grounded.TASKS) == 14
        assert {u.file for u in s.used} >= {"textwrap.py", "urllib/parse.py", "heapq.py"}
    assert all(k.reason.startswith(("missing", "changed")) for k in s.skipped)
    assert {p.category for p in s.prompts} <= {
        "grounded-type-hints", "grounded-rename", "grounded-docstrings",
        "grounded-comprehension", "grounded-fix-bug", "grounded-extract", "grounded-summary",
        "grounded-agent"}
    # the builder is deterministic: the same prompts every time
    assert grounded.build("all") == s
    d = s.to_dict()
    assert d["python"] == s.python and len(d["used"]) == len(s.used)


def test_every_prompt_fits_the_default_context_with_128_tokens_per_turn():
    for p in grounded.build("all").prompts:
        assert grounded.estimated_tokens(p) <= grounded.CONTEXT_TOKENS, p.id
    agents = [p for p in grounded.build("all").prompts if p.category == "grounded-agent"]
    assert agents and all(3 <= len(p.turns) <= 5 for p in agents)


def test_a_changed_source_is_skipped_by_name_with_its_tasks(monkeypatch):
    def median(data):  # a different text where statistics.median was
        return sorted(data)[len(data) // 2]

    monkeypatch.setattr(statistics, "median", median)
    s = grounded.build("all")
    (k,) = s.skipped
    assert k.name == "statistics.median" and k.reason.startswith("changed: sha256")
    assert k.tasks == ("fix-bug/statistics.median",)
    assert "skipped statistics.median" in k.line() and "fix-bug/statistics.median" in k.line()
    assert "grounded/fix-bug/statistics.median" not in [p.id for p in s.prompts]
    assert len(s.prompts) == len(grounded.TASKS) - 1
    assert "statistics.median" not in [u.name for u in s.used]
    assert [p.task for p in s.planted] == ["fix-bug/heapq._siftup"]


def test_a_missing_source_is_skipped_by_name_and_said_in_the_report(monkeypatch):
    monkeypatch.delattr(fnmatch, "filter")
    s = grounded.build("quick")
    (k,) = s.skipped
    assert k.name == "fnmatch.filter" and k.reason.startswith("missing: AttributeError")
    assert k.tasks == ("agent/fnmatch.filter",)
    assert [p.id for p in s.prompts] == ["grounded/fix-bug/statistics.median",
                                         "grounded/extract-json/bisect"]
    run = {"identity": {"grounded": s.to_dict()}, "records": []}
    text = "\n".join(grounded.report_section(run))
    assert "**Skipped** `fnmatch.filter` (missing: AttributeError" in text
    assert "agent/fnmatch.filter" in text and f"Python {s.python}" in text


def test_a_source_without_any_text_is_missing():
    def reader(src):
        raise LookupError("missing: no source file")
    s = grounded.build("quick", reader=reader)
    assert s.prompts == () and len(s.skipped) == 3 and not s.used


def test_the_planted_bug_is_applied_deterministically_and_recorded():
    s = grounded.build("all")
    plants = {p.task: p for p in s.planted}
    m = plants["fix-bug/statistics.median"]
    assert m.before.strip() == "return (data[i - 1] + data[i]) / 2"
    assert m.after.strip() == "return (data[i - 2] + data[i]) / 2"
    text, _ = grounded.read_source(grounded.SOURCES[2])
    assert text.splitlines()[m.line - 1] == m.before
    prompt = next(p for p in s.prompts if p.id == "grounded/fix-bug/statistics.median")
    assert m.after in prompt.turns[0] and m.before not in prompt.turns[0]
    # the whole function, with only that line changed
    assert text.replace(m.before, m.after).rstrip() in prompt.turns[0]
    assert plants["fix-bug/heapq._siftup"].after.strip() == "rightpos = childpos + 2"
    assert grounded.build("all").planted == s.planted
    # a text where the planted change is not exactly once is refused, not guessed at
    assert grounded.plant_bug("a = 1\nb = 2\n", "b = 2", "b = 3") == ("a = 1\nb = 3\n", 2)
    with pytest.raises(InvalidInputError, match="occurs 0 times"):
        grounded.plant_bug("a = 1\n", "b = 2", "b = 3")
    with pytest.raises(InvalidInputError, match="occurs 2 times"):
        grounded.plant_bug("x\nx\n", "x", "y")


class _Engine:
    """Answers each request with a text naming the turn it saw, like an editor's new version."""

    def __init__(self):
        self.calls = []

    def prompt_tokens(self, messages, params):
        return list(range(10 * len(messages)))

    def stream(self, messages, params, proposer=None):
        self.calls.append((proposer, messages))
        return self._events(messages, proposer)

    def _events(self, messages, proposer):
        st = RequestStats(proposer=proposer)
        st.observe_prefill(10 * len(messages), 0.1)
        for i in range(2):
            st.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0,
                            verify_seconds=0.01, elapsed=0.1 + 0.01 * (i + 1))
            yield Step(1, (i,), str(i), ("target",), None, 0, 0, 0.0, 0.01, 0.1 + 0.01 * i)
        st.finish("length", 0.12)
        yield Finished(1, f"version {len(messages) // 2 + 1} by {proposer}", (0, 1), "length", st)


def test_the_agent_slice_carries_the_models_previous_version_into_each_turn():
    agent = next(p for p in grounded.build("quick").prompts if p.category == "grounded-agent")
    assert len(agent.turns) == 3 and "```python\ndef filter(names, pat):" in agent.turns[0]
    m = Matrix(target="t", configs=(ConfigSpec("none"), ConfigSpec("a")), spec_bench=(),
               grounded="quick", max_new_tokens=2, warmup=0)
    eng = _Engine()
    run = Runner(m, eng).run([agent], BenchRun(m))
    assert len(run.records) == 6 and {r["turn"] for r in run.records} == {0, 1, 2}
    last = [msgs for prop, msgs in eng.calls if len(msgs) == 5]
    assert len(last) == 2
    for msgs in last:
        me = next(p for p, x in eng.calls if x is msgs)
        assert msgs[0]["content"] == agent.turns[0]  # the source stays in the conversation
        assert msgs[1] == {"role": "assistant", "content": f"version 1 by {me}"}
        assert msgs[3] == {"role": "assistant", "content": f"version 2 by {me}"}
        assert msgs[4] == {"role": "user", "content": agent.turns[2]}


def test_the_presets_run_the_slice_beside_both_oracles_and_llama_cpp():
    for name, n in (("grounded", 14), ("grounded-quick", 3)):
        m = preset(name).validate()
        assert m.labels == ["none", "auto", "oracle", "oracle-copy", "llama-completion",
                            "llama-lookup"]
        assert m.max_new_tokens == 128 and m.n_ctx == 4096 and m.temperature == 0
        prompts = collect_prompts(m)
        if sys.version.split()[0] == PINNED_ON:
            assert len(prompts) == n
        assert all(p.source == grounded.SOURCE for p in prompts)
    assert sum(len(p.turns) for p in collect_prompts(preset("grounded-quick"))) == 5
    with pytest.raises(InvalidInputError, match="unknown grounded set"):
        grounded.build("most")


def test_the_edits_set_is_the_code_edits_alone_in_the_fixed_order():
    s = grounded.build("edits")
    skipped = {name for k in s.skipped for name in k.tasks}
    assert [p.id for p in s.prompts] == [
        f"grounded/{t.id}" for t in grounded.TASKS
        if t.category in grounded.EDIT_CATEGORIES and t.id not in skipped]
    assert {p.category for p in s.prompts} <= set(grounded.EDIT_CATEGORIES)
    if s.python == PINNED_ON:
        assert len(s.prompts) == 6 and s.which == "edits"
    # both planted bugs are edits, so both are recorded
    assert {p.task for p in s.planted} == {t.id for t in grounded.TASKS if t.plant} - skipped


def test_the_command_line_picks_a_grounded_set():
    from click.testing import CliRunner  # the CLI only here: the rest tests the module

    from edgespec.cli import cli

    # the flag's choices are written out (the CLI does not import the bench to start):
    # they must be the builder's sets
    option = next(p for p in cli.commands["bench"].params if p.name == "grounded_set")
    assert tuple(option.type.choices) == grounded.SETS
    res = CliRunner().invoke(cli, ["bench", "--preset", "grounded", "--grounded", "edits",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    n = len(grounded.build("edits").prompts)
    assert f"{n} prompts ({n} turns)" in res.output
    res = CliRunner().invoke(cli, ["bench", "--preset", "grounded", "--grounded", "most",
                                   "--dry-run"])
    assert res.exit_code != 0 and "most" in res.output


def _rec(config, prompt, cat, tps, turn=0):
    return {"config": config, "prompt_id": prompt, "category": cat, "turn": turn,
            "source": grounded.SOURCE, "decode_tokens_per_second": tps, "e2e_seconds": 1.0}


def test_the_report_gives_figures_per_task_and_per_agent_turn():
    recs = []
    for cfg, f in (("none", 1.0), ("auto", 2.0), ("llama-completion", 0.5)):
        recs += [_rec(cfg, "g/fix", "grounded-fix-bug", 10 * f),
                 _rec(cfg, "g/agent", "grounded-agent", 10 * f, turn=0),
                 _rec(cfg, "g/agent", "grounded-agent", 10 * f * (3 if cfg == "auto" else 1),
                      turn=1)]
    run = {"identity": {"grounded": grounded.build("quick").to_dict()}, "records": recs,
           "matrix": {"configs": [{"label": "none"}, {"label": "auto"},
                                  {"label": "llama-completion"}],
                      "bootstrap_resamples": 100, "confidence": 0.95, "seed": 0}}
    text = "\n".join(grounded.report_section(run))
    assert "| grounded-fix-bug | 2.00× | 0.50× |" in text  # auto, llama-completion over plain
    assert "| g/agent | 4.00× | 0.50× |" in text  # per prompt: the median of 2x and 6x
    assert "Agent slice per turn" in text
    assert "| turn 1 | 2.00× | 0.50× |" in text and "| turn 2 | 6.00× | 0.50× |" in text
    assert "| turn 2 | 2.00× | 12.00× |" in text  # over llama-completion: plain, auto
    assert "Planted bug in `fix-bug/statistics.median`" in text
    assert grounded.report_section({"identity": {}, "records": [{"source": "x"}]}) == []
    # the code edits' own row: the geometric mean over their prompts, the agent left out
    assert "| code edits | 2.00× | 0.50× |" in text  # over plain: auto, llama-completion
    assert "| code edits | 2.00× | 4.00× |" in text  # over llama-completion: plain, auto


def test_the_code_edits_row_is_the_geometric_mean_over_their_prompts():
    recs = []
    for cfg in ("none", "auto"):
        recs += [_rec(cfg, "g/a", "grounded-rename", 10.0 * (2 if cfg == "auto" else 1)),
                 _rec(cfg, "g/b", "grounded-fix-bug", 10.0 * (8 if cfg == "auto" else 1)),
                 _rec(cfg, "g/c", "grounded-summary", 10.0 * (5 if cfg == "auto" else 1))]
    run = {"identity": {}, "records": recs,
           "matrix": {"configs": [{"label": "none"}, {"label": "auto"}],
                      "bootstrap_resamples": 100, "confidence": 0.95, "seed": 0}}
    text = "\n".join(grounded.report_section(run))
    assert "| code edits | 4.00× |" in text  # sqrt(2 * 8), the summary left out
    only_edits = {**run, "records": [r for r in recs if r["prompt_id"] != "g/c"]}
    assert "| code edits |" not in "\n".join(grounded.report_section(only_edits))  # = "all"


def test_the_command_line_says_a_skipped_source_by_name(monkeypatch):
    from click.testing import CliRunner  # the CLI only here: the rest tests the module

    from edgespec.cli import cli

    def median(data):
        return sorted(data)[len(data) // 2]

    monkeypatch.setattr(statistics, "median", median)
    res = CliRunner().invoke(cli, ["bench", "--preset", "grounded-quick", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert ("edgespec: grounded: skipped statistics.median (changed: sha256" in res.output
            and "left out: fix-bug/statistics.median" in res.output)
    assert "2 prompts (4 turns)" in res.output
