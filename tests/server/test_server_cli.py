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
