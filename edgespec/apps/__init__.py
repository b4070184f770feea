"""The API apps already use: llama-cpp-python's ``Llama`` shapes and an asyncio interface.

- :class:`Llama` (:mod:`.llama_compat`): ``llama_cpp.Llama``'s constructor; an app moves
  over by changing its import and constructor line;
- ``completions.create_chat_completion(engine, ...)`` / ``completions.create_completion``
  (:mod:`.completions`): llama-cpp-python's arguments, its OpenAI-shaped dicts and stream
  chunks (:mod:`.shapes`), over any engine's event stream with speculation on (the engine
  itself knows no front end);
- :class:`AsyncEngine` (:mod:`.aio`): ``async for`` over events or chunks without blocking
  the loop; cancelling the task cancels the request.

Importing this package does not load llama.cpp; building a ``Llama`` does.
"""
from .aio import AsyncEngine
from .llama_compat import Llama

__all__ = ["AsyncEngine", "Llama"]
