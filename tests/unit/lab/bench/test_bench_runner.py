"""The runner's protocol on a scripted engine: interleaving, warm-up, histories, parity, Ctrl-C."""
import pytest

from edgespec.lab.bench.anchors.trace import AnchorTrace, trace_to_stats
from edgespec.lab.bench.matrix import ConfigSpec, Matrix
from edgespec.lab.bench.prompts import BenchPrompt
from edgespec.lab.bench.engines import control_settings, plan_engine, renew_clones
from edgespec.lab.bench.results import unit_key
from edgespec.lab.bench.runner import BenchRun, Runner, total_requests
from edgespec.control import ControlSettings
from edgespec.errors import ContextOverflowError, InvalidInputError
from edgespec.api.events import Finished, Step, TokenLogprob
from edgespec.api.stats import RequestStats
from edgespec.api.params import GenerationParams
from fakes import FakeModel, fake_engine, fixed


class FakeTarget:
    def detokenize(self, tokens):
        return " ".join(map(str, tokens)).encode()


class FakeEngine:
    """Answers every request with tokens that depend on the proposer (or a script)."""

    def __init__(self, tokens_for=None, fail=None, interrupt_at=None):
        self.calls = []  # (proposer, messages, max_tokens)
        self.tokens_for = tokens_for or (lambda proposer, n: [1, 2, 3][:n])
        self.fail = fail or (lambda proposer, messages: None)
        self.interrupt_at = interrupt_at
        self.target = FakeTarget()
        self.exact = False
        self.gaps = {}  # call number -> logit gap between the plain token and token 9

    def prompt_tokens(self, messages, params):
        return list(range(10 * len(messages)))

    def stream(self, messages, params, proposer=None):
        self.calls.append((proposer, messages, params.max_tokens))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        err = self.fail(proposer, messages)
        if err is not None:
            raise err
        return self._events(messages, params, proposer)

    def generate(self, messages, params, proposer=None):
        """The plain re-run the runner makes to attribute divergences, with logprobs."""
        self.calls.append(("generate:" + str(proposer), messages, params.max_tokens))
        toks = self.tokens_for(proposer, params.max_tokens)
        gap = self.gaps.get(len(self.calls), 0.3)
        lps = tuple(TokenLogprob(t, -0.1, ((t, -0.1), (9, -0.1 - gap))) for t in toks)
        return type("Result", (), {"tokens": tuple(toks), "logprobs": lps})()

    def _events(self, messages, params, proposer):
        toks = self.tokens_for(proposer, params.max_tokens)
        st = RequestStats(proposer=proposer)
        st.observe_prefill(10 * len(messages), 0.1)
        for i, t in enumerate(toks):
            st.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0,
                            verify_seconds=0.01, elapsed=0.1 + 0.01 * (i + 1))
            yield Step(1, (t,), str(t), ("target",), None, 0, 0, 0.0, 0.01, 0.1 + 0.01 * i)
        st.finish("length", 0.1 + 0.01 * len(toks))
        yield Finished(1, f"answer of {proposer}", tuple(toks), "length", st)


CONFIGS = (ConfigSpec("none"), ConfigSpec("a"), ConfigSpec("b"))
PROMPTS = [
    BenchPrompt("x/1", "writing", ("first?", "second?"), "x"),
    BenchPrompt("x/2", "qa", ("only?",), "x"),
]


def _matrix(**kw):
    return Matrix(target="t", configs=CONFIGS, spec_bench=("writing",), max_new_tokens=3, **kw)


def test_units_rotate_configuration_order_after_a_discarded_warmup():
    eng = FakeEngine()
    run = Runner(_matrix(warmup=1, warmup_tokens=2), eng).run(PROMPTS, BenchRun(_matrix()))
    order = [c[0] for c in eng.calls]
    assert order[:3] == ["none", "a", "b"]  # warm-up
    assert all(c[2] == 2 for c in eng.calls[:3])
    assert order[3:] == ["none", "a", "b", "a", "b", "none", "b", "none", "a"]
    assert run.warmup_discarded == 3
    assert len(run.records) == 9  # 3 units x 3 configurations, warm-up not recorded
    assert total_requests(_matrix(warmup=1), PROMPTS) == 12
    assert [r["position"] for r in run.records[3:6]] == [0, 1, 2]
    assert {(r["prompt_id"], r["turn"]) for r in run.records} == {("x/1", 0), ("x/1", 1), ("x/2", 0)}


