"""Agents' side of a chat turn: tool declarations and calls, reasoning output.

Pure text in, OpenAI shapes out, no model and no server: ``edgespec serve`` and the
llama-cpp-python-shaped API both build a :class:`Turn` per request and read the output back
through it.

* :mod:`.tools`: ``tools`` / ``tool_choice`` validated; the grammar of a forced call
* :mod:`.calls`: call markup (hermes, llama3, mistral) -> ``tool_calls``, incrementally
* :mod:`.reasoning`: a leading ``<think>`` block -> ``reasoning_content``, incrementally
* :mod:`.turn`: the three together for one assistant turn
"""
from .calls import CallParser, ToolCall, detect_format
from .reasoning import ReasoningSplitter
from .tools import Choice, Tool, ToolError, ToolSupportError, parse_choice, parse_tools
from .turn import MALFORMED, Turn, TurnOutput, prepare_turn, supports_tools, template_messages

__all__ = ["CallParser", "Choice", "MALFORMED", "ReasoningSplitter", "Tool", "ToolCall",
           "ToolError", "ToolSupportError", "Turn", "TurnOutput", "detect_format",
           "parse_choice", "parse_tools", "prepare_turn", "supports_tools", "template_messages"]
