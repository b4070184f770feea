"""Hugging Face Hub references: ``hf://owner/repo[@rev]/file.gguf`` and the shorthand
``owner/repo[@rev][:QUANT]`` (edgespec.registry.hub lists the forms) -> :class:`HubRef`."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelError

SCHEME = "hf://"
DEFAULT_QUANT = "Q4_K_M"

# huggingface_hub's repo id rules (validate_repo_id): letters, digits, '-', '_', '.'
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REV = r"[^\s@:]+"
_SHORT_RE = re.compile(rf"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
                       rf"(?P<repo>{_PART}/{_PART})(?:@(?P<rev>{_REV}))?"
                       rf"(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]*))?$")


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class HubRef:
    """A parsed Hub reference: a repo, an optional revision and either a file or a quant."""

    repo: str
    revision: str | None = None  # None: the default branch
    filename: str | None = None  # hf:// names a file; the shorthand names a quant
    quant: str | None = None
    text: str = ""

    @property
    def rev(self) -> str:
        return self.revision or "main"

    def uri(self, filename: str | None = None, revision: str | None = None) -> str:
        """The canonical hf:// form (huggingface_hub's): ``hf://owner/repo[@rev]/file``."""
        rev = revision or self.revision
        return f"{SCHEME}{self.repo}{'@' + rev if rev else ''}/{filename or self.filename}"

    def __str__(self) -> str:
        return self.text or (self.uri() if self.filename else
                             f"{self.repo}{'@' + self.revision if self.revision else ''}"
                             f"{':' + self.quant if self.quant else ''}")


def is_hub_ref(name: str | os.PathLike) -> bool:
    """Whether `name` is a Hub reference: any ``hf://…``, or ``owner/repo[:QUANT]`` that is
    not a file or folder here (a local path always wins over the shorthand)."""
    if isinstance(name, os.PathLike):
        return False
    s = str(name)
    if s.startswith(SCHEME):
        return True
    if s.lower().endswith(".gguf") or not _SHORT_RE.match(s):
        return False
    return not Path(s).expanduser().exists()


def parse(text: str) -> HubRef:
    """Parse a Hub reference; ModelError saying how to write it when it is malformed."""
    s = str(text).strip()
    if s.startswith(SCHEME):
        return _parse_uri(s)
    m = _SHORT_RE.match(s)
    if not m:
        raise ModelError(f"{text!r} is not a Hugging Face reference; write hf://OWNER/REPO/FILE.gguf "
                         "or OWNER/REPO:QUANT (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)")
    return HubRef(repo=m["repo"], revision=m["rev"], quant=m["quant"], text=s)


def _parse_uri(s: str) -> HubRef:
    how = ("write hf://OWNER/REPO/FILE.gguf (a file in a folder: hf://OWNER/REPO/DIR/FILE.gguf; "
           "a revision: hf://OWNER/REPO@REV/FILE.gguf)")
    body = s[len(SCHEME):]
    if body.startswith("models/"):  # huggingface_hub's explicit repo type
        body = body[len("models/"):]
    elif body.split("/", 1)[0] in ("datasets", "spaces", "buckets", "kernels"):
        raise ModelError(f"{s}: only model repositories hold GGUF models; {how}")
    parts = body.split("/")
    if len(parts) < 3 or not all(parts):
        raise ModelError(f"{s}: names no file in a repository; {how}")
    owner, name, path = parts[0], parts[1], "/".join(parts[2:])
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
    elif "@" in parts[-1] and parts[-1].rsplit("@", 1)[0].lower().endswith(".gguf"):
        path, revision = path.rsplit("@", 1)
    if not re.fullmatch(_PART, owner) or not re.fullmatch(_PART, name):
        raise ModelError(f"{s}: {owner}/{name} is not a repository id (letters, digits, "
                         f"'-', '_', '.'); {how}")
    if revision is not None and not re.fullmatch(_REV, revision):
        raise ModelError(f"{s}: {revision!r} is not a revision; {how}")
    if not path.lower().endswith(".gguf"):
        raise ModelError(f"{s}: {path} is not a .gguf file; name the GGUF file of the repo, "
                         f"or write {owner}/{name}:QUANT to pick it by quant")
    if ".." in path.split("/"):
        raise ModelError(f"{s}: a file path in a repository has no '..'; {how}")
    return HubRef(repo=f"{owner}/{name}", revision=revision, filename=path, text=s)
