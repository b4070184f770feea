"""What a server is configured with, beyond the engine and the scheduler (validated once)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInputError
from ..agents.reasoning import FORMATS

MiB = 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    served_model: str  # the model id clients name (the target's registry name or file stem)
    aliases: tuple[str, ...] = ()  # other ids that reach the same model (its path, file name)
    api_key: str | None = None
    max_tokens_limit: int = 4096  # a request asking for more is refused (400), not cut
    max_body_bytes: int = MiB
    default_temperature: float = 1.0  # OpenAI's default when a request names none
    max_slices: int = 64  # distinct traffic slice names clients may introduce (X-Edgespec-Slice)
    strict: bool = False  # refuse unknown request fields (400) instead of ignoring them
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (none: no CORS)
    read_timeout: float = 30.0  # seconds a client has to send a request's headers, and its body
    keep_alive_timeout: float = 5.0  # an idle connection between requests is closed after this
    # a leading <think> block: "none" leaves it in the content, "deepseek"/"auto" split it
    # into reasoning_content (llama-server's --reasoning-format); requests may override it
    reasoning_format: str = "auto"
    # a request naming a model this server does not serve goes to the default model (for
    # clients that hard-code e.g. "gpt-4o-mini"); off: such a request is a 404
    model_alias_any: bool = False
    web: bool = True  # the chat page at GET / (edgespec.server.web); --no-web turns it off
    # Host names the server answers to (edgespec.server.guard): the addresses it listens on
    # and --allow-host values, beside localhost and loopback literals; None: no Host check (an
    # app built in-process, e.g. under a test client; `edgespec serve` always sets it)
    allowed_hosts: tuple[str, ...] | None = None

    def validate(self) -> "ServerSettings":
        if not self.served_model:
            raise InvalidInputError("the server needs a model id to serve")
        if self.max_tokens_limit < 1:
            raise InvalidInputError(f"--max-tokens-limit must be >= 1 "
                                    f"(got {self.max_tokens_limit})")
        if self.max_body_bytes < 1024:
            raise InvalidInputError(f"the body size limit must be at least 1 KiB "
                                    f"(got {self.max_body_bytes} bytes)")
        for flag, seconds in (("--timeout-read", self.read_timeout),
                              ("--timeout-keep-alive", self.keep_alive_timeout)):
            if not seconds > 0:
                raise InvalidInputError(f"{flag} must be a positive number of seconds "
                                        f"(got {seconds})")
        for origin in self.cors_origins:
            if origin != "*" and "://" not in origin:
                raise InvalidInputError(f"--cors-origin {origin!r} is not an origin; send "
                                        "scheme://host[:port], e.g. http://localhost:3000")
        if self.reasoning_format not in FORMATS:
            raise InvalidInputError(f"--reasoning-format {self.reasoning_format!r}; use one of "
                                    f"{', '.join(FORMATS)}")
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidInputError("--api-key is empty; pass a real key or leave it out")
        return self

    def serves(self, model: str) -> bool:
        return model == self.served_model or model in self.aliases
