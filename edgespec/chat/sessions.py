"""Saved conversations: the messages plus the target's KV state, so a conversation resumes
after a restart without re-reading it.

A session file (``paths.sessions_dir()/<name>.session``) is

    MAGIC | u32 format version | u32 header length | header (JSON) | sha256(header) | KV state

The header holds the messages, the tokens the state holds and their hash, and the key the
state is valid under: the target model's sha256, the kernel configuration
(``KernelConfig.key()``: repacked weights, flash attention, KV type), the llama.cpp
build, and the state's length and sha256. Files are written atomically (edgespec.statefile:
a temporary file, fsynced, renamed over the old one; a full disk leaves the old file and
raises StateFileError) and the directory is kept under a total size, oldest first.

On load the messages are used whenever the header is intact; the KV state only when every
key matches and its checksum holds. Otherwise :class:`SessionWarning` says why and the next
turn simply prefills the conversation: a state is never restored into another model or
configuration. A file whose header is unreadable is refused with :class:`SessionError`
and left in place.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import paths, statefile
from ..errors import EdgespecError, InvalidInputError
from ..registry.digests import model_identity
from .conversation import Conversation

MAGIC = b"EDGESPEC-SESSION"
FORMAT_VERSION = 1
SUFFIX = ".session"
DEFAULT_MAX_TOTAL_BYTES = 2 << 30
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FRAME = struct.Struct("<II")


class SessionError(EdgespecError):
    """A session cannot be read at all (missing, not a session file, corrupt header)."""


class SessionWarning(RuntimeWarning):
    """A session's KV state was not used; the conversation is prefilled instead."""


@dataclass
class Loaded:
    messages: list[dict]
    system: str | None
    restored: int  # tokens of KV state restored (0: the next turn prefills)
    reason: str = ""  # why the state was not used


def session_path(name: str, directory: Path | None = None) -> Path:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(f"a session name is 1-64 letters, digits, '.', '_' or '-', "
                                f"starting with a letter or digit (got {name!r})")
    return (directory or paths.sessions_dir()) / f"{name}{SUFFIX}"


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def model_digest(engine) -> str:
    return model_identity(engine.target.path)["sha256"]


def state_key(engine) -> dict:
    """What a KV state is valid under: the same weights, kernels and llama.cpp build."""
    from ..runtime import backend  # deferred: it loads llama.cpp
    try:
        build = backend.system_info()["llama_cpp_python"]
    except EdgespecError:
        build = "unknown"
    return {"model_sha256": model_digest(engine), "kernel": engine.config.kernel.key(),
            "n_vocab": int(engine.target.n_vocab), "llama_cpp_python": build}


# --- save --------------------------------------------------------------------------------
def save(engine, conversation, name: str, *, directory: Path | None = None,
         max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES) -> Path:
    """Write ``conversation`` and, when the engine's KV cache holds its tokens, their state."""
    path = session_path(name, directory)
    tokens = list(engine.kv_cache.held)
    state = b""
    if tokens and hasattr(engine.ctx, "state_get"):
        state = engine.ctx.state_get(engine.kv_cache.seq_id)
    if len(state) > max_total_bytes:
        warnings.warn(f"the KV state of session {name!r} ({len(state) >> 20} MiB) exceeds the "
                      f"sessions' size bound; only its messages are saved", SessionWarning,
                      stacklevel=2)
        tokens, state = [], b""
    header = {
        "version": FORMAT_VERSION, "created": time.time(), "name": name,
        "messages": [dict(m) for m in conversation.messages], "system": conversation.system,
        "key": state_key(engine), "tokens": tokens, "tokens_sha256": tokens_hash(tokens),
        "prefilled": min(engine.kv_cache.prefilled, len(tokens)),
        "state_bytes": len(state), "state_sha256": hashlib.sha256(state).hexdigest(),
    }
    hbytes = json.dumps(header, ensure_ascii=False).encode("utf-8")
    clean(path.parent)  # what killed saves left counts against the disk, not the size bound
    # whole or not at all: a full disk raises StateFileError and the old session stays
    statefile.atomic_write(path, [MAGIC + _FRAME.pack(FORMAT_VERSION, len(hbytes)) + hbytes
                                  + hashlib.sha256(hbytes).digest(), state],
                           what=f"session {name!r}")
    prune(path.parent, max_total_bytes, keep=path)
    return path


def clean(directory: Path | None = None) -> list[Path]:
    """Remove the temporary files of saves that were killed (edgespec.statefile); `edgespec
    chat` calls it when it starts."""
    return statefile.clean_temps(directory or paths.sessions_dir())


def prune(directory: Path, max_total_bytes: int, keep: Path | None = None) -> list[Path]:
    """Delete the oldest sessions until the directory holds at most ``max_total_bytes``."""
    sizes: dict[Path, tuple[float, int]] = {}
    for p in directory.glob(f"*{SUFFIX}"):
        try:
            st = p.stat()
        except OSError:  # removed by another process meanwhile
            continue
        sizes[p] = (st.st_mtime, st.st_size)
    files = sorted(sizes, key=lambda p: sizes[p][0])
    total = sum(size for _, size in sizes.values())
    removed = []
    for p in files:
        if total <= max_total_bytes:
            break
        if keep is not None and p == keep:
            continue
        total -= sizes[p][1]
        p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def list_sessions(directory: Path | None = None) -> list[str]:
    d = directory or paths.sessions_dir()
    return sorted(p.name[: -len(SUFFIX)] for p in d.glob(f"*{SUFFIX}")) if d.exists() else []


