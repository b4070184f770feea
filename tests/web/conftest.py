"""A real `edgespec serve` on loopback (smollm2-135m under two ids, the free proposers, a
small context) and real headless Chromium driven by selenium, for the web page's tests.

The browser is Debian's ``chromium`` with ``chromium-driver``; `make test` installs them
when it runs as root, and these tests are skipped, saying so, where they are missing.
"""
from __future__ import annotations

import os
import shutil

import pytest

from tools.soak import ServeProcess
from web_env import CTX, MODEL, OTHER, THREADS

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_DRIVERS = ("chromedriver",)
_INSTALL = ("apt-get install -y chromium chromium-driver (as root; `make test` does it "
            "when it runs as root)")


def _find(names: tuple[str, ...]) -> str | None:
    for n in names:
        path = shutil.which(n) or (f"/usr/lib/chromium/{n}"
                                   if os.path.exists(f"/usr/lib/chromium/{n}") else None)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def web_server(model_path):
    model_path(MODEL)
    with ServeProcess(["--target", MODEL, "--ctx", str(CTX), "--threads", THREADS,
                       "--proposer", "ngram+suffix", "--parallel", "1",
                       "--max-tokens-limit", "512", "--extra-model", f"{OTHER}={MODEL}",
                       "--keep-alive", "-1"]) as s:
        yield s


@pytest.fixture(scope="module")
def driver():
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install 'edgespec[test]')")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = _find(_BROWSERS), _find(_DRIVERS)
    if browser is None or chromedriver is None:
        pytest.skip(f"no headless browser here ({'chromium' if browser is None else 'chromedriver'} "
                    f"missing): {_INSTALL}")
    opts = Options()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps"):
        opts.add_argument(arg)
    # every request the page makes, to check that none leaves the machine
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_page_load_timeout(30)
    try:
        yield d
    finally:
        d.quit()
