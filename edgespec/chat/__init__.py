"""Chat: templates, multi-turn conversations over prefix reuse, and saved sessions.

    chat.py           messages normalised and rendered with the model's chat template
    conversation.py   Engine.chat / Conversation: multi-turn history over prefix reuse
    sessions.py       conversations saved on disk (KV state + messages), checked on load
"""
from .conversation import Conversation

__all__ = ["Conversation"]
