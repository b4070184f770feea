"""Serving many requests on one engine: the scheduler (continuous batching) that the
OpenAI-compatible server and any multi-client app drive."""
from .scheduler import DONE, Load, QueueFullError, Scheduler, Ticket

__all__ = ["DONE", "Load", "QueueFullError", "Scheduler", "Ticket"]
