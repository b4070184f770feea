"""A loopback server that a web page cannot use (issue #43 item 10) and every error in the
JSON shape, malformed HTTP included (item 7): the Host, Origin and Content-Type checks, the
API key from a file, the minimal liveness check; on a real `edgespec serve` and on the pure
pieces (edgespec.server.guard, auth)."""
from __future__ import annotations

import json
import os
import socket

import pytest
from click.testing import CliRunner
from server_env import MODEL, base_args

from edgespec.cli import cli
from edgespec.protocol.errors import ProtocolError
from edgespec.server.auth import authorized, read_key_file
from edgespec.server.guard import HostPolicy, check_origin, is_json, normal_host, refusal
from tools.soak import ServeProcess

KEY = "file-key-31d9"
AUTH = {"Authorization": f"Bearer {KEY}"}
ONE = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 1, "temperature": 0.0}


@pytest.fixture(scope="module")
def guarded(model_path, tmp_path_factory):
    """The key from a file (not on the command line), one extra host name, one CORS origin."""
    model_path(MODEL)
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with ServeProcess(base_args("--proposer", "none", "--api-key-file", str(key_file),
                                "--allow-host", "box.test", "--cors-origin", "http://ok.test",
                                "--max-tokens-limit", "8")) as s:
        yield s


def raw(server, data: bytes) -> bytes:
    """Send ``data`` as is; everything the server answers before it closes."""
    with socket.create_connection((server.host, server.port), timeout=10) as c:
        c.sendall(data)
        out = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                return out
            out += chunk


def json_body(response: bytes) -> dict:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return json.loads(body)


def generated(server) -> float:
    _, _, body = server.request("GET", "/metrics", headers=AUTH)
    for line in body.decode().splitlines():
        if line.startswith("edgespec_generation_tokens_total "):
            return float(line.split()[1])
    return 0.0


# --- on a real server -----------------------------------------------------------------------
def test_a_foreign_host_name_is_refused_on_every_route(guarded):
    """DNS rebinding: a page on attacker.example resolved to 127.0.0.1 sends that Host."""
    for path in ("/v1/models", "/health", "/v1/completions", "/api/tags", "/"):
        status, _, body = guarded.request("GET", path, headers={**AUTH,
                                                                 "Host": "attacker.example"})
        assert status == 403, (path, body)
        err = json.loads(body)
        message = err["error"] if isinstance(err["error"], str) else err["error"]["message"]
        assert "attacker.example" in message and "--allow-host" in message
    for host in (f"localhost:{guarded.port}", f"127.0.0.1:{guarded.port}", "box.test",
                 f"[::1]:{guarded.port}", "LOCALHOST."):
        status, _, body = guarded.request("GET", "/v1/models", headers={**AUTH, "Host": host})
        assert status == 200, (host, body)


def test_a_cross_origin_post_is_refused_without_a_preflight(guarded):
    """A page may send a 'simple' text/plain POST without asking first: it must not run."""
    before = generated(guarded)
    for headers in ({"Origin": "http://evil.test", "Content-Type": "text/plain"},
                    {"Origin": "http://evil.test"},
                    {"Origin": "null"}):
        status, _, body = guarded.request("POST", "/v1/completions", json.dumps(ONE).encode(),
                                          {**AUTH, **headers})
        assert status == 403, body
        assert json.loads(body)["error"]["code"] == "origin_not_allowed"
    assert generated(guarded) == before  # nothing ran
    # the allowed origin, and the server's own (its web page), pass
    for origin in ("http://ok.test", f"http://127.0.0.1:{guarded.port}"):
        status, _, body = guarded.request("POST", "/v1/completions", ONE,
                                          {**AUTH, "Origin": origin})
        assert status == 200, (origin, body)


def test_json_routes_take_json_only(guarded):
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"):
        status, _, body = guarded.request("POST", "/v1/completions", json.dumps(ONE).encode(),
                                          {**AUTH, "Content-Type": kind})
        err = json.loads(body)["error"]
        assert status == 415 and err["code"] == "unsupported_media_type", body
        assert "application/json" in err["message"]
    # what real clients send: application/json (with a charset), and nothing (http.client)
    status, _, _ = guarded.request("POST", "/v1/completions", ONE,
                                   {**AUTH, "Content-Type": "application/json; charset=utf-8"})
    assert status == 200
    conn = guarded.connect()
    conn.request("POST", "/v1/completions", body=json.dumps(ONE), headers=AUTH)
    assert conn.getresponse().status == 200
    conn.close()