@dataclass(frozen=True)
class Listed:
    """One saved session as `edgespec chat --list` shows it (its header only is read)."""

    name: str
    modified: float  # the file's mtime: the last turn saved
    turns: int  # user messages
    first: str  # the first user message, for recognising the conversation
    model: str  # the target's sha256 prefix the KV state belongs to ("" if none)


def auto_name(now: float | None = None) -> str:
    """The name a conversation is saved under when `chat` was not given one."""
    return time.strftime("chat-%Y%m%d-%H%M%S", time.localtime(now))


def describe(directory: Path | None = None) -> list[Listed]:
    """The saved sessions, most recent first; files whose header is unreadable are left out
    (``chat --resume NAME`` on one says why)."""
    d = directory or paths.sessions_dir()
    out = []
    for p in d.glob(f"*{SUFFIX}") if d.exists() else ():
        try:
            header = _read_header(p)
            mtime = p.stat().st_mtime
        except (SessionError, OSError):
            continue
        users = [str(m.get("content", "")) for m in header["messages"] if m.get("role") == "user"]
        first = " ".join(users[0].split()) if users else ""
        out.append(Listed(p.name[: -len(SUFFIX)], mtime, len(users), first,
                          str(header.get("key", {}).get("model_sha256", ""))[:12]))
    return sorted(out, key=lambda s: s.modified, reverse=True)


def latest(directory: Path | None = None) -> str | None:
    """The most recently saved session's name (``chat --resume`` without a name)."""
    got = describe(directory)
    return got[0].name if got else None


def _read_header(path: Path) -> dict:
    """A session's header without reading its KV state (which may be hundreds of MiB)."""
    head = len(MAGIC) + _FRAME.size
    with open(path, "rb") as f:
        start = f.read(head)
        if len(start) < head or not start.startswith(MAGIC):
            raise SessionError(f"{path} is not an edgespec session file")
        version, hlen = _FRAME.unpack_from(start, len(MAGIC))
        hbytes = f.read(hlen)
        digest = f.read(32)
    if version != FORMAT_VERSION or hashlib.sha256(hbytes).digest() != digest:
        raise SessionError(f"session {path} is of another format, truncated or corrupt")
    try:
        header = json.loads(hbytes)
        assert isinstance(header.get("messages"), list)
        assert all(isinstance(m, dict) for m in header["messages"])
    except (ValueError, AssertionError):
        raise SessionError(f"session {path} has a malformed header") from None
    return dict(header)


# --- load --------------------------------------------------------------------------------
def read(path: Path) -> tuple[dict, bytes | None, str]:
    """(header, state or None, why the state is unusable)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SessionError(f"no saved session {path.stem!r} (in {path.parent})") from None
    except OSError as e:
        raise SessionError(f"cannot read session {path}: {e.strerror}") from None
    head = len(MAGIC) + _FRAME.size
    if len(data) < head or not data.startswith(MAGIC):
        raise SessionError(f"{path} is not an edgespec session file")
    version, hlen = _FRAME.unpack_from(data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise SessionError(f"{path} was written in session format {version}; this edgespec "
                           f"reads format {FORMAT_VERSION}. Start the conversation anew.")
    hbytes = data[head:head + hlen]
    digest = data[head + hlen:head + hlen + 32]
    if len(hbytes) < hlen or hashlib.sha256(hbytes).digest() != digest:
        raise SessionError(f"session {path} is truncated or corrupt (header checksum); it is "
                           "left in place")
    try:
        header = json.loads(hbytes)
        messages = header["messages"]
        assert isinstance(messages, list) and all(
            isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)
    except (ValueError, KeyError, AssertionError):
        raise SessionError(f"session {path} has a malformed header") from None
    state = data[head + hlen + 32:]
    if len(state) != header.get("state_bytes"):
        return header, None, (f"its KV state is truncated ({len(state)} of "
                              f"{header.get('state_bytes')} bytes)")
    if hashlib.sha256(state).hexdigest() != header.get("state_sha256"):
        return header, None, "its KV state fails its checksum"
    if tokens_hash(header.get("tokens", [])) != header.get("tokens_sha256"):
        return header, None, "its token list fails its checksum"
    return header, state, ""


def load(engine, name: str, *, directory: Path | None = None) -> Loaded:
    """Read a session; restore its KV state into the engine when it is valid here."""
    path = session_path(name, directory)
    header, state, why = read(path)
    tokens = [int(t) for t in header.get("tokens", [])]
    if state is not None and tokens:
        want, have = state_key(engine), header.get("key", {})
        diff = [k for k in want if want[k] != have.get(k)]
        if diff:
            why = "it was saved with another " + ", ".join(
                {"model_sha256": "model", "kernel": "kernel configuration",
                 "n_vocab": "vocabulary", "llama_cpp_python": "llama.cpp build"}[k] for k in diff)
        elif not engine.kv_cache.adopt(tokens, state, int(header.get("prefilled", 0))):
            why = "llama.cpp refused its KV state (or it does not fit this context)"
    restored = len(tokens) if state is not None and tokens and not why else 0
    if why:
        warnings.warn(f"session {name!r}: not restoring the KV cache because {why}; the "
                      "conversation will be prefilled", SessionWarning, stacklevel=2)
    return Loaded(messages=[{"role": m["role"], "content": str(m["content"])}
                            for m in header["messages"]],
                  system=header.get("system"), restored=restored, reason=why)


def load_conversation(engine, name: str, *, directory: Path | None = None, **conv_kw):
    """A :class:`~edgespec.chat.conversation.Conversation` resumed from a saved session."""
    got = load(engine, name, directory=directory)
    return Conversation(engine, system=got.system, messages=got.messages, **conv_kw), got
