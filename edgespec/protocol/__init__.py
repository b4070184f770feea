"""The protocol core: one neutral request and one event stream under every dialect.

A dialect (edgespec.server.dialects: OpenAI chat and completions, Anthropic Messages,
Responses, Ollama, llama.cpp native) parses its wire format into a
:class:`~.request.CoreRequest` and renders the :mod:`.events` that :class:`~.core.Core`
yields; limits and field checks (:mod:`.limits`), errors (:mod:`.errors`), llama-server's
``timings`` (:mod:`.timings`) and fill-in-the-middle prompts (:mod:`.fim`) are defined
here once. A floor below edgespec.server and edgespec.apps: it imports api, agents,
serving, chat and errors, never a web framework.
"""
from .core import SLICE_HEADER, Core, Running, execute, run
from .errors import ProtocolError, bad_request, from_edgespec, not_found, unsupported
from .events import (ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, TokenPiece, ToolCall,
                     ToolCallDelta)
from .fim import fim_prompt, fim_tokens
from .engine_input import EngineInput, apply_template, engine_input
from .request import CoreRequest, Fim
from .timings import timings

__all__ = ["ChoiceDone", "Core", "CoreEvent", "CoreRequest", "EngineInput", "Fim", "ProtocolError",
           "ReasoningDelta", "Running", "SLICE_HEADER", "TextDelta", "TokenPiece", "ToolCall",
           "ToolCallDelta", "apply_template", "bad_request", "execute", "fim_prompt", "fim_tokens",
           "from_edgespec", "engine_input", "not_found", "run", "timings", "unsupported"]
