"""Serving many requests on one engine: the scheduler (continuous batching) that the
OpenAI-compatible server and any multi-client app drive."""
from .pool import ModelDoesNotFitError, ModelNotServedError, ModelPool, PoolModel
from .scheduler import DONE, Load, QueueFullError, Scheduler, Ticket

__all__ = ["DONE", "Load", "ModelDoesNotFitError", "ModelNotServedError", "ModelPool",
           "PoolModel", "QueueFullError", "Scheduler", "Ticket"]