def test_second_turn_carries_each_configurations_own_answer():
    eng = FakeEngine()
    Runner(_matrix(warmup=0), eng).run(PROMPTS[:1], BenchRun(_matrix()))
    second = [c for c in eng.calls if len(c[1]) == 3]
    assert len(second) == 3
    for proposer, messages, _ in second:
        assert messages[1] == {"role": "assistant", "content": f"answer of {proposer}"}
        assert messages[2] == {"role": "user", "content": "second?"}


def test_parity_against_the_plain_path():
    eng = FakeEngine(tokens_for=lambda p, n: [1, 2, 9] if p == "b" else [1, 2, 3])
    full = []  # what the sink (records.jsonl) gets: whole records
    run = Runner(_matrix(warmup=0), eng, sink=full.extend).run(PROMPTS[1:], BenchRun(_matrix()))
    parity = {r["config"]: r["parity"] for r in run.records}
    assert parity == {"none": None, "a": True, "b": False}
    assert [r["parity"] for r in full] == [r["parity"] for r in run.records]
    whole = next(r for r in full if r["config"] == "a")
    assert whole["tokens"] == [1, 2, 3] and whole["text"] and len(whole["token_times"]) == 3
    rec = next(r for r in run.records if r["config"] == "a")
    assert "tokens" not in rec and rec["generated_tokens"] == 3 and rec["itl_hist"]
    assert rec["bucket"] == "<256" and rec["category"] == "qa"
    assert rec["rss_peak_bytes"] > 0
    assert rec["pass_size_hist"] == {"1": 3} and rec["pass_seconds"]["1"] == pytest.approx(0.03)
    # "b" left the plain path at token 2 (9 instead of 3): one untimed plain re-run with
    # logprobs, where 9 trailed by 0.3 logits: within batch noise, a near-tie
    div = next(r for r in run.records if r["config"] == "b")["divergence"]
    assert div["position"] == 2 and div["plain_token"] == 3 and div["spec_token"] == 9
    assert div["gap"] == pytest.approx(0.3) and div["kind"] == "near-tie"
    assert [c[0] for c in eng.calls].count("generate:none") == 1
    assert "divergence" not in rec


def test_divergence_beyond_batch_noise_or_in_exact_mode_is_a_defect():
    eng = FakeEngine(tokens_for=lambda p, n: [1, 2, 9] if p == "b" else [1, 2, 3])
    eng.gaps = {4: 5.0}  # the re-run is the 4th call: 9 trailed by 5 logits
    run = Runner(_matrix(warmup=0), eng).run(PROMPTS[1:], BenchRun(_matrix()))
    assert next(r for r in run.records if r["config"] == "b")["divergence"]["kind"] == "defect"
    eng = FakeEngine(tokens_for=lambda p, n: [1, 2, 9] if p == "b" else [1, 2, 3])
    eng.exact = True  # exact mode promises bitwise output: even a near-tie is a defect
    run = Runner(_matrix(warmup=0), eng).run(PROMPTS[1:], BenchRun(_matrix()))
    assert next(r for r in run.records if r["config"] == "b")["divergence"]["kind"] == "defect"


def test_sampling_runs_have_no_parity_and_share_a_seed_per_unit():
    seeds = []
    eng = FakeEngine()
    orig = eng.stream

    def stream(messages, params, proposer=None):
        seeds.append(params.sampling.seed)
        return orig(messages, params, proposer)

    eng.stream = stream
    m = _matrix(warmup=0, temperature=0.7, seed=5)
    run = Runner(m, eng).run(PROMPTS, BenchRun(m))
    assert all(r["parity"] is None for r in run.records)
    assert seeds == [5, 5, 5, 6, 6, 6, 7, 7, 7]


def test_a_failed_turn_is_recorded_and_ends_that_conversation_only():
    def fail(proposer, messages):
        if proposer == "a" and len(messages) == 1:
            return ContextOverflowError("too long")
        return None

    eng = FakeEngine(fail=fail)
    run = Runner(_matrix(warmup=0), eng).run(PROMPTS[:1], BenchRun(_matrix()))
    a = [r for r in run.records if r["config"] == "a"]
    assert a[0]["error"] == "too long"
    assert a[1]["error"].startswith("skipped")
    assert sum("error" not in r for r in run.records) == 4


def test_ctrl_c_keeps_what_was_measured():
    eng = FakeEngine(interrupt_at=5)
    run = Runner(_matrix(warmup=0), eng).run(PROMPTS, BenchRun(_matrix()))
    assert run.interrupted
    assert len(run.records) == 4
    assert run.finished_at >= run.started_at > 0


