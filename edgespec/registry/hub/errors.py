"""Hub and network failures -> a ModelError that says what to do."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ModelError

if TYPE_CHECKING:
    from .env import _Env
    from .ref import HubRef


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _unreachable(e: BaseException) -> bool:
    """A network failure (no route, refused, timed out, dropped mid-body), whichever HTTP
    library this huggingface_hub uses (httpx in 1.x and later, requests before)."""
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub.utils import OfflineModeIsEnabled
    if isinstance(e, (OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    root = type(e).__module__.split(".", 1)[0]
    if root in {"httpx", "httpx2", "httpcore", "urllib3"}:
        return "StatusError" not in type(e).__name__  # an HTTP status is an answer
    if root == "requests":
        return type(e).__name__ in {"ConnectionError", "Timeout", "ConnectTimeout",
                                    "ReadTimeout", "ChunkedEncodingError"}
    return False


def _hub_error(e: BaseException, ref: "HubRef", env: "_Env", filename: str | None = None) -> ModelError:
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub.utils import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                       LocalEntryNotFoundError, RepositoryNotFoundError,
                                       RevisionNotFoundError)
    login = "set HF_TOKEN to a token of yours (or run `huggingface-cli login`)"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError) or (status in (401, 403) and not isinstance(
            e, RepositoryNotFoundError)):
        if env.token:
            return ModelError(f"{ref}: {ref.repo} is gated and your token has no access to it "
                              f"({status}); accept its terms on {env.endpoint}/{ref.repo} with "
                              "the account of that token, or use another token in HF_TOKEN")
        return ModelError(f"{ref}: {ref.repo} is gated ({status}): accept its terms on "
                          f"{env.endpoint}/{ref.repo}, then {login}")
    if isinstance(e, RepositoryNotFoundError):
        private = ("" if env.token else
                   f"; if it is private or gated, {login}")
        return ModelError(f"{ref}: no repository {ref.repo} on {env.endpoint} ({status}); check "
                          f"the owner and name{private}")
    if isinstance(e, RevisionNotFoundError):
        return ModelError(f"{ref}: {ref.repo} has no revision {ref.rev}; give a branch, tag or "
                          "commit that exists (or leave @REV out for main)")
    if isinstance(e, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if env.offline else f"the Hub at {env.endpoint} is unreachable"
        fix = "unset HF_HUB_OFFLINE to download it" if env.offline else \
            "check the network (or HF_ENDPOINT) and pull again"
        return ModelError(f"{ref}: {filename or ''} is not in the Hugging Face cache "
                          f"{env.cache_dir} and {why}; {fix}")
    if isinstance(e, EntryNotFoundError):
        return ModelError(f"{ref}: {ref.repo}@{ref.rev} has no file {filename}; list its files "
                          f"on {env.endpoint}/{ref.repo}")
    if _unreachable(e):
        return ModelError(f"{ref}: the download of {filename or ref.repo} from {env.endpoint} "
                          f"failed ({_short(e)}) after huggingface_hub's retries; nothing was "
                          "kept as a model. Pull again when the network is back")
    if isinstance(e, HfHubHTTPError):
        return ModelError(f"{ref}: the Hub at {env.endpoint} answered {status or 'an error'} "
                          f"({_short(e)}); try again later")
    if isinstance(e, OSError):
        return ModelError(f"{ref}: {filename or ref.repo}: {_short(e)}; pull again "
                          f"(`edgespec models pull {ref} --force` fetches it afresh)")
    raise e
