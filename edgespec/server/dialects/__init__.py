"""The wire formats the server speaks, one thin module each over edgespec.protocol.

Each dialect parses its body into a :class:`~edgespec.protocol.CoreRequest`, runs it on the
:class:`~edgespec.protocol.Core` and renders the core's events (whole response and stream)
in its own shape, errors included; ``register(app, core, settings)`` adds its routes.
What several share: fields.py (reading a hand-parsed body, function tools), refusal.py
(a failure as a counted ProtocolError; ``refusing`` wraps a route), named_sse.py (a stream
of named events).
"""
