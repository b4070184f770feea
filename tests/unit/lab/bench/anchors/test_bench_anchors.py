"""Anchors: names, pairing with their own plain paths, llama.cpp tool command lines and output
parsers (on output captured from real runs), presets, and the report's anchor tables."""
import json
import math
from pathlib import Path

import pytest

from edgespec.lab.bench import tools
from edgespec.lab.bench.anchors import build
from edgespec.lab.bench.anchors import own_plain, parse_anchor
from edgespec.errors import InvalidInputError
from edgespec.lab.bench.compose import Flags, compose
from edgespec.lab.bench.matrix import BASELINE, ConfigSpec, Matrix
from edgespec.lab.bench.presets import preset
from edgespec.lab.bench.prompts import (LONG_CODE, LONG_SUMMARY, SPEC_BENCH_CATEGORIES,
                                    long_code_prompt, long_summary_prompt, load_long)
from edgespec.lab.bench.report import render_markdown
from edgespec.lab.bench.results import pass_cost, speedup_table
from edgespec.lab.bench.records import tool_prompt_text, tool_record
from edgespec.lab.bench.runner import collect_prompts
from edgespec.errors import InvalidInputError

DATA = Path(__file__).resolve().parents[4] / "data" / "anchors"


# --- names -----------------------------------------------------------------------------
def test_anchor_names_and_their_own_plain_paths():
    assert parse_anchor("llama-lookup") == ("llama-lookup", None)
    assert parse_anchor("llama-lookup:4") == ("llama-lookup", 4)
    assert parse_anchor("llama-pld") == ("llama-pld", 10)
    assert own_plain("llama-lookup:4") == "llama-completion"
    assert own_plain("llama-pld:10") == "llama-pld:0" and own_plain("llama-pld:0") is None
    assert own_plain("llama-completion") is None
    with pytest.raises(InvalidInputError, match="known anchors: llama-completion, llama-lookup"):
        parse_anchor("llama-fast")
    with pytest.raises(InvalidInputError, match="takes no :N"):
        parse_anchor("llama-completion:3")
    with pytest.raises(InvalidInputError, match="whole number"):
        parse_anchor("llama-lookup:x")


def test_with_baseline_adds_each_anchors_plain_path_once():
    m = Matrix(configs=(ConfigSpec("ngram"), ConfigSpec.anchor("llama-lookup"),
                        ConfigSpec.anchor("llama-lookup:5"), ConfigSpec.anchor("llama-pld:2")))
    m = m.with_baseline().validate()
    assert m.labels == ["none", "ngram", "llama-completion", "llama-lookup", "llama-lookup:5",
                        "llama-pld:0", "llama-pld:2"]
    assert [c.baseline for c in m.configs] == ["none", "none", "none", "llama-completion",
                                               "llama-completion", "none", "llama-pld:0"]
    with pytest.raises(InvalidInputError, match="own plain path is missing: llama-completion"):
        Matrix(configs=(ConfigSpec(BASELINE), ConfigSpec.anchor("llama-lookup"))).validate()


# --- presets -----------------------------------------------------------------------------
def test_standard_preset_is_three_per_category_plus_ten_humanevalfix():
    m = preset("standard")
    prompts = collect_prompts(m)
    cats = [p.category for p in prompts]
    assert all(cats.count(c) == 3 for c in SPEC_BENCH_CATEGORIES)
    assert cats.count("humanevalfix") == 10 and len(prompts) == 49
    assert all(len(p.turns) == 1 for p in prompts) and m.max_new_tokens == 128
    assert m.labels == ["none", "none[exact=True]", "auto", "auto[exact=True]", "llama-completion",
                        "llama-lookup"]


def test_long_preset_prompts_grow_with_their_targets():
    m = preset("long")
    prompts = collect_prompts(m)
    assert [p.id for p in prompts] == ["long/summary-2048", "long/code-2048", "long/summary-4096",
                                       "long/code-4096", "long/summary-8192", "long/code-8192"]
    assert {p.category for p in prompts} == {LONG_SUMMARY, LONG_CODE}
    sizes = [len(p.turns[0]) for p in prompts]
    assert sizes[0] < sizes[2] < sizes[4] and sizes[1] < sizes[3] < sizes[5]
    # about 4 characters a token: the 8k prompts are 25k-40k characters
    assert 25_000 < sizes[4] < 40_000 and 22_000 < sizes[5] < 32_000
    assert m.n_ctx >= 8192 + 2048  # the engine needs the room
    assert "Article 3:" in prompts[0].turns[0] and "# file: edgespec/" in prompts[1].turns[0]


