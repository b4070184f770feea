"""Ollama's native API on the wire (ollama's docs/api.md): request bodies -> the neutral
:class:`~edgespec.protocol.request.CoreRequest`, core events -> Ollama's JSON objects.

Pure functions, no app and no model, so each shape is tested with literal bodies and
events (tests/server/test_ollama.py). The routes that use them are in :mod:`.ollama`.

What Ollama clients send, and what it means here:

* ``options``: the sampling options (``temperature``, ``top_k``, ``top_p``, ``min_p``,
  ``seed``, ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``,
  ``frequency_penalty``, ``stop``, ``num_predict``) with Ollama's defaults where a request
  names none (temperature 0.8, top_k 40, top_p 0.9); ``num_ctx`` is checked against the
  loaded context (above it is refused: edgespec does not reload a model per request);
  options about how Ollama loads a model (``num_gpu``, ``num_thread``, ``use_mmap``...)
  are accepted and have no effect (``edgespec serve``'s flags set those); sampler options
  edgespec does not implement (``mirostat``, ``typical_p``, ``tfs_z``) are refused unless
  they hold their no-op value, and an unknown option is refused by name.
* ``format``: ``"json"`` (any JSON object) or a JSON schema, enforced by grammar.
* ``think``: the reasoning split (``message.thinking``); ``false`` also tells templates
  that read ``enable_thinking`` not to think.
* ``tools`` (OpenAI-shaped, as Ollama's) and ``tool_calls`` in the history, whose
  ``arguments`` are objects; a ``tool`` message is matched to its call by
  ``tool_call_id``, else ``tool_name``, else the first call still unanswered.
* ``/api/generate``: ``raw`` skips the chat template; ``system`` becomes a system message;
  ``suffix`` makes a fill-in-the-middle prompt from the model's FIM tokens; ``template``
  (a Go template) and ``context`` (a deprecated token list) are refused with what to send
  instead; an empty prompt only loads (or with ``keep_alive: 0`` unloads) the model.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from ...api.events import TokenLogprob
from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.errors import ProtocolError
from ...protocol.events import ChoiceDone, ToolCall
from ...protocol.request import CoreRequest, Fim
from .fields import check, get, invalid, unsupported

#: the Ollama API version /api/version reports (clients gate features on it; this is the
#: API whose fields edgespec answers, not an Ollama build)
API_VERSION = "0.12.0"

#: Ollama's own defaults (api/types.go DefaultOptions) where a request names none
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.0,
            "repeat_last_n": 64}

#: option -> (type, lowest, highest); checked, then mapped onto SamplingParams
_SAMPLING: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 100.0), "top_k": (int, 0, 1 << 20),
    "top_p": (float, 0.0, 1.0), "min_p": (float, 0.0, 1.0),
    "repeat_penalty": (float, 0.0, 100.0), "repeat_last_n": (int, -1, 1 << 20),
    "presence_penalty": (float, -100.0, 100.0), "frequency_penalty": (float, -100.0, 100.0),
}
#: how Ollama loads and runs a model: edgespec serve's flags decide these, so a request's
#: values are accepted and have no effect (clients such as Continue send them every time)
_LOAD_TIME = frozenset({"num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock",
                        "num_thread", "numa", "low_vram", "f16_kv", "vocab_only", "num_keep",
                        "penalize_newline", "draft_num_predict", "logits_all"})
#: samplers edgespec does not implement: allowed only at the value that turns them off
_NO_OP = {"typical_p": 1.0, "mirostat": 0, "mirostat_tau": None, "mirostat_eta": None,
          "tfs_z": 1.0}
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class OllamaRequest:
    """One /api/chat or /api/generate request, parsed."""

    endpoint: str  # "chat" | "generate"
    model: str
    core: CoreRequest | None  # None: nothing to generate (load or unload the model)
    stream: bool = True
    keep_alive: float | None = None  # seconds; None: the server's; 0: unload after; < 0: never
    num_ctx: int | None = None  # the context the client asked for (checked once loaded)
    think: bool = False  # reasoning was asked for (message.thinking)
    logprobs: bool = False  # each token's logprob (and top_logprobs alternatives) asked for


# --- requests ------------------------------------------------------------------------------
def parse_chat(body: dict[str, Any], max_tokens_limit: int, reasoning_default: str = "auto"
               ) -> OllamaRequest:
    model = _model(body)
    messages = get(body, "messages", list, default=[])
    stream, keep_alive = _stream(body), parse_keep_alive(body.get("keep_alive"))
    if not messages:
        return OllamaRequest("chat", model, None, stream, keep_alive)
    params, num_ctx = _params(body, max_tokens_limit, chat=True)
    reasoning, kwargs, think = _think(body.get("think"), reasoning_default)
    tools = get(body, "tools", list)
    core = CoreRequest(model=model, params=params, messages=chat_messages(messages),
                       tools=tuple(tools) if tools else None, reasoning_format=reasoning,
                       chat_template_kwargs=kwargs)
    return OllamaRequest("chat", model, core, stream, keep_alive, num_ctx, think,
                         params.logprobs is not None)


def parse_generate(body: dict[str, Any], max_tokens_limit: int, reasoning_default: str = "auto"
                   ) -> OllamaRequest:
    model = _model(body)
    prompt = get(body, "prompt", str, default="")
    suffix = get(body, "suffix", str)
    system = get(body, "system", str)
    raw = get(body, "raw", bool, default=False)
    stream, keep_alive = _stream(body), parse_keep_alive(body.get("keep_alive"))
    if get(body, "template", str):
        raise unsupported("template is an Ollama Go template; edgespec renders the model's own "
                          "chat template (from its GGUF). Send raw: true with a prompt you "
                          "templated yourself, or leave template out", "template")
    if get(body, "context", list):
        raise unsupported("context (a token list from an earlier /api/generate, deprecated by "
                          "Ollama) is not supported; send the conversation to /api/chat",
                          "context")
    _no_images(body, "images")
    if not prompt and not suffix:
        return OllamaRequest("generate", model, None, stream, keep_alive)
    params, num_ctx = _params(body, max_tokens_limit, chat=not raw and suffix is None)
    if suffix is not None:
        if system:
            raise unsupported("system has no place in a fill-in-the-middle prompt (suffix); "
                              "leave one of them out", "system")
        core = CoreRequest(model=model, params=params, fim=Fim(prompt, suffix),
                           param_prompt="prompt")
        return OllamaRequest("generate", model, core, stream, keep_alive, num_ctx,
                             logprobs=params.logprobs is not None)
    if raw:
        if system:
            raise unsupported("system needs the chat template, which raw: true skips; put the "
                              "system text in your prompt", "system")
        core = CoreRequest(model=model, params=params, prompt=prompt, param_prompt="prompt")
        return OllamaRequest("generate", model, core, stream, keep_alive, num_ctx,
                             logprobs=params.logprobs is not None)
    reasoning, kwargs, think = _think(body.get("think"), reasoning_default)
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    core = CoreRequest(model=model, params=params, messages=tuple(messages),
                       reasoning_format=reasoning, chat_template_kwargs=kwargs,
                       param_prompt="prompt")
    return OllamaRequest("generate", model, core, stream, keep_alive, num_ctx, think,
                         params.logprobs is not None)


def _model(body: dict[str, Any]) -> str:
    model: str = get(body, "model", str, required=True)
    if not model.strip():
        raise invalid("model is empty; send a model name (GET /api/tags lists them)", "model")
    return model


def _stream(body: dict[str, Any]) -> bool:
    stream: bool = get(body, "stream", bool, default=True)
    return stream


def _no_images(obj: dict[str, Any], path: str) -> None:
    if get(obj, "images", list):
        raise unsupported(f"{path}: images need a vision model; edgespec serves text models",
                          path)


def _params(body: dict[str, Any], max_tokens_limit: int,
            chat: bool) -> tuple[GenerationParams, int | None]:
    opts = get(body, "options", dict, default={})
    for key, value in opts.items():
        if key in _SAMPLING or key in ("seed", "stop", "num_predict", "num_ctx"):
            continue
        if key in _LOAD_TIME:
            continue
        if key in _NO_OP:
            off = _NO_OP[key]
            if off is not None and value is not None and value != off:
                raise unsupported(f"options.{key} {value!r}: this sampler is not implemented "
                                  f"here; leave it out (or at {off})", f"options.{key}")
            continue
        raise invalid(f"unknown option options.{key}; the options are Ollama's Modelfile "
                      "parameters (temperature, top_k, top_p, min_p, seed, stop, num_predict, "
                      "num_ctx, repeat_penalty, ...)", f"options.{key}", "unknown_parameter")
    values: dict[str, Any] = {}
    for key, (kind, lo, hi) in _SAMPLING.items():
        value = get(opts, key, kind, "options")
        if value is not None and not lo <= value <= hi:
            raise invalid(f"options.{key} is {value}; send a value in [{lo:g}, {hi:g}]",
                          f"options.{key}")
        values[key] = DEFAULTS.get(key) if value is None else value
    if values["repeat_last_n"] == -1:  # Ollama: -1 = the whole context; the engine's window
        values["repeat_last_n"] = 1 << 20
    seed = get(opts, "seed", int, "options")
    if seed is not None and seed < -1:
        raise invalid(f"options.seed is {seed}; send a non-negative seed (or -1: random)",
                      "options.seed")
    sampling = limits.sampling(
        temperature=values["temperature"], default_temperature=DEFAULTS["temperature"],
        top_p=values["top_p"] or 1.0, top_k=values["top_k"], min_p=values["min_p"],
        repeat_penalty=values["repeat_penalty"], presence_penalty=values["presence_penalty"],
        frequency_penalty=values["frequency_penalty"],
        seed=None if seed is None or seed == -1 else seed,
        repeat_last_n=values["repeat_last_n"])
    predict = get(opts, "num_predict", int, "options")
    if predict is not None and predict in (-1, -2):  # unlimited, fill the context: the limit
        predict = None
    max_tokens = limits.max_tokens(predict, max_tokens_limit, "options.num_predict")
    stop = opts.get("stop")
    if stop is not None:
        check(stop, (str, list), "options.stop")
    num_ctx = get(opts, "num_ctx", int, "options")
    if num_ctx is not None and num_ctx < 1:
        raise invalid(f"options.num_ctx is {num_ctx}; send a positive context size",
                      "options.num_ctx")
    logprobs = None
    if get(body, "logprobs", bool, default=False):
        logprobs = get(body, "top_logprobs", int, default=0)
        if not 0 <= logprobs <= 20:
            raise invalid(f"top_logprobs is {logprobs}; send 0..20", "top_logprobs")
    params = GenerationParams(max_tokens=max_tokens, chat=chat, sampling=sampling,
                              stop=limits.stops(stop, "options.stop"), logprobs=logprobs,
                              **_format(body))
    return params, num_ctx


def _format(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"json_mode": True}
    if isinstance(fmt, dict):
        return {"json_schema": fmt}
    raise invalid(f"format must be \"json\" or a JSON schema object, not {fmt!r}", "format")


def _think(value: Any, default: str) -> tuple[str | None, dict[str, Any] | None, bool]:
    """(reasoning_format, chat_template_kwargs, thinking asked) for Ollama's ``think``."""
    if value is None:
        return None, None, default != "none"
    if value is True or value in ("low", "medium", "high", "max"):
        return "deepseek", {"enable_thinking": True}, True
    if value is False:
        # still split: a model that thinks anyway keeps its thoughts out of the content
        return "deepseek", {"enable_thinking": False}, False
    raise invalid(f"think must be true, false, \"low\", \"medium\", \"high\" or \"max\", not "
                  f"{value!r}", "think")


