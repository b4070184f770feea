"""The browser face of `edgespec serve`: a chat page at ``GET /`` that colours every token
of an answer by its origin (the target's own, or the proposer that drafted it), and the
small JSON route it reads beside the OpenAI ones (``GET /v1/edgespec/status``).

The page is plain HTML/CSS/JS shipped as package data (``static/``): no build step, no
external asset, nothing fetched from outside the server (its Content-Security-Policy says
``default-src 'self'``). It talks to the server only through public routes: the chat
stream with its documented ``include_origins`` extension, ``/v1/models``, ``/metrics`` and
the status route. docs/server.md, "Web page".
"""
from .routes import register

__all__ = ["register"]