def test_long_prompt_builders_on_literal_inputs():
    text = long_summary_prompt(["a" * 400, "b" * 400, "c" * 400], target_tokens=150)
    assert "Article 2:" in text and "Article 3:" not in text  # 2 articles reach 630 chars
    code = long_code_prompt([("x.py", "line\n" * 100)], target_tokens=30)
    assert code.count("line\n") == 20 and "return the complete updated code" in code


def test_compose_drops_the_draft_anchor_without_a_draft_and_marks_changes():
    m = compose(Flags(preset="standard", no_anchor=True))
    assert m.labels == ["none", "none[exact=True]", "auto", "auto[exact=True]"]
    assert m.preset == "standard, modified"
    m = compose(Flags(preset="quick", long="1024", categories="none",
                      scalars=(("humanevalfix", 0),)))
    assert m.long == (1024,) and m.spec_bench == ()
    # --anchor replaces the preset's anchors; with --no-anchor as well it used to drop them
    m = compose(Flags(preset="grounded-quick", anchors=("llama-completion",)))
    assert [c.proposer for c in m.configs if c.kind == "anchor"] == ["llama-completion"]
    with pytest.raises(InvalidInputError, match="one or the other"):
        compose(Flags(preset="grounded-quick", no_anchor=True, anchors=("llama-completion",)))


# --- llama.cpp tools ----------------------------------------------------------------------
def test_parse_completion_output_captured_from_a_real_run():
    t = tools.parse_completion((DATA / "llama-completion.stderr.txt").read_text())
    sample = json.loads((DATA / "expected.json").read_text())["llama-completion"]
    assert t.prompt_tokens == sample["prompt_tokens"] and t.decode_tokens == sample["eval_runs"]
    assert t.generated == sample["eval_runs"] + 1
    # decode = eval time + the samples after the first
    expect = sample["eval_ms"] / 1000 + sample["sampling_ms"] / 1000 * t.decode_tokens / t.generated
    assert t.decode_seconds == pytest.approx(expect)
    assert t.decode_tokens_per_second == pytest.approx(t.decode_tokens / expect)
    assert t.drafted is None


def test_parse_lookup_output_captured_from_a_real_run():
    text = (DATA / "llama-lookup.stderr.txt").read_text()
    t = tools.parse_speculative(text, "llama-lookup")
    sample = json.loads((DATA / "expected.json").read_text())["llama-lookup"]
    assert (t.prompt_tokens, t.generated, t.drafted, t.accepted) == (
        sample["prompt_tokens"], sample["n_predict"], sample["n_drafted"], sample["n_accept"])
    assert t.decode_seconds == pytest.approx(sample["decoded_seconds"])
    # lookup samples its first token from the prompt's logits: the loop computed n_predict - 1
    assert t.decode_tokens == sample["n_predict"] - 1
    assert t.passes == sample["n_predict"] - 1 - sample["n_accept"]
    # only llama-completion prints its build's features
    assert tools.parse_system_info(text) is None
    info = tools.parse_system_info((DATA / "llama-completion.stderr.txt").read_text())
    assert info.startswith("system_info: n_threads = 2") and "REPACK = 1" in info


def test_speculative_simple_computes_its_first_token_in_the_loop():
    text = ("encoded   40 tokens in    0.500 seconds, speed:   80.000 t/s\n"
            "decoded   17 tokens in    1.000 seconds, speed:   17.000 t/s\n"
            "n_draft   = 8\nn_predict = 17\nn_drafted = 24\nn_accept  = 12\n")
    t = tools.parse_speculative(text, "llama-speculative-simple")
    assert t.decode_tokens == 17 and t.passes == 5 and t.decode_tokens_per_second == 17.0


def test_unreadable_tool_output_names_the_missing_line():
    with pytest.raises(tools.ToolOutputError, match="printed no 'decoded' line"):
        tools.parse_speculative("encoded 3 tokens in 0.1 seconds", "llama-lookup")
    with pytest.raises(tools.ToolOutputError, match="prompt eval time"):
        tools.parse_completion("main: error: unable to load model\n")


def _setup(tmp_path, **kw):
    return tools.ToolSetup(bin_dir=tmp_path, model=Path("/m/t.gguf"), n_ctx=4096, threads=2, **kw)