def test_plan_engine_maps_knobs():
    plan = plan_engine([ConfigSpec("none"), ConfigSpec.make("ngram", {"min_n": 2, "max_draft": 3}),
                        ConfigSpec.make("ngram", {"min_n": 3, "max_draft": 3}),
                        ConfigSpec("suffix"), ConfigSpec.anchor("llama-pld:4"),
                        ConfigSpec("auto"), ConfigSpec.make("ngram+suffix", {"exact": True})])
    assert plan.control == {"ngram[max_draft=3,min_n=2]": {"max_draft": 3},
                            "ngram[max_draft=3,min_n=3]": {"max_draft": 3},
                            "ngram+suffix[exact=True]": {"exact": True}}
    assert plan.proposer_options == {"ngram": {"min_n": 2}}
    assert plan.extra == {"ngram[max_draft=3,min_n=3]": ("ngram", {"min_n": 3})}
    assert plan.request_name == {"none": "none", "ngram[max_draft=3,min_n=2]": "ngram",
                                 "ngram[max_draft=3,min_n=3]": "ngram[max_draft=3,min_n=3]",
                                 "suffix": "suffix", "auto": None,
                                 "ngram+suffix[exact=True]": "ngram+suffix"}
    # "auto" loads the engine as the planner would (None: the engine's default proposer)
    assert plan.auto
    with pytest.raises(InvalidInputError, match="combined configuration"):
        plan_engine([ConfigSpec.make("auto", {"min_n": 2})])
    # fixed lengths and adaptive control side by side; each suffix configuration gets its
    # own tree so none sees another's answer to the same prompt
    plan = plan_engine([ConfigSpec.make("suffix", {"max_draft": 2, "adaptive": False}),
                        ConfigSpec("suffix")])
    assert plan.extra == {"suffix#2": ("suffix", {})}
    assert plan.request_name == {"suffix[adaptive=False,max_draft=2]": "suffix", "suffix": "suffix#2"}
    with pytest.raises(InvalidInputError, match="one draft model"):
        plan_engine([ConfigSpec("draft"), ConfigSpec.make("draft", {"x": 1})])


def test_a_combination_naming_an_opt_in_proposer_has_the_engine_build_it():
    # realign is opt-in: the engine builds it only when asked for, and a combination asks
    plan = plan_engine([ConfigSpec("auto"), ConfigSpec("ngram+suffix+realign")])
    assert plan.proposer_options == {"realign": {}}
    assert plan.request_name["ngram+suffix+realign"] == "ngram+suffix+realign"
    # a configuration's own instances are named by its label without the '+' a request
    # label would split on
    from edgespec.lab.bench.engines import _clone_prefix
    assert _clone_prefix("ngram+suffix+realign") == "ngram_suffix_realign/"
    assert "+" not in _clone_prefix("a+b[max_draft=3]")


def test_controller_tunables_are_control_knobs_typed_like_their_defaults():
    plan = plan_engine([ConfigSpec("auto"),
                        ConfigSpec.make("auto", {"position_calibration": False, "margin": 0})])
    assert plan.control == {"auto[margin=0,position_calibration=False]":
                            {"margin": 0, "position_calibration": False}}
    base = ControlSettings()
    s = control_settings(base, {"margin": 0, "position_calibration": False, "window": 32})
    assert (s.margin, s.position_calibration, s.window) == (0.0, False, 32)
    assert isinstance(s.margin, float) and s.max_draft == base.max_draft
    assert control_settings(base, {"position_calibration": "true"}).position_calibration is True
    with pytest.raises(InvalidInputError, match="true or false"):
        control_settings(base, {"position_calibration": "maybe"})
    with pytest.raises(InvalidInputError, match="takes a float"):
        control_settings(base, {"margin": "lots"})
    with pytest.raises(InvalidInputError, match="margin must be >= 0"):
        control_settings(base, {"margin": -1})


