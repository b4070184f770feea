"""llama-server's native endpoints over the protocol core: ``POST /completion``,
``/infill``, ``/tokenize``, ``/detokenize``, ``/apply-template``, ``GET /props``,
``/slots`` and ``/v1/health`` (``/health`` is the info routes').

Tools written for llama-server (llama.vscode and llama.vim call ``/infill``; the llama.cpp
web UI, llama-swap and dashboards read ``/props``, ``/slots`` and ``timings``) find the same
fields here; every generation runs on the same scheduler, speculation included, and its
``timings`` carry ``draft_n`` / ``draft_n_accepted`` and the ``proposer``. A stream is SSE
``data:`` lines without a ``[DONE]`` line, as llama-server sends it; errors are
llama-server's ``{"error": {"code", "message", "type"}}``. Each intended difference from
llama-server is listed in docs/server.md. The wire shapes are :mod:`.llamacpp_wire`.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import FastAPI, Request  # module level: FastAPI reads the annotations
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from ..._version import __version__
from ...api.params import GenerationParams, SamplingParams
from ...protocol.core import Core, Running
from ...protocol.request import CoreRequest
from ...protocol.errors import ProtocolError
from ...protocol.events import ChoiceDone, TextDelta
from ...protocol.fim import fim_prompt
from ...protocol.engine_input import apply_template
from ..body import read
from ..settings import ServerSettings
from .fields import check, get, invalid, load_object
from .refusal import counted, refusing
from .refusal import to_protocol as refusal_to_protocol
from .llamacpp_wire import (DEFAULTS, Completion, Shape, as_token_prompt, error_body,
                            generation_settings, infill_tokens, parse_completion, parse_infill,
                            token_pieces, with_vocab)

if TYPE_CHECKING:
    from ...engine.engine import Engine
    from ...runtime.model import Model
    from ...serving import Held
    from ...serving.scheduler import SlotState

log = logging.getLogger("edgespec.server")


def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    """llama-server's native routes on ``app``."""

    async def body_of(request: Request) -> dict[str, Any]:
        return load_object(await read(request, settings))

    @refusing(refusal)
    async def generation(request: Request, infill: bool) -> Response:
        body = await body_of(request)
        c = (parse_infill if infill else parse_completion)(body, settings.max_tokens_limit)
        async with core.held(c.core.model) as held:
            engine, name = held.engine, held.name
            c = with_vocab(c, engine.target.n_vocab)
            if infill:
                c = await asyncio.to_thread(_infill_prompt, engine, c, name)
            prompt_text, prompt_n = await asyncio.to_thread(_prompt_text, engine, c)
            if c.stream:  # per-token pieces: each streamed object counts its tokens
                c = replace(c, core=replace(c.core, origins=True))
            run = await core.start(request, c.core)
        model = c.core.model or name
        shape = Shape(c, model, prompt_text,
                      generation_settings(c.core.params, c),
                      prompt_n, piece=engine.target.token_piece)
        if c.stream:
            return EventSourceResponse(_sse(run, shape), sep="\n", ping=15)
        done = (await run.collect())[0]
        return JSONResponse(shape.final(done, whole=True))

    @app.post("/completion")
    async def completion(request: Request) -> Response:
        return await generation(request, infill=False)

    @app.post("/infill")
    async def infill(request: Request) -> Response:
        return await generation(request, infill=True)

    @app.post("/tokenize")
    @refusing(refusal)
    async def tokenize(request: Request) -> Response:
        body = await body_of(request)
        content = body.get("content")
        add_special = get(body, "add_special", bool, default=False)
        parse_special = get(body, "parse_special", bool, default=True)
        with_pieces = get(body, "with_pieces", bool, default=False)
        async with core.held(get(body, "model", str)) as held:
            target = held.engine.target
            tokens = [] if content is None else await asyncio.to_thread(
                _tokenize, target, content, add_special, parse_special)
            # pieces as llama-server writes them: special tokens as their text
            out: Any = token_pieces(tokens, lambda t: target.token_piece(t, special=True)) \
                if with_pieces else tokens
        return JSONResponse({"tokens": out})

    @app.post("/detokenize")
    @refusing(refusal)
    async def detokenize(request: Request) -> Response:
        body = await body_of(request)
        tokens = get(body, "tokens", list, default=[])
        for i, t in enumerate(tokens):
            check(t, int, f"tokens.{i}")
        async with core.held(get(body, "model", str)) as held:
            target = held.engine.target
            bad = [t for t in tokens if not 0 <= t < target.n_vocab]
            if bad:
                raise invalid(f"token id {bad[0]} is outside this model's vocabulary "
                              f"(0..{target.n_vocab - 1})", "tokens")
            text = target.detokenize(tokens, special=True).decode("utf-8", "replace")
        return JSONResponse({"content": text})

    @app.post("/apply-template")
    @refusing(refusal)
    async def apply_template_route(request: Request) -> Response:
        body = await body_of(request)
        messages = get(body, "messages", list, required=True)
        tools = get(body, "tools", list)
        kwargs = get(body, "chat_template_kwargs", dict)
        async with core.held(get(body, "model", str)) as held:
            prompt = await asyncio.to_thread(
                apply_template, held.engine, _template_messages(messages), tools=tools,
                add_generation_prompt=get(body, "add_generation_prompt", bool,
                                          default=True),
                chat_template_kwargs=kwargs)
        return JSONResponse({"prompt": prompt})

    @app.get("/props")
    @refusing(refusal)
    async def props(request: Request) -> Response:
        async with core.held(request.query_params.get("model")) as held:
            return JSONResponse(await asyncio.to_thread(_props, held, core, settings))

    @app.get("/slots")
    @refusing(refusal)
    async def slots(request: Request) -> Response:
        async with core.held(request.query_params.get("model")) as held:
            states = held.scheduler.slots()
            n_ctx = held.engine.config.n_ctx
            speculative = held.engine.default_proposer != "none"
        if request.query_params.get("fail_on_no_slot") and \
                not any(not s.processing for s in states):
            raise ProtocolError(503, "no slot available", kind="overloaded",
                                code="no_slot_available")
        return JSONResponse([_slot(s, n_ctx, speculative) for s in states])

    @app.get("/v1/health")
    async def health_v1() -> Response:
        load = core.pool.load()
        return JSONResponse({"status": "ok", "slots_idle": load.slots - load.running,
                             "slots_processing": load.running})


