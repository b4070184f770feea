"""`edgespec serve`: an OpenAI-compatible HTTP server over the scheduler (docs/server.md).

    app = create_app(scheduler, engine, ServerSettings(served_model="qwen-1.5b"))
    app = create_pool_app(pool, ServerSettings(served_model="qwen-1.5b"))  # several models
"""
from .app import create_app, create_pool_app
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "create_pool_app"]
