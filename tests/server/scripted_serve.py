"""A real loopback HTTP server (uvicorn, in a thread) over a scripted scheduler and a fake
engine (tests/fakes): the real client libraries talk to the real app while the "model"
writes exactly what a test needs (a tool call, a <think> block), in speculative pieces."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from fakes import FakeModel
from fakes.engine import fake_engine
from fakes.scripted import TOOLS_TEMPLATE, ScriptedScheduler

from edgespec.server import ServerSettings, create_app

#: the hermes-style call the scripted template's models write
CALL = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']


@contextmanager
def scripted_server(pieces, stop_reason: str = "eos", **settings):
    """(base_url, scheduler); set ``scheduler.pieces`` to script the next answer."""
    import uvicorn

    sched = ScriptedScheduler(pieces, stop_reason)
    engine = fake_engine(FakeModel(chat_template=TOOLS_TEMPLATE))
    app = create_app(sched, engine, ServerSettings(served_model="fake", **settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", sched
    finally:
        server.should_exit = True
        thread.join(10)