def check_num_ctx(asked: int | None, loaded: int | None, model: str) -> None:
    """A client's ``num_ctx`` against the context the model was loaded with (a built
    engine's config always names it; None: nothing to check against)."""
    if asked is not None and loaded is not None and asked > loaded:
        raise ProtocolError(
            400, f"options.num_ctx {asked} exceeds the context {model!r} is loaded with "
                 f"({loaded} tokens per request); ask for at most {loaded}, or restart "
                 f"edgespec serve with --ctx {asked}", param="options.num_ctx",
            code="context_length_exceeded", kind="context_overflow")


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's ``keep_alive``: a number of seconds or a Go duration ("5m", "1h30m", "-1"),
    in seconds; negative keeps the model loaded, 0 unloads it after the request."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid("keep_alive must be a duration (\"5m\") or a number of seconds",
                      "keep_alive", "invalid_type")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise invalid("keep_alive must be a duration (\"5m\") or a number of seconds",
                      "keep_alive", "invalid_type")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # "300", "-1": seconds
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(body) or not body:
        raise invalid(f"keep_alive {value!r} is not a duration; send e.g. \"5m\", \"30s\", "
                      "\"1h\", 0 (unload now) or -1 (keep loaded)", "keep_alive")
    return sign * total


def chat_messages(messages: list[Any]) -> tuple[dict[str, Any], ...]:
    """Ollama chat messages -> OpenAI-shaped ones: tool call arguments as JSON text with an
    id each (Ollama's own, or one made up), tool results tied to their call."""
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        check(m, dict, where)
        role = get(m, "role", str, where, required=True).lower()
        if role not in _ROLES:
            raise invalid(f"{where}.role {role!r}; send one of {', '.join(_ROLES)}",
                          f"{where}.role")
        _no_images(m, f"{where}.images")
        content = get(m, "content", str, where, default="")
        msg: dict[str, Any] = {"role": role, "content": content}
        calls = get(m, "tool_calls", list, where)
        if calls:
            if role != "assistant":
                raise invalid(f"{where}.tool_calls: only assistant messages carry tool calls",
                              f"{where}.tool_calls")
            msg["tool_calls"] = [_history_call(f"{where}.tool_calls.{j}", c, f"call_{i}_{j}")
                                 for j, c in enumerate(calls)]
            open_calls += [(c["id"], c["function"]["name"]) for c in msg["tool_calls"]]
        if role == "tool":
            call_id = get(m, "tool_call_id", str, where)
            name = get(m, "tool_name", str, where)
            found = _answer(open_calls, call_id, name)
            if found is None:
                raise invalid(f"{where} (role tool) answers no tool call: no earlier assistant "
                              "message has an unanswered call" +
                              (f" named {name!r}" if name else "") + "; send the assistant "
                              "message with its tool_calls first", f"{where}.tool_name")
            open_calls.remove(found)
            msg["tool_call_id"], msg["name"] = found
        out.append(msg)
    return tuple(out)


