"""The web page's routes on a bare FastAPI app (no model): the page and its assets from
package data with their Content-Security-Policy, nothing else from the file system,
--no-web, and the status route's plain rate."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from edgespec.server.errors import install_handlers  # noqa: E402
from edgespec.server.settings import ServerSettings  # noqa: E402
from edgespec.server.web import register  # noqa: E402
from edgespec.server.web.routes import ASSETS, load_assets  # noqa: E402
from edgespec.serving.tickets import QueueLoad  # noqa: E402


class _Cal:
    step_seconds = 0.02
    source = "measured"
    measured_at = 1_700_000_000.0


class _Engine:
    target_name, draft_name, default_proposer, exact = "smol", None, "ngram+suffix", False
    config = SimpleNamespace(parallel=2)
    ctx = SimpleNamespace(n_ctx=1024)
    proposers = {"ngram": object(), "suffix": object()}

    def __init__(self, adaptive: bool = True) -> None:
        self.control = SimpleNamespace(adaptive=adaptive)
        self.calls = 0

    def calibration(self):
        self.calls += 1
        return _Cal()


class _Scheduler:
    def load(self) -> QueueLoad:
        return QueueLoad(1, 2, 2, 16)


class _Pool:
    def __init__(self, engine) -> None:
        self.models = [
            SimpleNamespace(name="smol", aliases=("smol.gguf",), state="loaded", loads=1,
                            error=None, memory=300 << 20, engine=engine, scheduler=_Scheduler()),
            SimpleNamespace(name="other", aliases=(), state="unloaded", loads=1,
                            error="the file is not a GGUF model", memory=0, engine=None,
                            scheduler=None),
        ]

    def entries(self):
        return iter(self.models)

    def load(self) -> QueueLoad:
        return QueueLoad(1, 2, 2, 16)


def _client(web: bool = True, engine=None) -> TestClient:
    app = FastAPI()
    install_handlers(app)
    register(app, _Pool(engine or _Engine()), ServerSettings(served_model="smol", web=web))
    return TestClient(app)


def test_the_page_and_its_assets_carry_a_same_origin_only_policy():
    c = _client()
    r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert c.get("/favicon.ico").content == c.get("/web/favicon.svg").content
    for name, kind in ASSETS.items():
        a = c.get(f"/web/{name}")
        assert a.status_code == 200, name
        assert a.headers["content-type"] == kind
        assert a.headers["x-content-type-options"] == "nosniff"


def test_the_page_names_only_its_own_assets():
    """No external URL anywhere in the page, its script or styles; every asset the page
    links is one the route serves."""
    files = load_assets()
    for name, data in files.items():
        text = data.decode("utf-8")
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), name
        assert "@import" not in text and "url(http" not in text, name
    linked = re.findall(r'(?:src|href)="/web/([^"]+)"', files["index.html"].decode())
    assert linked and set(linked) <= set(ASSETS)


@pytest.mark.parametrize("path", ["/web/../routes.py", "/web/index.html", "/web/nope.js",
                                  "/web/%2e%2e%2froutes.py", "/web/static%2fapp.js"])
def test_nothing_else_is_served_from_the_package(path):
    r = _client().get(path)
    assert r.status_code == 404
    assert "error" in r.json()


def test_no_web_turns_the_page_off_but_keeps_the_status_route():
    c = _client(web=False)
    assert c.get("/").status_code == 404
    assert c.get("/web/app.js").status_code == 404
    assert c.get("/v1/edgespec/status").status_code == 200


def test_status_reports_each_model_and_the_calibrated_plain_rate():
    s = _client().get("/v1/edgespec/status").json()
    assert s["default_model"] == "smol" and s["load"]["slots"] == 2
    smol, other = s["models"]
    assert smol["state"] == "loaded" and smol["proposer"] == "ngram+suffix"
    assert smol["proposers"] == ["none", "ngram", "suffix"]
    assert smol["n_ctx"] == 1024 and smol["load"]["running"] == 2
    assert smol["plain"]["step_seconds"] == 0.02
    assert smol["plain"]["tokens_per_second"] == pytest.approx(50.0)
    assert smol["plain"]["source"] == "measured"
    assert other == {"id": "other", "aliases": [], "state": "unloaded", "loaded": False,
                     "loads": 1, "last_error": "the file is not a GGUF model",
                     "memory_bytes": None}


def test_status_never_measures_a_calibration_the_engine_did_not_load():
    """--no-adaptive loads no calibration; measuring one would stall the model's requests."""
    engine = _Engine(adaptive=False)
    s = _client(engine=engine).get("/v1/edgespec/status").json()
    assert s["models"][0]["plain"] is None and engine.calls == 0


def test_with_an_api_key_the_page_loads_and_its_api_calls_need_the_key():
    """A browser cannot send a header when it opens a page: the page's static files load
    without the key; the routes it calls (status, models, chat) still need it."""
    from edgespec.server import auth

    rejected = []
    app = FastAPI()
    install_handlers(app)
    app.add_middleware(auth.Middleware, api_key="k3y",
                       metrics=SimpleNamespace(reject=lambda *a: rejected.append(a)))
    register(app, _Pool(_Engine()), ServerSettings(served_model="smol"))
    c = TestClient(app)
    assert c.get("/").status_code == 200
    assert c.get("/web/app.js").status_code == 200
    assert c.get("/favicon.ico").status_code == 200
    assert c.get("/v1/edgespec/status").status_code == 401
    assert c.post("/").status_code == 401  # only reading the page is open
    assert c.get("/v1/edgespec/status", headers={"Authorization": "Bearer k3y"}).status_code \
        == 200
    assert len(rejected) == 2


def test_serve_takes_no_web_from_the_flag_the_environment_and_the_file(tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import cli

    conf = tmp_path / "serve.toml"
    conf.write_text("web = false\n")
    empty = tmp_path / "empty.toml"  # not the user's own serve.toml
    empty.write_text("")
    none = {"EDGESPEC_CONFIG": str(empty)}
    for args, env, line in ((["--no-web"], none, "web = false  # flag"),
                            ([], {**none, "EDGESPEC_WEB": "false"}, "web = false  # env"),
                            ([], {"EDGESPEC_CONFIG": str(conf)}, "web = false  # file")):
        r = CliRunner().invoke(cli, ["serve", *args, "--print-config"], env=env)
        assert r.exit_code == 0, r.output
        assert line in r.output.splitlines()