def _infill_prompt(engine: Engine, c: Completion, name: str) -> Completion:
    """/infill with a ``prompt`` after the middle token: the FIM prompt as token ids (the
    core's FIM request has no text after the middle token)."""
    if not c.middle:
        return c
    target = engine.target
    bos = target.bos if getattr(target, "add_bos", False) else None
    assert c.core.fim is not None
    ids = fim_prompt(target, c.core.fim, name, bos=bos)
    middle = target.tokenize(c.middle, add_special=False, parse_special=False)
    return as_token_prompt(c, infill_tokens(ids, middle))


def _prompt_text(engine: Engine, c: Completion) -> tuple[str, int]:
    """The answer's ``prompt`` field (the text the model read, special tokens shown) and
    the prompt's length in tokens."""
    p = c.core.prompt
    target = engine.target
    if isinstance(p, str):
        return p, len(target.tokenize(p))
    if p is None and c.core.fim is not None:
        try:
            bos = target.bos if getattr(target, "add_bos", False) else None
            p = tuple(fim_prompt(target, c.core.fim, "the model", bos=bos))
        except ProtocolError:
            return "", 0
    ids = list(p or ())
    return target.detokenize(ids, special=True).decode("utf-8", "replace"), len(ids)


def _tokenize(target: Model, content: Any, add_special: bool, parse_special: bool) -> list[int]:
    """llama-server's tokenize_mixed: text, or a list of texts and token ids."""
    if isinstance(content, str):
        return target.tokenize(content, add_special=add_special, parse_special=parse_special)
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of strings and token ids",
                      "content", "invalid_type")
    out: list[int] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out += target.tokenize(part, add_special=add_special and i == 0,
                                   parse_special=parse_special)
        elif isinstance(part, int) and not isinstance(part, bool) and 0 <= part < target.n_vocab:
            out.append(part)
        else:
            raise invalid(f"content.{i} must be a string or a token id of this model",
                          f"content.{i}")
    return out