def _answer(open_calls: list[tuple[str, str]], call_id: str | None, name: str | None
            ) -> tuple[str, str] | None:
    for c in open_calls:
        if call_id is not None and c[0] == call_id:
            return c
    if call_id is not None and name is None:
        return None
    for c in open_calls:
        if name is None or c[1] == name:
            return c
    return None


def _history_call(where: str, call: Any, made_id: str) -> dict[str, Any]:
    check(call, dict, where)
    fn = get(call, "function", dict, where, required=True)
    name = get(fn, "name", str, f"{where}.function", required=True)
    args = fn.get("arguments", {})
    if isinstance(args, str):  # some clients send JSON text, as OpenAI does
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise invalid(f"{where}.function.arguments is not JSON ({e})",
                          f"{where}.function.arguments") from None
    check(args, dict, f"{where}.function.arguments")
    call_id = get(call, "id", str, where) or made_id
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


# --- responses -----------------------------------------------------------------------------
def created_at(now: datetime | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes it ("2023-08-04T19:22:45.499127Z")."""
    now = now or datetime.now(timezone.utc)
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Timing:
    """A request's wall-clock parts (seconds) beside the engine's own timings."""

    total: float = 0.0  # from the request's arrival to its last event
    load: float = 0.0  # loading the model, where this request loaded it


def metrics(done: ChoiceDone, timing: Timing) -> dict[str, Any]:
    """Ollama's final-object fields, in nanoseconds, from the engine's measured times."""
    t = done.timings
    return {"total_duration": int(timing.total * 1e9),
            "load_duration": int(timing.load * 1e9),
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": int(t.get("prompt_ms", 0.0) * 1e6),
            "eval_count": done.completion_tokens,
            "eval_duration": int(t.get("predicted_ms", 0.0) * 1e6)}


def done_reason(done: ChoiceDone) -> str:
    """Ollama says "length" for a request cut by num_predict or the context, else "stop"."""
    return "length" if done.finish == "length" else "stop"


def tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Calls as Ollama writes them: arguments as an object."""
    out = []
    for i, c in enumerate(calls):
        try:
            args = json.loads(c.arguments) if c.arguments.strip() else {}
        except ValueError:  # the parser hands only complete JSON; keep the text if not
            args = c.arguments
        out.append({"id": c.id, "function": {"index": i, "name": c.name, "arguments": args}})
    return out


def logprobs(lps: Sequence[TokenLogprob], piece: Callable[[int], bytes]
             ) -> list[dict[str, Any]]:
    """Ollama's ``logprobs``: per token its text, logprob, bytes and top alternatives."""
    def entry(tok: int, lp: float) -> dict[str, Any]:
        raw = bytes(piece(tok))
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    return [{**entry(lp.token, lp.logprob),
             **({"top_logprobs": [entry(t, v) for t, v in lp.top]} if lp.top else {})}
            for lp in lps]


@dataclass
class Renderer:
    """The objects of one /api/chat or /api/generate answer (``endpoint``); ``piece``
    (token id -> bytes) writes logprobs."""

    endpoint: str
    model: str
    piece: Any = None

    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at()}

    def delta(self, text: str = "", thinking: str = "",
              lps: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        body = self._head()
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        body["done"] = False
        if lps and self.piece is not None:
            body["logprobs"] = logprobs(lps, self.piece)
        return body

    def calls(self, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
        """The turn's tool calls in one chunk (Ollama sends each call whole)."""
        body = self.delta()
        body["message"]["tool_calls"] = tool_calls(calls)
        return body

    def final(self, done: ChoiceDone, timing: Timing, whole: bool) -> dict[str, Any]:
        """The last object; ``whole`` (stream: false) carries the whole answer."""
        text = done.text if whole else ""
        thinking = (done.reasoning or "") if whole else ""
        body = self.delta(text, thinking, done.logprobs if whole else ())
        if whole and done.tool_calls and self.endpoint == "chat":
            body["message"]["tool_calls"] = tool_calls(done.tool_calls)
        body.update(done=True, done_reason=done_reason(done), **metrics(done, timing))
        # llama-server's timings (draft counts, proposer) beside Ollama's own counters;
        # Ollama's clients ignore fields they do not know
        body["timings"] = done.timings
        return body

    def lifecycle(self, reason: str) -> dict[str, Any]:
        """The answer to a request with nothing to generate: "load" or "unload"."""
        body = self.delta()
        body.update(done=True, done_reason=reason)
        return body


def error_body(message: str) -> dict[str, Any]:
    """Ollama's error shape: one string."""
    return {"error": message}
