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