def _template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI messages for the template: content parts joined into text."""
    out = []
    for i, m in enumerate(messages):
        check(m, dict, f"messages.{i}")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                check(part, dict, f"messages.{i}.content.{j}")
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise invalid(f"messages.{i}.content.{j}: only text parts are supported",
                                  f"messages.{i}.content.{j}")
                texts.append(part["text"])
            content = "".join(texts)
        out.append({**m, "content": content})
    return out


def _props(held: Held, core: Core, settings: ServerSettings) -> dict[str, Any]:
    """llama-server's /props for the held model, with an ``edgespec`` object beside it."""
    engine = held.engine
    target = engine.target
    cfg = engine.config
    defaults = GenerationParams(max_tokens=settings.max_tokens_limit, chat=False,
                                sampling=SamplingParams(
                                    temperature=DEFAULTS["temperature"],
                                    top_k=int(DEFAULTS["top_k"]), top_p=DEFAULTS["top_p"],
                                    min_p=DEFAULTS["min_p"]))
    c = Completion(CoreRequest(model=None, params=defaults, prompt=" "), stream=False)
    gen = generation_settings(defaults, c, metrics_only=True)
    template = target.chat_template() or ""

    def special(tok: int) -> str:
        text: str = target.detokenize([tok], special=True).decode("utf-8", "replace")
        return text

    return {
        "default_generation_settings": {"params": gen, "n_ctx": cfg.n_ctx},
        "total_slots": held.scheduler.parallel, "model_alias": held.name,
        "model_ftype": "", "model_path": str(target.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "", "endpoint_slots": True, "endpoint_props": False,
        "endpoint_metrics": True, "ui": bool(getattr(settings, "web", False)),
        "ui_settings": {}, "chat_template": template, "chat_template_caps": {},
        "bos_token": special(target.bos), "eos_token": special(target.eos),
        "build_info": f"edgespec {__version__}", "is_sleeping": False,
        "cors_proxy_enabled": False,
        "edgespec": {"proposer": engine.default_proposer, "exact": bool(engine.exact),
                     "identity": engine.identity.hash}}


def _slot(s: SlotState, n_ctx: int | None, speculative: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": s.id, "n_ctx": n_ctx, "speculative": speculative,
                           "is_processing": s.processing}
    if s.processing and s.params is not None:
        out.update(id_task=s.request_id, n_prompt_tokens=s.prompt_tokens,
                   params={"max_tokens": s.params.max_tokens,
                           "n_predict": s.params.max_tokens,
                           "temperature": s.params.sampling.temperature,
                           "top_k": s.params.sampling.top_k, "top_p": s.params.sampling.top_p,
                           "min_p": s.params.sampling.min_p, "stop": list(s.params.stop)},
                   next_token=[{"has_next_token": True, "has_new_line": False,
                                "n_remain": max(s.params.max_tokens - s.generated, 0),
                                "n_decoded": s.generated}])
    return out


async def _sse(run: Running, shape: Shape) -> AsyncIterator[str]:
    complete = False
    try:
        async for ev in run:
            if isinstance(ev, TextDelta) and (ev.text or ev.tokens):
                yield json.dumps(shape.chunk(ev.text, len(ev.tokens)))
            elif isinstance(ev, ChoiceDone):
                yield json.dumps(shape.final(ev, whole=False))
        complete = True
    except Exception as e:
        complete = True
        yield json.dumps(error_body(to_protocol(e)))
    finally:
        if not complete:  # the client went away (sse-starlette cancels this generator)
            run.cancel()


def to_protocol(e: BaseException) -> ProtocolError:
    err = refusal_to_protocol(e)
    if err.code == "fim_unsupported" and err.param != "input_extra":
        # llama-server answers a model without FIM tokens 501 not_supported_error
        return ProtocolError(501, err.message, kind="unsupported", param=err.param,
                             code=err.code)
    return err


def refusal(request: Request, e: BaseException) -> Response:
    """llama-server's error answer, counted."""
    err = to_protocol(e)
    counted(request, err)
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)