def test_anchor_trace_rebuilds_per_pass_statistics():
    # prompt of 10 tokens; the first token comes from the prefill, then three passes:
    # pass 1 at length 11 drafted 4, next pass starts at 14 -> emitted 3 (2 accepted + 1);
    # pass 2 at 14 drafted 0 -> 1 token; pass 3 at 15 drafted 2 -> both accepted + bonus,
    # the last of which is the end-of-generation token (not emitted)
    tr = AnchorTrace(prompt_tokens=10, tokens=(5, 6, 7, 8, 9, 10, 11),
                     token_times=(0.5, 0.6, 0.6, 0.6, 0.7, 0.8, 0.8), passes=((11, 4), (14, 0), (15, 2)),
                     first_token_seconds=0.5, total_seconds=0.9, stop_reason="eos", eog_time=0.8)
    st = trace_to_stats(tr, "pld")
    assert st.prompt_tokens == 10 and st.prefill_seconds == 0.5
    assert st.generated_tokens == 7
    assert (st.drafted, st.accepted) == (6, 4)
    assert st.verify_passes == 2 and st.plain_steps == 2
    assert dict(st.accepted_length_hist) == {1: 2, 3: 2}
    assert st.position_accepted == [2, 2, 0, 0] and st.position_drafted == [2, 2, 1, 1]
    assert st.ttft_seconds == 0.5 and st.stop_reason == "eos"
    assert st.decode_tokens_per_second == pytest.approx(6 / 0.4)


class KwEngine(FakeEngine):
    """Also takes the per-request control and exact overrides the runner passes."""

    def __init__(self, name, **kw):
        super().__init__(**kw)
        self.name = name
        self.control = ControlSettings()

    def stream(self, messages, params, proposer=None, **kw):
        return super().stream(messages, params, proposer=f"{self.name}:{proposer}")


def test_exact_configurations_run_on_the_exact_engine_against_its_plain_path():
    # the default engine's plain text (KV f16) differs from the exact engine's (q8_0):
    # that is no divergence; only the exact engine's own plain path is the exact reference
    configs = (ConfigSpec("none"), ConfigSpec.make("none", {"exact": True}),
               ConfigSpec.make("a", {"exact": True}))
    m = Matrix(target="t", configs=configs, spec_bench=("writing",), max_new_tokens=3,
               warmup=0).with_baseline()
    plan = plan_engine(m.configs)
    assert plan.exact and plan.control["a[exact=True]"] == {"exact": True}
    default = KwEngine("default", tokens_for=lambda p, n: [1, 2, 3])
    exact = KwEngine("exact", tokens_for=lambda p, n: [1, 2, 4] if p.startswith("exact") else [1, 2, 3])
    run = Runner(m, default, control=plan.control, exact_engine=exact).run(PROMPTS[1:], BenchRun(m))
    parity = {r["config"]: r["parity"] for r in run.records}
    assert parity == {"none": None, "none[exact=True]": None, "a[exact=True]": True}
    assert sorted(c[0] for c in exact.calls) == ["exact:a", "exact:none"]
    assert [c[0] for c in default.calls] == ["default:none"]


def test_a_self_configuration_asks_the_engine_to_build_its_own_draft():
    # knob-less, as `--proposer self` is: the engine builds self only when its options name it
    plan = plan_engine([ConfigSpec("none"), ConfigSpec("self"), ConfigSpec("ngram")])
    assert plan.proposer_options == {"self": {}} and plan.request_name["self"] == "self"


def test_the_policy_choice_is_a_control_knob_of_auto():
    from edgespec.control import ControlSettings
    plan = plan_engine([ConfigSpec("none"), ConfigSpec.make("auto", {"policy": "true"})])
    knobs = plan.control[ConfigSpec.make("auto", {"policy": "true"}).label]
    assert control_settings(ControlSettings(), knobs).policy is True


# --- --repeats: rounds over the prompt set ------------------------------------------------
def test_repeats_measure_every_unit_once_per_round_and_keep_rotating():
    eng = FakeEngine()
    m = _matrix(warmup=0, repeats=2)
    run = Runner(m, eng).run(PROMPTS, BenchRun(m))
    assert total_requests(m, PROMPTS) == 18
    assert len(run.records) == 18
    assert [r["round"] for r in run.records] == [0] * 9 + [1] * 9
    # round 1 is round 0 again, prompt by prompt, each unit's order one place further on:
    # with 3 units a round and 3 configurations, unit % 3 alone repeated round 0's orders
    assert [r["prompt_id"] for r in run.records[9:]] == [r["prompt_id"] for r in run.records[:9]]
    assert [r["config"] for r in run.records[:3]] == ["none", "a", "b"]
    assert [r["config"] for r in run.records[9:12]] == ["a", "b", "none"]
    for i in range(0, 9, 3):  # every unit: another configuration first in round 1
        assert run.records[i]["config"] != run.records[9 + i]["config"]
    assert len({r["unit"] for r in run.records}) == 6
    assert len({unit_key(r) for r in run.records}) == 6


