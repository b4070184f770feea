"""`edgespec serve` refuses an exposed address before loading anything."""
from click.testing import CliRunner

from edgespec.cli import cli


def test_a_non_loopback_host_needs_allow_remote():
    r = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--target", "/nonexistent.gguf"])
    assert r.exit_code == 1
    assert "--allow-remote" in r.output and "--api-key" in r.output


def test_loopback_names_are_recognised():
    from edgespec.server.run import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")


def test_flag_beats_env_beats_config_file(tmp_path):
    """--print-config shows each resolved setting and its source, without loading a model."""
    conf = tmp_path / "serve.toml"
    conf.write_text('max-queue = 3\nparallel = 2\nport = 9000\ncors-origin = ["http://a.test"]\n')
    env = {"EDGESPEC_CONFIG": str(conf), "EDGESPEC_PARALLEL": "4", "EDGESPEC_PORT": "9100"}
    r = CliRunner().invoke(cli, ["serve", "--print-config", "--port", "9200"], env=env)
    assert r.exit_code == 0, r.output
    assert "max-queue = 3  # file" in r.output
    assert "parallel = 4  # env" in r.output
    assert "port = 9200  # flag" in r.output
    assert "cors-origin = [\"http://a.test\"]  # file" in r.output


def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path):
    conf = tmp_path / "serve.toml"
    for text, words in (("max-queue = [", "not valid TOML"), ("mystery = 1", "unknown key")):
        conf.write_text(text)
        r = CliRunner().invoke(cli, ["serve", "--print-config"], env={"EDGESPEC_CONFIG": str(conf)})
        assert r.exit_code == 2 and words in r.output
        assert len(r.output.strip().splitlines()) == 1


def test_llama_server_flags_mean_the_same_here(tmp_path):
    """-m/-c/-np/-t/--alias/--no-mmap as llama-server spells them (issue #39); the several-models form
    is --extra-model, so `--model X` cannot silently add a second model."""
    r = CliRunner().invoke(cli, ["serve", "-m", "smollm2-135m", "-c", "2048", "-np", "2",
                                 "-t", "2", "--alias", "coder", "-md", "qwen-0.5b",
                                 "--no-mmap", "--print-config"], env={"EDGESPEC_CONFIG": str(_empty(tmp_path))})
    assert r.exit_code == 0, r.output
    for line in ('target = "smollm2-135m"  # flag', "ctx = 2048  # flag", "parallel = 2  # flag",
                 "threads = 2  # flag", "mmap = false  # flag", 'model-id = "coder"  # flag', 'draft = "qwen-0.5b"  # flag',
                 "extra-model = []  # default"):
        assert line in r.output, r.output
    r = CliRunner().invoke(cli, ["serve", "--model", "smollm2-135m", "--print-config"],
                           env={"EDGESPEC_CONFIG": str(_empty(tmp_path))})
    assert 'target = "smollm2-135m"  # flag' in r.output and "extra-model = []" in r.output


def test_a_draft_no_proposer_reads_is_refused_with_the_fix():
    r = CliRunner().invoke(cli, ["generate", "--proposer", "ngram", "--draft", "qwen-0.5b", "hi"])
    assert r.exit_code == 2
    assert "--draft qwen-0.5b is not used by --proposer ngram" in r.output
    assert "ngram+draft" in r.output


def test_a_mistyped_proposer_or_model_gets_did_you_mean(tmp_path):
    r = CliRunner().invoke(cli, ["generate", "--proposer", "sufix", "hi"])
    assert r.exit_code == 2 and "did you mean 'suffix'?" in r.output
    r = CliRunner().invoke(cli, ["generate", "--target", "qwen-1.5", "--proposer", "none", "hi"],
                           env={"EDGESPEC_HOME": str(tmp_path)})
    assert r.exit_code == 1 and "did you mean 'qwen-1.5b'?" in r.output, r.output


def _empty(tmp_path):
    conf = tmp_path / "serve.toml"
    conf.write_text("")
    return conf
