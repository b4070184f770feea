"""OpenAI request -> (prompt, GenerationParams): what each field means to the engine, and
the refusals of values it cannot honour (each names the field and what to send instead)."""
from __future__ import annotations

from ..api.params import GenerationParams, SamplingParams
from .errors import APIError, bad_request, unsupported
from .schemas import ChatCompletionRequest, CompletionRequest, Message
from .settings import ServerSettings
from ..agents import ToolError, ToolSupportError, prepare_turn
from dataclasses import replace


def chat_request(req: ChatCompletionRequest, settings: ServerSettings, n_vocab: int
                 ) -> tuple[list[dict], GenerationParams]:
    _refuse_common(req)
    if req.functions:
        raise unsupported("functions", "functions (OpenAI's deprecated function calling) is not "
                                       "supported; declare them as tools")
    if req.function_call not in (None, "none"):
        raise unsupported("function_call", "function_call is deprecated and not supported; "
                                           "use tool_choice")
    if req.modalities not in (None, ["text"]):
        raise unsupported("modalities", "only text output is supported")
    for field in ("audio", "prediction", "reasoning_effort"):
        if getattr(req, field) is not None:
            raise unsupported(field, f"{field} is not supported by this server; leave it out")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens disagree; send one of them",
                          param="max_completion_tokens")
    structured = _response_format(req)
    params = GenerationParams(
        max_tokens=_max_tokens(req.max_completion_tokens or req.max_tokens, settings),
        stop=_stop(req.stop), chat=True,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        sampling=_sampling(req, settings, n_vocab), **structured)
    return [_message(i, m) for i, m in enumerate(req.messages)], params


def completion_request(req: CompletionRequest, settings: ServerSettings, n_vocab: int
                       ) -> tuple[str, GenerationParams]:
    _refuse_common(req)
    if req.echo:
        raise unsupported("echo", "echo is not supported; the prompt is yours already")
    if req.best_of not in (None, 1):
        raise unsupported("best_of", "best_of > 1 is not supported; send one request per "
                                     "candidate")
    if req.suffix is not None:
        raise unsupported("suffix", "suffix (fill-in-the-middle) is not supported")
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        elif prompt and all(isinstance(p, str) for p in prompt):
            raise unsupported("prompt", "a batch of prompts is not supported; send one "
                                        "request per prompt")
        else:
            raise unsupported("prompt", "token-id prompts are not supported; send the prompt "
                                        "as text")
    params = GenerationParams(
        max_tokens=_max_tokens(req.max_tokens, settings), stop=_stop(req.stop), chat=False,
        logprobs=req.logprobs, sampling=_sampling(req, settings, n_vocab))
    return prompt, params


# --- pieces ---------------------------------------------------------------------------------
def _refuse_common(req) -> None:
    # n > 1 is served (edgespec.server.choices), within the server's sequences
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream: true",
                          param="stream_options")


def _max_tokens(asked: int | None, settings: ServerSettings) -> int:
    if asked is None:
        return settings.max_tokens_limit
    if asked > settings.max_tokens_limit:
        raise bad_request(f"max_tokens is {asked} but this server allows at most "
                          f"{settings.max_tokens_limit} (its --max-tokens-limit); ask for less",
                          param="max_tokens", code="invalid_value")
    return asked


def _stop(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 16:
        raise bad_request(f"{len(stops)} stop strings; at most 16 are allowed", param="stop")
    if not all(stops):
        raise bad_request("stop strings must be non-empty", param="stop")
    return stops


def _sampling(req, settings: ServerSettings, n_vocab: int) -> SamplingParams:
    bias = ()
    if req.logit_bias:
        pairs = []
        for key, value in req.logit_bias.items():
            if not key.isdigit() or int(key) >= n_vocab:
                raise bad_request(f"logit_bias key {key!r} is not a token id of this model "
                                  f"(0..{n_vocab - 1})", param="logit_bias")
            if not -100.0 <= value <= 100.0:
                raise bad_request(f"logit_bias for token {key} is {value}; biases are in "
                                  "[-100, 100]", param="logit_bias")
            pairs.append((int(key), float(value)))
        bias = tuple(sorted(pairs))
    temperature = settings.default_temperature if req.temperature is None else req.temperature
    return SamplingParams(
        temperature=temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=bias, seed=req.seed)


def _response_format(req: ChatCompletionRequest) -> dict:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return {}
    if rf.type == "json_object":
        return {"json_mode": True}
    if rf.json_schema is None or not rf.json_schema.schema_:
        raise bad_request("response_format json_schema needs json_schema.schema (a JSON "
                          "schema object)", param="response_format.json_schema")
    return {"json_schema": rf.json_schema.schema_}


def _message(i: int, m: Message) -> dict:
    """One message, OpenAI-shaped; its tool calls and tool-result ids are checked with the
    turn (chat_turn), which knows the whole conversation."""
    where = f"messages.{i}"
    if m.name is not None and m.role != "tool":
        raise unsupported(f"{where}.name", "message names are not supported: the model's chat "
                                           "template has no place for them; put the name in "
                                           "the content")
    if m.content is None and not m.tool_calls:
        raise bad_request(f"{where}.content is missing", param=f"{where}.content")
    text = None if m.content is None else (
        m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content))
    role = "system" if m.role == "developer" else m.role
    msg = {"role": role, "content": text}
    if m.tool_calls:
        msg["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        msg["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        msg["name"] = m.name
    return msg


def chat_turn(req: ChatCompletionRequest, messages: list[dict], params: GenerationParams,
              template: str | None, settings: ServerSettings):
    """The turn's tools, tool_choice, reasoning split and template kwargs (edgespec.agents),
    folded into the request's params: (template messages, params, Turn)."""

    forced = req.tool_choice not in (None, "auto", "none")
    if forced and (params.json_schema is not None or params.json_mode):
        raise bad_request("tool_choice forces a call, whose grammar cannot be combined with "
                          "response_format; send one of them", param="response_format")
    try:
        turn = prepare_turn(template, settings.served_model, messages, tools=req.tools,
                            tool_choice=req.tool_choice,
                            parallel_tool_calls=req.parallel_tool_calls,
                            reasoning_format=req.reasoning_format or settings.reasoning_format,
                            chat_template_kwargs=req.chat_template_kwargs)
    except (ToolError, ToolSupportError) as e:
        raise APIError(400, str(e), param=e.param, code=e.code) from None
    stop = params.stop + tuple(s for s in turn.stop if s not in params.stop)
    if len(stop) > 16:
        raise bad_request(f"{len(params.stop)} stop strings and parallel_tool_calls false, "
                          "which ends the output after the first call with a stop string of "
                          "its own; send at most 15", param="stop")
    params = replace(params, template_vars=turn.template_vars or None, stop=stop,
                     grammar=turn.grammar if turn.grammar is not None else params.grammar)
    return turn.messages, params, turn
