"""``create_completion`` / ``create_chat_completion`` with llama-cpp-python's arguments and
shapes, over the protocol core (:func:`edgespec.protocol.core.run`, speculation on, as the
engine runs it): the same request mapping and refusals as ``edgespec serve``'s dialects.

    out = create_chat_completion(engine, [{"role": "user", "content": "Hi"}], max_tokens=32)
    out["choices"][0]["message"]["content"]

Each call is a :class:`Call`: the arguments mapped onto a
:class:`~edgespec.protocol.CoreRequest` through :mod:`edgespec.protocol.limits` and planned
(:func:`edgespec.protocol.engine_input`: template, tools, vocabulary; every refusal raised before
anything runs, as edgespec's own error types), then rendered from the core's events
(TextDelta per token, ToolCallDelta, ChoiceDone), whole or as chunks. The defaults are
llama-cpp-python's own (chat: temperature 0.2, top-k 40, top-p 0.95, min-p 0.05, no token
limit; completion: temperature 0.8 and 16 tokens), so an app that relies on them samples
the same way; so is its unbounded ``logit_bias`` (any finite number, ``-inf`` bans).

What llama-cpp-python 0.3.36 accepts and edgespec cannot honour is refused with an
:class:`~edgespec.errors.UnsupportedError` naming the argument: ``suffix``,
``stopping_criteria`` (a Python callback that speculative verification cannot replay),
``typical_p`` and ``mirostat_mode`` when sampling, ``echo`` with ``logprobs``.
``logits_processor`` is honoured on the plain path: such a request never drafts. What
llama-cpp-python itself ignores is ignored here too: ``tfs_z`` (its sampler has no
tail-free step), ``mirostat_tau``/``mirostat_eta`` without mirostat,
``top_logprobs`` without ``logprobs``, ``echo`` when streaming, ``tool_choice`` without
``tools``.

``tools``/``tool_choice`` (and the legacy ``functions``/``function_call``, converted as
llama-cpp-python converts them) go through :mod:`edgespec.agents`, as ``edgespec serve``'s
do: declared to the model's own chat template, a required or named call constrained by its
JSON schema through the grammar path, the model's call markup parsed into OpenAI
``tool_calls`` (``finish_reason`` ``"tool_calls"``), streamed as ``delta.tool_calls``.
Reasoning stays in the content, as llama-cpp-python leaves it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from ..errors import Cancelled, ContextOverflowError, EdgespecError, InvalidInputError, \
    UnsupportedError
from ..api.events import Event, TokenLogprob
from ..api.params import GenerationParams, SamplingParams
from ..protocol import limits
from ..protocol.core import execute
from ..protocol.errors import ProtocolError
from ..protocol.events import FINISH, ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, \
    ToolCallDelta
from ..protocol.engine_input import EngineInput, engine_input
from ..protocol.request import CoreRequest
from . import shapes

if TYPE_CHECKING:
    from ..engine.engine import Engine

#: llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed", as is -1
RANDOM_SEEDS = (-1, 0xFFFFFFFF)
#: the core's own finish words; a turn's (tool_calls) pass through as they are
_NEUTRAL_FINISH = frozenset(FINISH.values())


@dataclass(frozen=True)
class Defaults:
    """What a ``Llama`` instance fixes for its requests (its constructor's ``seed`` and
    ``last_n_tokens_size``, and its ``model_path`` as the responses' model name)."""

    model: str | None = None  # None: the engine's target name
    seed: int | None = None  # a request without its own seed samples with this one
    repeat_last_n: int = 64  # Llama(last_n_tokens_size=...): the penalties' window


# --- the calls ---------------------------------------------------------------------------
def create_completion(engine: "Engine", prompt: str, suffix: str | None = None,
                      max_tokens: int | None = 16, temperature: float = 0.8,
                      top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                      logprobs: int | None = None, echo: bool = False,
                      stop: str | Sequence[str] | None = (), frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                      top_k: int = 40, stream: bool = False, seed: int | None = None,
                      tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                      mirostat_eta: float = 0.1, model: str | None = None,
                      stopping_criteria=None, logits_processor=None, grammar=None,
                      logit_bias: Mapping[int | str, float] | None = None, *,
                      defaults: Defaults = Defaults()):
    """``Llama.create_completion``: the whole ``text_completion`` dict, or with
    ``stream=True`` an iterator of its chunks."""
    call = completion_call(**_args(locals()))
    return call.render(call.events(engine))


def create_chat_completion(engine: "Engine", messages: Sequence[Mapping],
                           functions=None, function_call=None, tools=None, tool_choice=None,
                           temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                           min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                           stop: str | Sequence[str] | None = (), seed: int | None = None,
                           response_format: Mapping | None = None,
                           max_tokens: int | None = None, presence_penalty: float = 0.0,
                           frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
                           tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                           mirostat_eta: float = 0.1, model: str | None = None,
                           logits_processor=None, grammar=None,
                           logit_bias: Mapping[int | str, float] | None = None,
                           logprobs: bool | None = None, top_logprobs: int | None = None, *,
                           defaults: Defaults = Defaults()):
    """``Llama.create_chat_completion``: the whole ``chat.completion`` dict, or with
    ``stream=True`` an iterator of ``chat.completion.chunk`` dicts."""
    call = chat_call(**_args(locals()))
    return call.render(call.events(engine))


def _args(scope: dict) -> dict:
    # the public signatures spell llama-cpp-python's arguments out (help(), IDEs); the
    # Call builders take the same names, so the caller's locals() are its arguments
    return {k: v for k, v in scope.items() if k != "call"}


@dataclass
class Call:
    """One request: the core request, planned, and how its events become llama-cpp-python
    dicts."""

    head: shapes.Head
    request: CoreRequest
    engine_input: EngineInput  # what the engine runs (prompt, params) and the chat turn reading it back
    stream: bool
    piece: Callable[[int], bytes] = field(repr=False)
    offset: int = 0  # characters before the generated text (completions' text_offset)

    @property
    def prompt(self) -> str | list[dict] | tuple[int, ...]:
        return self.engine_input.prompt

    @property
    def params(self) -> GenerationParams:
        return self.engine_input.params

    @property
    def turn(self) -> Any:
        """A chat's edgespec.agents.Turn (tool calls read out of the text); None otherwise."""
        return self.engine_input.turn

    @property
    def logits_processor(self) -> Callable | None:
        return self.request.logits_processor

    def events(self, engine: "Engine", wrap: Callable[[Iterator[Event]], Iterator[Event]]
               | None = None) -> Iterator[CoreEvent]:
        """The core's events for this call on ``engine`` (``wrap``: see protocol.core.execute);
        its errors raised as edgespec's own."""
        gen = execute(engine, self.request, self.engine_input, wrap=wrap)
        try:
            with _refusals():
                yield from gen
        finally:
            gen.close()  # the engine is free as soon as the consumer stops reading

    def render(self, events: Iterator[CoreEvent]):
        return self.chunks(events) if self.stream else self.whole(events)

    def whole(self, events: Iterator[CoreEvent]) -> dict:
        done = _done(events)
        lps = shapes.completion_logprobs(done.logprobs, self.piece, self.offset)
        use = shapes.usage(done.prompt_tokens, done.completion_tokens)
        finish = _finish(done)
        if self.head.kind == "chat":
            message = _message(done)
            if self.turn is not None and self.turn.choice.mode == "named" and done.tool_calls:
                # llama-cpp-python also fills the legacy field when a function is named
                message["function_call"] = dict(message["tool_calls"][0]["function"])
            return shapes.chat_completion(self.head, done.text, finish, use, lps, message)
        return shapes.completion(self.head, done.text, finish, use, lps)

    def chunks(self, events: Iterator[CoreEvent]) -> Iterator[dict]:
        """One chunk per piece of visible text (a token's, as llama-cpp-python streams them;
        a held-back stop-string prefix or a split UTF-8 character joins the next piece),
        a tool call's id and name then its arguments, then the finishing chunk."""
        chat = self.head.kind == "chat"
        want = self.params.logprobs is not None
        at = self.offset
        pending: list[TokenLogprob] = []  # logprobs of tokens whose text has not shown yet
        try:
            if chat:
                yield shapes.chat_chunk(self.head, {"role": "assistant"})
            for ev in events:
                if isinstance(ev, ChoiceDone):
                    finish = _finish(ev)
                    yield (shapes.chat_chunk(self.head, {}, finish=finish) if chat else
                           shapes.completion_chunk(self.head, "", finish=finish))
                    return
                if isinstance(ev, TextDelta):
                    for text, lps in _pieces(ev, pending):
                        lp = shapes.completion_logprobs(lps, self.piece, at) if want else None
                        at += len(text)
                        yield (shapes.chat_chunk(self.head, {"content": text}, lp) if chat
                               else shapes.completion_chunk(self.head, text, lp))
                elif isinstance(ev, ToolCallDelta):
                    # the tokens of a call's markup: their logprobs go with the call
                    lp = shapes.completion_logprobs(pending, self.piece, at) if want else None
                    pending.clear()
                    yield shapes.chat_chunk(self.head, {"tool_calls": [_call_delta(ev)]}, lp)
                elif isinstance(ev, ReasoningDelta):
                    yield shapes.chat_chunk(self.head, {"reasoning_content": ev.text})
            raise Cancelled("the request ended before the engine finished it")
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # the engine is free as soon as the consumer stops reading


def _pieces(ev: TextDelta, pending: list[TokenLogprob]
            ) -> Iterator[tuple[str, list[TokenLogprob]]]:
    """(text, logprobs of its tokens) per non-empty piece of ``ev``: one per token where the
    delta is the tokens' own text (llama-cpp-python's one chunk per token), else the whole
    delta (text a chat turn's parser released, a tail released at the end)."""
    if ev.tokens and "".join(t.text for t in ev.tokens) == ev.text:
        for i, tok in enumerate(ev.tokens):
            if i < len(ev.logprobs):
                pending.append(ev.logprobs[i])
            if tok.text:
                yield tok.text, pending[:]
                pending.clear()
        return
    pending.extend(ev.logprobs)
    if ev.text:
        yield ev.text, pending[:]
        pending.clear()


def _done(events: Iterator[CoreEvent]) -> ChoiceDone:
    done = None
    for ev in events:
        if isinstance(ev, ChoiceDone):
            done = ev
    if done is None:
        raise Cancelled("the request ended before the engine finished it")
    return done


def _finish(done: ChoiceDone) -> str:
    # llama-cpp-python knows "stop" and "length" (a cancelled request reads as stopped)
    return shapes.finish_reason(done.stop_reason) if done.finish in _NEUTRAL_FINISH \
        else done.finish


def _message(done: ChoiceDone) -> dict:
    """The assistant message (OpenAI's shape; content None when only calls)."""
    msg: dict = {"role": "assistant",
                 "content": done.text if done.text or not done.tool_calls else None}
    if done.reasoning:
        msg["reasoning_content"] = done.reasoning
    if done.tool_calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in done.tool_calls]
    return msg