def test_command_lines_carry_the_engines_settings(tmp_path):
    cmd = tools.command("llama-completion", _setup(tmp_path, llama_defaults=False), Path("p.txt"), 64)
    assert cmd[0] == str(tmp_path / "llama-completion")
    s = " ".join(cmd)
    for part in ("-m /m/t.gguf", "-f p.txt", "-n 64", "-c 4096", "-t 2", "-tb 2", "-fa on",
                 "-ctk q8_0", "-ctv q8_0", "--no-escape", "--temp 0 --top-k 1", "-no-cnv",
                 "--no-display-prompt"):
        assert part in s, part
    assert "--no-repack" not in cmd
    cmd = tools.command("llama-lookup", _setup(tmp_path, repack=False, flash_attn=False,
                                               llama_defaults=False),
                        Path("p.txt"), 8, draft_max=4, temperature=0.7, seed=3)
    s = " ".join(cmd)
    assert "-no-cnv" not in cmd and "--no-repack" in cmd and "-fa off" in s
    assert "--spec-draft-n-max 4" in s and "--temp 0.7" in s and "--seed 3" in s
    with pytest.raises(Exception, match="needs the bench's draft model"):
        tools.command("llama-speculative-simple", _setup(tmp_path), Path("p.txt"), 8)


def test_anchors_run_llamas_own_kernel_defaults_unless_asked(tmp_path):
    # what a user would otherwise run: no KV type, flash-attention or repack flags of ours
    cmd = tools.command("llama-completion", _setup(tmp_path, repack=False, flash_attn=False),
                        Path("p.txt"), 64)
    assert not {"-fa", "-ctk", "-ctv", "--no-repack"} & set(cmd)
    assert "-t" in cmd and "-c" in cmd


def test_missing_tools_say_how_to_build_them(tmp_path):
    with pytest.raises(tools.AnchorsNotBuiltError, match=r"llama-lookup not found .*make anchors"):
        tools.check_built(["llama-lookup"], tmp_path)
    exe = tmp_path / "llama-lookup"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert tools.check_built(["llama-lookup"], tmp_path) == tmp_path


def test_a_crashing_tool_reports_its_stderr_tail(tmp_path):
    exe = tmp_path / "llama-lookup"
    exe.write_text("#!/bin/sh\necho 'loading model' >&2\necho 'GGML_ASSERT(n > 0) failed' >&2\n"
                   "exit 134\n")
    exe.chmod(0o755)
    with pytest.raises(Exception, match=r"(?s)exited with status 134; stderr ends: .*GGML_ASSERT"):
        tools.run_tool("llama-lookup", _setup(tmp_path), "hi", 4)


def test_a_tool_run_on_a_fake_program_is_parsed_and_its_echo_stripped(tmp_path):
    exe = tmp_path / "llama-lookup"
    exe.write_text("#!/bin/sh\nprintf '\\n\\nPROMPT text GENERATED\\n\\n'\n"
                   "cat >&2 <<'E'\nencoded    5 tokens in    0.100 seconds, speed: 50 t/s\n"
                   "decoded    9 tokens in    0.400 seconds, speed: 22 t/s\n"
                   "n_drafted    = 6\nn_accept     = 3\nE\n")
    exe.chmod(0o755)
    run = tools.run_tool("llama-lookup", _setup(tmp_path), "PROMPT text", 8)
    assert run.text == " GENERATED" and run.timing.decode_tokens == 8
    rec = tool_record(run, 8)
    assert rec["decode_tokens_per_second"] == pytest.approx(20.0)
    assert rec["acceptance_rate"] == 0.5 and rec["verify_passes"] == 5
    assert rec["stop_reason"] == "length" and rec["tokens"] == []


class _Tok:
    """Tokenizes characters; BOS '^' is added by the tokenizer when add_special."""
    bos = 0

    def __init__(self, adds_bos):
        self.adds_bos = adds_bos

    def tokenize(self, text, add_special=True, parse_special=True):
        toks = [0 if c == "^" else ord(c) for c in text]
        return ([0] if add_special and self.adds_bos else []) + toks

    def detokenize(self, tokens, special=False):
        return "".join("^" if t == 0 else chr(t) for t in tokens).encode()


def test_tool_prompt_text_gives_the_tools_exactly_our_tokens():
    assert tool_prompt_text(_Tok(False), [0, 104, 105]) == "^hi"
    # a tokenizer that adds BOS itself must not see the template's BOS twice
    assert tool_prompt_text(_Tok(True), [0, 104, 105]) == "hi"
    with pytest.raises(Exception, match="does not tokenize back"):
        tool_prompt_text(_Tok(True), [104, 105])


