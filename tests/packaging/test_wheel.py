"""A pip install of the wheel works away from the checkout: the registry and prompt sets are
package data, a local .gguf needs no registry, and commands whose extra is missing say which
to install. One wheel and one fresh virtualenv (no --system-site-packages) for the module.

llama-cpp-python comes from the wheel the Makefile built for this CPU (under
$EDGESPEC_HOME/wheels or ~/.cache/edgespec/wheels); the other core dependencies from pip's
index (its HTTP cache makes a second run fast).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _llama_wheel_dirs() -> list[str]:
    homes = [os.environ.get("EDGESPEC_HOME"), str(Path.home() / ".cache" / "edgespec")]
    found = []
    for home in filter(None, homes):
        found += sorted({str(Path(w).parent) for w in glob.glob(
            f"{home}/wheels/*/llama_cpp_python-0.3.36-*.whl")})
    return found


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of a fresh venv with the wheel installed, an environment to run it in)."""
    links = _llama_wheel_dirs()
    if not links:
        pytest.fail("no llama-cpp-python 0.3.36 wheel under ~/.cache/edgespec/wheels; "
                    "run `make install` first")
    root = tmp_path_factory.mktemp("pkg")
    dist = root / "dist"
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
              str(ROOT)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dist.glob("edgespec-*.whl")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    cmd = [str(bindir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           str(wheel)]
    for link in links:
        cmd += ["--find-links", link]
    r = _run(cmd, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("EDGESPEC_MODELS_TOML", "EDGESPEC_BENCH_DATA", "PYTHONPATH",
                        "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return bindir, env


def edgespec(installed, *args, input=None, env=None, timeout=120):
    bindir, base = installed
    # cwd outside the checkout: nothing may be read from it
    return _run([str(bindir / "edgespec"), *args], cwd="/tmp" if os.name != "nt" else None,
                env={**base, **(env or {})}, input=input, timeout=timeout)


def test_the_installed_package_is_not_the_checkout(installed):
    bindir, env = installed
    r = _run([str(bindir / "python"), "-c",
              "import edgespec, edgespec._native; from edgespec import Engine; "
              "print(edgespec.__file__)"], cwd="/tmp", env=env)
    assert r.returncode == 0, r.stderr
    assert str(ROOT) not in r.stdout and "site-packages" in r.stdout


def test_the_tui_ships_inside_the_package_with_its_stylesheet(installed):
    """edgespec.tui is part of the wheel (textual is the [tui] extra, not installed here, so
    the files are looked at rather than imported); no top-level package but edgespec."""
    bindir, env = installed
    r = _run([str(bindir / "python"), "-c",
              "import edgespec, importlib.util, sys; from pathlib import Path; "
              "tui = Path(edgespec.__file__).parent / 'tui'; "
              "print((tui / 'app.tcss').is_file(), (tui / 'app.py').is_file(), "
              "importlib.util.find_spec('tui') is None, 'textual' in sys.modules)"],
             cwd="/tmp", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True", "False"]


def test_models_list_reads_the_shipped_registry(installed):
    r = edgespec(installed, "models", "list")
    assert r.returncode == 0, r.stderr
    assert "smollm2-135m  shipped" in r.stdout and "site-packages" in r.stdout


def test_the_bench_presets_read_the_shipped_prompt_sets(installed):
    r = edgespec(installed, "bench", "--dry-run", "--preset", "standard")
    assert r.returncode == 0, r.stderr
    assert "49 prompts (49 turns)" in r.stdout


def test_generate_with_a_gguf_path_and_with_a_user_registry_name(installed, model_path,
                                                                  tmp_path):
    model = str(model_path("smollm2-135m"))
    r = edgespec(installed, "generate", "--target", model, "--max-tokens", "8",
                 "--proposer", "none", input="Hello")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    # the same file as a name of the user's own registry, in a home of its own; the
    # calibration is copied so that no kernel measurement runs here
    from edgespec import paths
    home = tmp_path / "home"
    if paths.calibration_dir().is_dir():
        shutil.copytree(paths.calibration_dir(), home / "calibration")
    r = edgespec(installed, "models", "add", "my-smol", model, env={"EDGESPEC_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    r = edgespec(installed, "generate", "--target", "my-smol", "--max-tokens", "8",
                 "--proposer", "none", input="Hello", env={"EDGESPEC_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_models_scan_on_a_built_cache(installed, model_path, tmp_path):
    """The GGUF files of an ollama store and a Hugging Face cache (as their tools lay them
    out, around the real smollm2-135m) are listed and resolve, from the wheel alone."""
    from edgespec import registry
    model = model_path("smollm2-135m")
    sha = registry.load_registry().get("smollm2-135m").sha256
    ollama, hub = tmp_path / "ollama", tmp_path / "hf" / "hub"
    (ollama / "blobs").mkdir(parents=True)
    os.symlink(model, ollama / "blobs" / f"sha256-{sha}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"schemaVersion": 2, "layers": [{"mediaType": '
                        f'"application/vnd.ollama.image.model", "digest": "sha256:{sha}", '
                        f'"size": {model.stat().st_size}}}]}}')
    repo = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    commit = "a" * 40
    (repo / "blobs").mkdir(parents=True)
    os.symlink(model, repo / "blobs" / sha)
    (repo / "snapshots" / commit).mkdir(parents=True)
    os.symlink(f"../../blobs/{sha}", repo / "snapshots" / commit / "smollm2.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {"HOME": str(tmp_path), "EDGESPEC_HOME": str(tmp_path / "es"),
           "OLLAMA_MODELS": str(ollama), "HF_HOME": str(tmp_path / "hf")}
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "LLAMA_CACHE"):
        env[var] = ""  # unset for the child: empty counts as unset
    r = edgespec(installed, "models", "scan", env=env)
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.split("\n\n")[0].splitlines()[1:]]
    assert names == ["ollama:smollm2:135m",
                     "hfcache:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2.gguf"]
    r = edgespec(installed, "models", "path", "ollama:smollm2:135m", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(ollama / "blobs" / f"sha256-{sha}")


def test_a_hub_pull_from_the_stand_in(installed, model_path, tmp_path):
    """`models pull OWNER/REPO:QUANT` from the wheel alone, against the loopback Hub stand-in
    (tests/registry/hub_standin.py) serving the real smollm2-135m file."""
    import json
    sys.path.insert(0, str(ROOT / "tests" / "registry"))
    from hub_standin import StandIn

    from edgespec import registry
    model = model_path("smollm2-135m")
    sha = registry.load_registry().get("smollm2-135m").sha256
    with StandIn() as hub:
        hub.add_file("edgespec-test/SmolLM2-GGUF", "smollm2-135m-Q4_K_M.gguf", model, sha256=sha)
        env = {"EDGESPEC_HOME": str(tmp_path / "es"), "HF_HOME": str(tmp_path / "hf"),
               "HF_ENDPOINT": hub.endpoint}
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
            env[var] = ""  # unset for the child: empty counts as unset
        r = edgespec(installed, "models", "pull", "edgespec-test/SmolLM2-GGUF:Q4_K_M", env=env)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip().split("\t")[1])
    assert path.is_relative_to(tmp_path / "hf" / "hub")
    pins = json.loads((tmp_path / "es" / "hub-pins.json").read_text())["files"]
    assert [p["sha256"] for p in pins.values()] == [sha]


@pytest.mark.parametrize("args, extra", [(("serve",), "server"), (("tui",), "tui"),
                                         (("bench", "--preset", "quick"), "bench")])
def test_a_command_whose_extra_is_missing_says_what_to_install(installed, args, extra):
    r = edgespec(installed, *args)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"edgespec {args[0]} needs the {extra} extra: "
                                f"pip install 'edgespec[{extra}]'")
    assert "Traceback" not in r.stderr