def test_the_key_from_a_file_guards_every_route_but_a_minimal_liveness_check(guarded):
    from openai import AuthenticationError, OpenAI
    with open(f"/proc/{guarded.pid}/cmdline", "rb") as f:
        assert KEY.encode() not in f.read()  # not in the process table
    for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                         ("GET", "/v1/models/" + MODEL)):
        status, _, body = guarded.request(method, path, ONE if method == "POST" else None)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", path
    status, _, body = guarded.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}  # nothing about the models
    status, _, body = guarded.request("GET", "/health", headers=AUTH)
    assert status == 200 and json.loads(body)["model"] == MODEL
    status, _, _ = guarded.request("POST", "/v1/completions", ONE, {"x-api-key": KEY})
    assert status == 200  # Anthropic's header
    with OpenAI(base_url=guarded.base_url + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(AuthenticationError):
            c.models.list()
    with OpenAI(base_url=guarded.base_url + "/v1", api_key=KEY, max_retries=0) as c:
        assert c.completions.create(**ONE).choices[0].text is not None


@pytest.mark.parametrize("length", [b"-5", b"abc", b"1e3", b"5, 6"])
def test_malformed_http_is_answered_in_the_json_shape(guarded, length):
    out = raw(guarded, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                       + length + b"\r\n\r\n{}")
    assert out.startswith(b"HTTP/1.1 400"), out
    err = json_body(out)["error"]
    assert err["code"] == "malformed_http" and "Content-Length" in err["message"]
    out = raw(guarded, b"NOT A REQUEST\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400") and json_body(out)["error"]["code"] == "malformed_http"
    assert guarded.request("GET", "/health")[0] == 200  # and the server keeps serving
    _, _, body = guarded.request("GET", "/metrics", headers=AUTH)
    assert 'edgespec_requests_rejected_total{code="malformed_http",status="400"}' in \
        body.decode()  # counted like every refusal


# --- the CLI --------------------------------------------------------------------------------
def test_the_key_comes_from_one_place(tmp_path):
    key = tmp_path / "key"
    key.write_text(KEY)
    r = CliRunner().invoke(cli, ["serve", "--api-key", "x", "--api-key-file", str(key),
                                 "--target", "/nonexistent.gguf"])
    assert r.exit_code == 2 and "pass one" in r.output
    r = CliRunner().invoke(cli, ["serve", "--print-config"], env={"EDGESPEC_API_KEY": KEY})
    assert r.exit_code == 0 and 'api-key = "***"  # env' in r.output and KEY not in r.output


def test_a_key_file_must_hold_a_key(tmp_path):
    from edgespec.errors import InvalidInputError
    empty = tmp_path / "empty"
    empty.write_text("\n  \n")
    with pytest.raises(InvalidInputError, match="empty"):
        read_key_file(empty)
    with pytest.raises(InvalidInputError, match="no-such"):
        read_key_file(tmp_path / "no-such")
    shared = tmp_path / "shared"
    shared.write_text(" k1 \nignored\n")
    os.chmod(shared, 0o644)
    key, warning = read_key_file(shared)
    assert key == "k1" and "chmod 600" in warning
    os.chmod(shared, 0o600)
    assert read_key_file(shared) == ("k1", None)


# --- the pure pieces ------------------------------------------------------------------------
def test_host_names_are_compared_bare():
    assert normal_host("[::1]:8080") == "::1" and normal_host("LocalHost.:80") == "localhost"
    assert normal_host("::1") == "::1" and normal_host("box.test") == "box.test"
    loop = HostPolicy.for_bind(["127.0.0.1"], [".corp.test", "box.test"])
    for ok in ("localhost", "127.0.0.1", "::1", "box.test", "corp.test", "a.b.corp.test"):
        assert loop.allows(ok), ok
    for bad in ("attacker.example", "10.0.0.1", "localhost.attacker.example", "xcorp.test",
                "box.test.evil"):
        assert not loop.allows(bad), bad
    anywhere = HostPolicy.for_bind(["0.0.0.0"])  # every interface: any IP literal, no names
    assert anywhere.allows("192.168.1.20") and not anywhere.allows("attacker.example")
    assert HostPolicy.for_bind(["127.0.0.1"], ["*"]).allows("anything.test")


def test_origins_and_content_types():
    assert check_origin("http://127.0.0.1:8080", "127.0.0.1:8080", "http", ())
    assert not check_origin("http://127.0.0.1:9999", "127.0.0.1:8080", "http", ())
    assert not check_origin("https://127.0.0.1:8080", "127.0.0.1:8080", "http", ())
    assert not check_origin("null", "127.0.0.1:8080", "http", ())
    assert check_origin("http://a.test", None, "http", ("http://a.test",))
    assert check_origin("http://b.test", None, "http", ("*",))
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert is_json("application/vnd.api+json")
    assert not is_json("text/plain") and not is_json("text/json+x") and not is_json("")


def test_refusals_take_the_shape_of_the_route_dialect():
    err = ProtocolError(403, "no", kind="permission", code="host_not_allowed")
    for path, check in (("/api/chat", lambda b: b == {"error": "no"}),
                        ("/v1/messages", lambda b: b == {"type": "error", "error": {
                            "type": "permission_error", "message": "no"}}),
                        ("/v1/completions", lambda b: b["error"]["code"] == "host_not_allowed"),
                        ("/infill", lambda b: b["error"]["message"] == "no")):
        status, headers, body = refusal(path, err)
        assert status == 403 and (b"content-type", b"application/json") in headers
        assert check(json.loads(body)), path


def test_the_key_comparison():
    assert authorized("k", "Bearer k") and authorized("k", "bearer  k ")
    assert authorized("k", None, "k") and authorized("k", "", "k")
    for header, x in ((None, None), ("Bearer kk", None), ("Basic k", None), ("k", None),
                      (None, "kk"), ("Bearer wrong", "k")):
        assert not authorized("k", header, x), (header, x)