def test_anchors_build_is_idempotent_per_version_and_flags(tmp_path):
    args = ("-DGGML_NATIVE=OFF",)
    assert not build.is_current(tmp_path, "0.3.36", args)
    for t in build.TOOL_TARGETS:
        (tmp_path / t).write_text("")
        (tmp_path / t).chmod(0o755)
    (tmp_path / "BUILD.json").write_text(json.dumps(
        {**build._stamp("0.3.36", args), "build_seconds": 1.0}))
    assert build.is_current(tmp_path, "0.3.36", args)
    assert "llama-server" in build.TOOL_TARGETS  # tools/bench_serve.py's anchor
    (tmp_path / "llama-server").unlink()  # a tool missing: rebuild
    assert not build.is_current(tmp_path, "0.3.36", args)
    (tmp_path / "llama-server").write_text("")
    (tmp_path / "llama-server").chmod(0o755)
    assert not build.is_current(tmp_path, "0.3.37", args)
    assert not build.is_current(tmp_path, "0.3.36", ("-DGGML_CUDA=on",))


def test_a_new_tool_builds_in_the_existing_tree_and_new_flags_start_over(tmp_path, monkeypatch):
    """llama-quantize (`edgespec models optimize`) joined the tools after builds existed:
    with the same version and flags the tree is reused (no new sources, no clean tree)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    assert "llama-quantize" in build.TOOL_TARGETS
    args, root, bin_dir = ("-DGGML_NATIVE=OFF",), build.anchors_root("0.3.36"), tmp_path / "bin"
    (root / "llama.cpp").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "build" / "CMakeCache.txt").write_text("kept")
    bin_dir.mkdir()
    (bin_dir / build.STAMP).write_text(json.dumps(
        {"llama_cpp_python": "0.3.36", "cmake_args": list(args), "targets": ["llama-completion"]}))
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        if "--build" in cmd:
            (root / "build" / "bin").mkdir(exist_ok=True)
            for t in build.TOOL_TARGETS:
                (root / "build" / "bin" / t).write_text("")
                (root / "build" / "bin" / t).chmod(0o755)

    def no_fetch(version, dest):
        raise RuntimeError("fetched the sources again")

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "fetch_sdist", no_fetch)
    build.build(args, bin_dir=bin_dir, version="0.3.36")
    assert (root / "build" / "CMakeCache.txt").read_text() == "kept"
    assert "llama-quantize" in ran[-1] and build.is_current(bin_dir, "0.3.36", args)
    with pytest.raises(RuntimeError, match="fetched the sources again"):  # other flags: anew
        build.build(("-DGGML_CUDA=on",), bin_dir=bin_dir, version="0.3.36")


# --- report -----------------------------------------------------------------------------------
def _rec(config, prompt, cat, tps, kind="engine", **kw):
    r = {"config": config, "prompt_id": prompt, "category": cat, "turn": 0, "kind": kind,
         "decode_tokens_per_second": tps, "e2e_seconds": 10.0 / tps, "drafted": 0, "accepted": 0,
         "acceptance_rate": 0.0, "accepted_length_hist": {"1": 3}, "token_times": [0.1, 0.2],
         "parity": None, "proposer_share": {}, "ttft_seconds": 0.1, "prefill_seconds": 0.1,
         "rss_peak_bytes": 0, "bucket": "<256", "generated_tokens": 8, "verify_passes": None}
    r.update(kw)
    return r


def _run(records):
    configs = [{"label": "none"}, {"label": "suffix"},
               {"label": "llama-completion", "kind": "anchor", "baseline": "none"},
               {"label": "llama-lookup", "kind": "anchor", "baseline": "llama-completion"}]
    return {"identity": {}, "matrix": {"configs": configs, "max_new_tokens": 8, "temperature": 0.0,
                                       "buckets": [256], "bootstrap_resamples": 200, "seed": 0},
            "records": records}


RECORDS = [
    _rec("none", "p1", "summarization", 10.0, pass_size_hist={"1": 7}, pass_seconds={"1": 0.7}),
    _rec("suffix", "p1", "summarization", 15.0, pass_size_hist={"1": 2, "4": 2},
         pass_seconds={"1": 0.2, "4": 0.36}, parity=False,
         divergence={"kind": "near-tie", "position": 5, "gap": 0.4, "gap_is_bound": False}),
    _rec("llama-completion", "p1", "summarization", 12.0, kind="anchor"),
    _rec("llama-lookup", "p1", "summarization", 24.0, kind="anchor", drafted=10, accepted=9,
         accepted_length_hist={}, verify_passes=2, generated_tokens=9),
]


def test_anchor_ratios_are_to_their_own_plain_path():
    t = speedup_table(_run(RECORDS))
    assert t["summarization"]["suffix"].decode.estimate == pytest.approx(1.5)
    assert t["summarization"]["llama-completion"].decode.estimate == pytest.approx(1.2)
    assert t["summarization"]["llama-lookup"].decode.estimate == pytest.approx(2.0)  # 24 / 12


def test_pass_cost_in_plain_steps():
    cost, size = pass_cost(_run(RECORDS), "suffix")
    # a 4-token pass took 0.18 s; a plain step 0.1 s
    assert cost == pytest.approx(1.8) and size == pytest.approx((2 + 8) / 4)
    assert math.isnan(pass_cost(_run(RECORDS[:1]), "suffix")[0])


def test_markdown_shows_anchors_pass_sizes_plain_paths_and_divergences():
    md = render_markdown(_run(RECORDS))
    assert "llama-lookup (vs llama-completion)" in md
    assert "| summarization | 1.50× (n=1) | 1.20× (n=1) | 2.00× (n=1) |" in md
    assert "### Plain paths" in md and "| llama-completion | 0.83× (n=1) |" in md
    assert "## Verify pass sizes" in md and "| summarization | 4 | 2.50 | 1:50% 4:50% |" in md
    assert "## Divergences from the plain path" in md and "| suffix | p1 | 0 | 5 | 0.400 | near-tie |" in md
    # the tool's acceptance and tokens per pass come from its own counts
    assert "| llama-lookup | 90% | 4.00 |" in md


def test_markdown_shows_draft_tree_figures_only_where_trees_ran():
    from edgespec.lab.bench.results import tree_summary
    assert "## Draft trees" not in render_markdown(_run(RECORDS))
    tree = _rec("suffix", "p2", "summarization", 16.0, drafted=12, accepted=6, verify_passes=3,
                tree_passes=2, tree_nodes=10, tree_branches=4, tree_accepted=5,
                branch_utilisation=0.5)
    t = tree_summary([tree])
    assert t["nodes"] == 5 and t["branches"] == 2 and t["path"] == 2.5 and t["off_first"] == 0.5
    assert t["kept_per_pass"] == 2 and t["drafted_per_pass"] == 4
    md = render_markdown(_run([*RECORDS, tree]))
    assert "## Draft trees" in md
    assert "| suffix | summarization | 2 | 5.00 | 2.00 | 2.50 | 50% | 2.00 / 4.00 |" in md


def test_every_configuration_is_also_reported_against_llama_completion():
    from edgespec.lab.bench.results import OVERALL, vs_llama_table
    t = vs_llama_table(_run(RECORDS))
    row = t["summarization"]
    assert row["none"].decode.estimate == pytest.approx(10 / 12)  # our plain path
    assert row["suffix"].decode.estimate == pytest.approx(15 / 12)
    assert row["llama-lookup"].decode.estimate == pytest.approx(2.0)
    assert "llama-completion" not in row and OVERALL in t
    md = render_markdown(_run(RECORDS))
    assert "## Against llama-completion" in md
    assert "| summarization | 0.83× (n=1) | 1.25× (n=1) | 2.00× (n=1) |" in md
    # a run without the anchor has no such table
    run = _run(RECORDS[:2])
    run["matrix"]["configs"] = run["matrix"]["configs"][:2]
    assert vs_llama_table(run) == {}


def test_a_draft_tool_gets_the_benchs_draft_when_the_engine_loaded_none(tmp_path):
    """`auto` loads a draft model only where the planner weighs one; the
    llama-speculative-simple anchor still needs the bench's --draft."""
    class Ctx:
        n_ctx, n_threads = 4096, 2

    class Target:
        path = "/m/t.gguf"

    class Engine:
        ctx, target, proposers = Ctx(), Target(), {}

    assert tools.setup_from_engine(Engine(), tmp_path).draft_model is None
    setup = tools.setup_from_engine(Engine(), tmp_path, Path("/m/d.gguf"))
    assert setup.draft_model == Path("/m/d.gguf")
    cmd = tools.command("llama-speculative-simple", setup, tmp_path / "p.txt", 8)
    assert cmd[cmd.index("-md") + 1] == "/m/d.gguf"
    assert cmd[cmd.index("--spec-type") + 1] == "draft-simple"

    class Draft:
        class model:
            path = "/m/loaded.gguf"

    Engine.proposers = {"draft": Draft()}
    assert tools.setup_from_engine(Engine(), tmp_path, Path("/m/d.gguf")).draft_model == Path(
        "/m/loaded.gguf")