def _call_delta(ev: ToolCallDelta) -> dict:
    if ev.id is not None:  # OpenAI's stream order: the call's id and name first
        return {"index": ev.call, "id": ev.id, "type": "function",
                "function": {"name": ev.name, "arguments": ev.arguments}}
    return {"index": ev.call, "function": {"arguments": ev.arguments}}


@contextmanager
def _refusals() -> Iterator[None]:
    """The core's ProtocolError as edgespec's own error types, which apps catch (the error
    the core mapped, where there was one)."""
    try:
        yield
    except ProtocolError as e:
        raise _native(e) from None


def _native(e: ProtocolError) -> EdgespecError:
    if isinstance(e.__context__, EdgespecError):
        return e.__context__
    if e.kind == "unsupported":
        return UnsupportedError(e.message)
    if e.kind == "context_overflow":
        return ContextOverflowError(e.message)
    return InvalidInputError(e.message)


def _planned(engine: "Engine", head: shapes.Head, req: Callable[[], CoreRequest]
             ) -> tuple[CoreRequest, EngineInput]:
    with _refusals():
        request = req()
        return request, engine_input(engine, request, head.model, "none")


# --- arguments -> Call ---------------------------------------------------------------------
def completion_call(engine: "Engine", prompt, suffix=None, max_tokens=16, temperature=0.8,
                    top_p=0.95, min_p=0.05, typical_p=1.0, logprobs=None, echo=False, stop=(),
                    frequency_penalty=0.0, presence_penalty=0.0, repeat_penalty=1.0, top_k=40,
                    stream=False, seed=None, tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0,
                    mirostat_eta=0.1, model=None, stopping_criteria=None, logits_processor=None,
                    grammar=None, logit_bias=None, *, defaults: Defaults = Defaults()) -> Call:
    """Validate ``create_completion``'s arguments into a :class:`Call` (nothing runs)."""
    if not isinstance(prompt, str):
        if not (isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            raise InvalidInputError(f"prompt must be a string or a non-empty list of token ids "
                                    f"(got {type(prompt).__name__})")
        # token ids are read as given (no BOS added), as llama-cpp-python reads them
        prompt = tuple(int(t) for t in prompt)
    if suffix is not None:
        raise UnsupportedError("suffix: fill-in-the-middle is not supported; leave suffix out "
                               "and put the text after the gap in the prompt")
    _refuse_callbacks(stopping_criteria=stopping_criteria)
    processor = _processor(logits_processor)
    if echo and logprobs is not None:
        raise UnsupportedError("echo with logprobs: edgespec does not compute the prompt "
                               "tokens' logprobs; drop echo or logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or logprobs < 0):
        raise InvalidInputError(f"logprobs is the number of alternatives to report, an int >= 0 "
                                f"(got {logprobs!r})")
    head = shapes.Head("completion", _model(engine, model, defaults))
    params = _params(engine, defaults, locals(), chat=False, logprobs=logprobs)
    # llama-cpp-python echoes the prompt only in a whole response; its stream ignores echo
    request, planned = _planned(engine, head, lambda: CoreRequest(
        model=head.model, params=params, prompt=prompt, echo=bool(echo) and not stream,
        origins=True, reasoning_format="none", logits_processor=processor,
        param_prompt="prompt"))
    text = prompt if isinstance(prompt, str) else \
        engine.target.detokenize(list(prompt)).decode("utf-8", errors="ignore")
    return Call(head, request, planned, bool(stream), engine.target.token_piece,
                offset=len(text))


def chat_call(engine: "Engine", messages, functions=None, function_call=None, tools=None,
              tool_choice=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
              typical_p=1.0, stream=False, stop=(), seed=None, response_format=None,
              max_tokens=None, presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.0,
              tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, model=None,
              logits_processor=None, grammar=None, logit_bias=None, logprobs=None,
              top_logprobs=None, *, defaults: Defaults = Defaults()) -> Call:
    """Validate ``create_chat_completion``'s arguments into a :class:`Call` (nothing runs)."""
    processor = _processor(logits_processor)
    structured = _response_format(response_format)
    if structured and grammar is not None:
        raise InvalidInputError("give grammar or response_format, not both")
    tools, tool_choice = _legacy_functions(tools, tool_choice, functions, function_call)
    if tools and tool_choice not in (None, "auto", "none") and (structured or grammar is not None):
        raise InvalidInputError("tool_choice forces a call, whose grammar cannot be combined "
                                "with response_format or grammar; send one of them")
    n_top = None
    if logprobs:  # llama-cpp-python: logprobs=top_logprobs if logprobs else None
        n_top = 0 if top_logprobs is None else top_logprobs
        if isinstance(n_top, bool) or not isinstance(n_top, int) or n_top < 0:
            raise InvalidInputError(f"top_logprobs must be an int >= 0 (got {top_logprobs!r})")
    head = shapes.Head("chat", _model(engine, model, defaults))
    msgs = _messages(messages)
    params = _params(engine, defaults, locals(), chat=True, logprobs=n_top, **structured)
    # reasoning stays in the content (reasoning_format "none"), as llama-cpp-python leaves it
    request, planned = _planned(engine, head, lambda: CoreRequest(
        model=head.model, params=params, messages=tuple(msgs),
        tools=tuple(tools) if tools is not None else None, tool_choice=tool_choice,
        origins=True, reasoning_format="none", logits_processor=processor))
    return Call(head, request, planned, bool(stream), engine.target.token_piece)


def _model(engine: "Engine", model: str | None, defaults: Defaults) -> str:
    if model is not None:
        return str(model)
    return defaults.model if defaults.model is not None else engine.target_name


def _max_tokens(engine: "Engine", max_tokens) -> int:
    # llama-cpp-python: None or <= 0 generates until the context is full (and more than
    # the context is that too); the engine ends such a request with stop reason "context",
    # reported as finish_reason "length"
    n_ctx = engine.ctx.n_ctx
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        max_tokens = min(max_tokens, n_ctx) if max_tokens > 0 else None
    return limits.max_tokens(max_tokens, n_ctx)


#: the arguments of completion_call and chat_call that make the GenerationParams: the two
#: share llama-cpp-python's names for them, so one helper reads them by name
_PARAM_ARGS = ("max_tokens", "stop", "grammar", "temperature", "top_p", "top_k", "min_p",
               "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
               "mirostat_mode", "seed", "logit_bias")


def _params(engine: "Engine", defaults: Defaults, args: Mapping[str, Any], *, chat: bool,
            logprobs: int | None, **structured: Any) -> GenerationParams:
    """A call's GenerationParams from its arguments (``args``: the call's ``locals()``, of
    which the names in _PARAM_ARGS are read), refusals as edgespec's errors."""
    a = {k: args[k] for k in _PARAM_ARGS}
    with _refusals():
        max_tokens = _max_tokens(engine, a.pop("max_tokens"))
        stop = limits.stops(a.pop("stop"))
        grammar = a.pop("grammar")
        return GenerationParams(max_tokens=max_tokens, stop=stop, chat=chat, logprobs=logprobs,
                                sampling=_sampling(engine, defaults, **a),
                                grammar=_grammar(grammar), **structured)


def _sampling(engine: "Engine", defaults: Defaults, *, temperature, top_p, top_k, min_p,
              typical_p, repeat_penalty, presence_penalty, frequency_penalty, mirostat_mode,
              seed, logit_bias) -> SamplingParams:
    temperature = float(temperature)
    if temperature > 0.0:  # llama-cpp-python reads these only when it samples
        if mirostat_mode not in (0, None):
            raise UnsupportedError(f"mirostat_mode={mirostat_mode}: mirostat sampling is not "
                                   "supported; use temperature with top_k/top_p/min_p")
        if typical_p not in (1.0, None):
            raise UnsupportedError(f"typical_p={typical_p}: locally typical sampling is not "
                                   "supported; leave typical_p at 1.0 and use top_p or min_p")
    if seed is None:
        seed = defaults.seed
    elif seed in RANDOM_SEEDS:
        seed = None
    return limits.sampling(
        temperature=temperature, default_temperature=temperature, top_p=float(top_p),
        top_k=max(0, int(top_k)), min_p=float(min_p), repeat_penalty=float(repeat_penalty),
        presence_penalty=float(presence_penalty), frequency_penalty=float(frequency_penalty),
        # llama-cpp-python's biases are unbounded; -inf bans a token
        bias=limits.logit_bias(_bias_keys(logit_bias), engine.target.n_vocab, bound=None),
        seed=seed, repeat_last_n=defaults.repeat_last_n)


def _bias_keys(bias) -> dict | None:
    """llama-cpp-python's ``{token_id: bias}`` keyed as JSON keys them (digit strings)."""
    if not bias:
        return None
    if not isinstance(bias, Mapping):
        raise InvalidInputError("logit_bias must map token ids to biases ({token_id: bias})")
    return {str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v
            for k, v in bias.items()}


def _grammar(grammar) -> str | None:
    """GBNF text from ``grammar``: a string, or a ``llama_cpp.LlamaGrammar`` (which keeps the
    text it was made from; edgespec compiles it with the target's own vocabulary)."""
    if grammar is None or isinstance(grammar, str):
        return grammar
    text = getattr(grammar, "_grammar", None)
    if isinstance(text, str):
        return text
    raise InvalidInputError(f"grammar must be GBNF text or a llama_cpp.LlamaGrammar (got "
                            f"{type(grammar).__name__})")


def _response_format(rf) -> dict:
    """``response_format`` as GenerationParams fields: ``{"type": "json_object"}`` (any JSON
    object), llama-cpp-python's ``{"type": "json_object", "schema": {...}}`` and OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": {...}}}`` (that schema), enforced on
    every path by edgespec.grammar."""
    if rf is None:
        return {}
    if not isinstance(rf, Mapping) or "type" not in rf:
        raise InvalidInputError("response_format must be a dict with a type: {'type': "
                                "'json_object'} or {'type': 'json_schema', 'json_schema': "
                                "{'schema': {...}}}")
    kind = rf["type"]
    if kind == "text":
        return {}
    if kind == "json_object":
        schema = rf.get("schema")
        return {"json_schema": schema} if schema is not None else {"json_mode": True}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise InvalidInputError("response_format json_schema needs json_schema.schema (a "
                                    "JSON schema object)")
        return {"json_schema": schema}
    raise InvalidInputError(f"response_format type {kind!r} is not one of text, json_object, "
                            "json_schema")


def _messages(messages) -> list[dict]:
    """The conversation as the engine renders it through the GGUF chat template: a text
    content part list joined; what a text model cannot read refused."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise InvalidInputError(f"messages[{i}] must be a dict with 'role' and 'content'")
        if m.get("function_call") or m["role"] == "function":
            raise UnsupportedError(f"messages[{i}]: legacy function messages are not "
                                   "supported; send tool_calls and role 'tool' messages")
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            texts = []
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                else:
                    kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                    raise UnsupportedError(f"messages[{i}].content[{j}] is a {kind!r} part; "
                                           "edgespec serves text models: send text parts only")
            content = "".join(texts)
        msg = dict(m)
        # llama-cpp-python hands a missing content to the template as None; a message
        # without calls reads as empty text
        msg["content"] = "" if content is None and not m.get("tool_calls") else content
        out.append(msg)
    return out


def _processor(logits_processor):
    """``logits_processor`` as one callable: a function, a ``llama_cpp.LogitsProcessorList``
    (callable itself) or a plain list of functions, applied in order as that list does."""
    if logits_processor is None or callable(logits_processor):
        return logits_processor
    if isinstance(logits_processor, (list, tuple)) and all(callable(f) for f in logits_processor):
        funcs = tuple(logits_processor)

        def chained(input_ids, scores):
            for f in funcs:
                scores = f(input_ids, scores)
            return scores
        return chained
    raise InvalidInputError("logits_processor must be callable as (input_ids, logits) -> "
                            "logits (a function, a list of them or a "
                            "llama_cpp.LogitsProcessorList)")


def _refuse_callbacks(**given) -> None:
    for name, value in given.items():
        if value is not None:
            raise UnsupportedError(
                f"{name}: Python callbacks over logits cannot be replayed by speculative "
                "verification; use grammar, response_format, logit_bias or stop instead")


def _legacy_functions(tools, tool_choice, functions, function_call):
    """``functions`` / ``function_call`` as tools and tool_choice, as llama-cpp-python's
    chat handlers convert them; a tool_choice of "auto" or "none" without tools is dropped,
    as llama-cpp-python drops it."""
    if functions is not None:
        if tools:
            raise InvalidInputError("give tools or the legacy functions, not both")
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if tool_choice is not None:
            raise InvalidInputError("give tool_choice or the legacy function_call, not both")
        tool_choice = (function_call if isinstance(function_call, str) else
                       {"type": "function", "function": {"name": function_call.get("name")}}
                       if isinstance(function_call, Mapping) else function_call)
    if not tools and tool_choice in ("auto", "none"):
        tool_choice = None
    return tools, tool_choice


__all__ = ["Call", "Defaults", "chat_call", "completion_call", "create_chat_completion",
           "create_completion"]
