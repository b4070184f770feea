"""A scheduler stand-in that plays a scripted model output: for server paths that need a
model behaving in a way none of the pulled models does (a reasoning model's ``<think>``
block, a tool call in a chosen format, a malformed call).

    sched = ScriptedScheduler(["<think>", "Weigh it.</think>", "4"], stop_reason="eos")
    app = create_app(sched, fake_engine(FakeModel(chat_template=...)), settings)

Each piece arrives as one :class:`edgespec.api.events.Step` (a speculative step's text, so a tag
may straddle two), then a :class:`~edgespec.api.events.Finished` with the whole text, on a thread
of its own, as the real scheduler's thread delivers them. What each request submitted is in
``calls``.
"""
from __future__ import annotations

import threading
from typing import Sequence

from edgespec.api.events import Finished, Step
from edgespec.serving import DONE, QueueLoad
from edgespec.api.stats import RequestStats


class ScriptedScheduler:
    def __init__(self, pieces: Sequence[str], stop_reason: str = "eos") -> None:
        self.pieces = list(pieces)
        self.stop_reason = stop_reason
        self.calls: list[tuple] = []

    def events(self) -> list:
        steps = [Step(1, (3,) * max(1, len(p)), p, ("draft",) * max(1, len(p)), "ngram", 1, 1,
                      0.0, 0.0, 0.01 * i) for i, p in enumerate(self.pieces)]
        text = "".join(self.pieces)
        tokens = tuple(3 for p in self.pieces for _ in range(max(1, len(p))))
        stats = RequestStats(prompt_tokens=5, generated_tokens=len(tokens),
                             stop_reason=self.stop_reason)
        return [*steps, Finished(1, text, tokens, self.stop_reason, stats)]

    def submit(self, prompt, params, *, on_event, **kw):
        self.calls.append((prompt, params.validate(), kw))
        events = self.events()
        threading.Thread(target=lambda: [on_event(e) for e in [*events, DONE]]).start()

        class Ticket:
            def cancel(self):
                pass
        return Ticket()

    def load(self) -> QueueLoad:
        return QueueLoad(0, 0, 1, 4)

    def close(self, drain: bool = True) -> None:
        pass


#: a chat template with tool support in the shape of Qwen2.5's (tools in the system turn,
#: calls as <tool_call> JSON, results as <tool_response>), which opens a <think> block when
#: the request's chat_template_kwargs ask for thinking (as DeepSeek-R1's prompt does)
TOOLS_TEMPLATE = (
    "{%- if tools %}<|sys|>Tools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>{{ m.content }}"
    "{%- for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n"
    "{%- elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\n"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and "
    "enable_thinking %}<think>\n{% endif %}{% endif %}")
