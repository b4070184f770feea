"""Serving many requests on one engine: the scheduler (continuous batching) that the
OpenAI-compatible server and any multi-client app drive.

    scheduler.py   Scheduler: admission into sequences, one shared pass per step
    tickets.py     what clients hold: Ticket, Choices, QueueLoad, DONE, the refusals
    pool.py        ModelPool: several models served, loaded and evicted by memory
"""
from .pool import Held, ModelDoesNotFitError, ModelNotServedError, ModelPool, PoolModel
from .scheduler import Scheduler
from .tickets import DONE, QueueLoad, QueueFullError, Ticket

__all__ = ["DONE", "Held", "QueueLoad", "ModelDoesNotFitError", "ModelNotServedError", "ModelPool",
           "PoolModel", "QueueFullError", "Scheduler", "Ticket"]