@pytest.mark.parametrize("n_prompts", [2, 3, 4, 5])
def test_every_round_gives_every_unit_another_order_whatever_the_counts(n_prompts):
    """Defect: 14 units a round and 5 configurations kept every order in both rounds (the
    rotation used the global unit number + round: 14 + 1 is a multiple of 5)."""
    eng = FakeEngine()
    m = _matrix(warmup=0, repeats=3)
    prompts = [BenchPrompt(f"p{i}", "qa", (f"question {i}",), "x") for i in range(n_prompts)]
    run = Runner(m, eng).run(prompts, BenchRun(m))
    n = len(m.configs)
    firsts = {}
    for r in run.records:
        if r["position"] == 0:
            firsts.setdefault(r["prompt_id"], []).append(r["config"])
    for pid, order in firsts.items():
        assert len(order) == 3 and len(set(order)) == min(3, n), (pid, order)


def test_a_new_round_gives_each_configuration_fresh_learning_proposers():
    from edgespec.proposers import free_proposer

    eng = fake_engine(FakeModel(), {"suffix": free_proposer("suffix")}, control=fixed(3))
    eng.clone_proposer("suffix", "cfg/suffix")
    eng.generate("a b a b", GenerationParams(chat=False, max_tokens=6), proposer="cfg/suffix")
    learnt = eng.proposers["cfg/suffix"]
    assert learnt.global_tree.num_sequences >= 1
    assert renew_clones(eng, "cfg", "cfg/suffix+none") == 1
    fresh = eng.proposers["cfg/suffix"]
    assert fresh is not learnt and fresh.global_tree.num_sequences == 0
    assert eng.proposers["suffix"].global_tree.num_sequences == 0  # the source is untouched
    # another configuration's clones and the plain path are left alone
    assert renew_clones(eng, "other", "cfg/suffix") == 0
    assert eng.proposers["cfg/suffix"] is fresh


def test_the_runner_renews_learners_between_rounds_only():
    renewed = []

    class Renewing(FakeEngine):
        proposers = {"suffix": object()}

        def remove_proposer(self, name):
            renewed.append(name)

        def clone_proposer(self, source, as_name, **overrides):
            return as_name

    m = _matrix(warmup=0, repeats=3)
    names = {"none": "none", "a": "a/suffix", "b": "b"}
    Runner(m, Renewing(), request_name=names).run(PROMPTS, BenchRun(m))
    assert renewed == ["a/suffix", "a/suffix"]  # before rounds 1 and 2, not before round 0


def test_repeats_must_be_positive():
    with pytest.raises(InvalidInputError, match="repeats must be >= 1"):
        _matrix(repeats=0).validate()


def test_oracle_references_are_settled_before_the_warmups_per_turn():
    from edgespec.lab.bench.oracle import References

    class Answering(FakeEngine):
        """The plain path answers 4 5 6; the oracle's own passes answer 4 5 7 (a near-tie
        its batched pass decides otherwise), whatever it drafted."""

        def generate(self, messages, params, proposer=None, control=None):
            self.calls.append(("generate:" + str(proposer), messages, params.max_tokens,
                               control))
            toks = (4, 5, 6) if proposer == "none" else (4, 5, 7)
            return type("Result", (), {"tokens": toks, "text": f"{proposer} {len(messages)}"})()

        def stream(self, messages, params, proposer=None, control=None):
            return super().stream(messages, params, proposer)

    eng = Answering()
    eng.control = ControlSettings()
    refs = References()
    cfgs = (ConfigSpec("none"), ConfigSpec("oracle"))
    m = Matrix(target="t", configs=cfgs, spec_bench=("writing",), max_new_tokens=3, warmup=1,
               warmup_tokens=2)
    Runner(m, eng, references={"oracle": refs},
           control={"oracle": {"adaptive": False, "max_draft": 16}}).run(PROMPTS, BenchRun(m))
    pre = [c for c in eng.calls if c[0].startswith("generate:")]
    # per turn: the plain answer once, then the oracle until it reproduces its reference
    assert [c[0] for c in pre[:3]] == ["generate:none", "generate:oracle", "generate:oracle"]
    assert eng.calls.index(pre[-1]) < eng.calls.index(next(c for c in eng.calls if c[2] == 2))
    assert all(c[3].adaptive is False and c[3].max_draft == 16 for c in pre[1:3])
    # the second turn continues the oracle's own first answer
    second = next(c for c in pre if len(c[1]) == 3)
    assert second[1][1] == {"role": "assistant", "content": "oracle 1"}
    assert len(refs) == 2 and refs.get(list(range(30))) == (4, 5, 7)
    assert refs.get(list(range(10))) == (4, 5, 7)
