"""An agent loop of a real agent framework (the openai-agents SDK, its default model: the
Responses API) against edgespec: first on a scripted model (the loop's wire traffic,
deterministic), then on a real `edgespec serve` of Qwen2.5 1.5B with speculation on, a
two-step tool task (look a code up, then the weather for it) answered from the tools'
results. The Anthropic SDK's tool round trip runs on the same real server."""
from __future__ import annotations

import asyncio
import json

import pytest

REAL = "qwen-1.5b"


def run_agent(base_url: str, model: str, tools, instructions: str, question: str,
              max_tokens: int = 64, tool_choice: str | None = None,
              parallel_tool_calls: bool | None = None, **agent_kw):
    """The agent's run (final output, items) on the SDK's default (Responses) model."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # traces would go to OpenAI's servers

    async def go():
        client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                             timeout=600)
        agent = Agent(name="assistant", instructions=instructions, tools=tools,
                      model=OpenAIResponsesModel(model, client),
                      model_settings=ModelSettings(temperature=0.0, max_tokens=max_tokens,
                                                   tool_choice=tool_choice,
                                                   parallel_tool_calls=parallel_tool_calls),
                      **agent_kw)
        try:
            return await Runner.run(agent, question, max_turns=5)
        finally:
            await client.close()

    return asyncio.run(go())


def calls_of(result) -> list[tuple[str, dict]]:
    return [(it.raw_item.name, json.loads(it.raw_item.arguments))
            for it in result.new_items if it.type == "tool_call_item"]


def test_an_agent_loop_on_a_scripted_model():
    from agents import function_tool
    from scripted_serve import CALL, scripted_server

    with scripted_server(CALL) as (url, sched):
        @function_tool
        def get_weather(city: str) -> str:
            """The current weather of a city."""
            sched.pieces = ["It is sunny ", "in Paris."]  # the model's next answer
            return f"sunny in {city}"

        result = run_agent(url, "fake", [get_weather], "Use the tools.", "Weather in Paris?")
    assert result.final_output == "It is sunny in Paris."
    assert calls_of(result) == [("get_weather", {"city": "Paris"})]
    # the second model call carried the function call and its output back
    sent = sched.calls[-1][0]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[-1]["content"] == "sunny in Paris"


# --- a real model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen(model_path):
    """Qwen2.5 1.5B with the default configuration (--proposer auto: speculation on)."""
    from server_env import THREADS

    from tools.soak import ServeProcess
    model_path(REAL)
    with ServeProcess(["--target", REAL, "--ctx", "2048", "--threads", THREADS,
                       "--max-tokens-limit", "256"], startup_seconds=600) as s:
        yield s


def test_an_agent_completes_a_two_step_tool_task(qwen):
    """The second call needs the first one's result (the model cannot know where the user
    lives), so the agent loops twice. Each turn must make one call (tool_choice "required",
    parallel_tool_calls false: the grammar keeps a 1.5B model's markup well-formed, and a
    second call in the same turn could only guess the city); the run ends at the weather
    tool with its result."""
    from agents import StopAtTools, function_tool

    seen: list[str] = []

    @function_tool
    def get_user_city() -> str:
        """The city the user lives in."""
        seen.append("get_user_city")
        return "Lyon"

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        seen.append(f"get_weather({city})")
        return f"sunny, 23 degrees Celsius in {city}"

    result = run_agent(qwen.base_url, REAL, [get_user_city, get_weather],
                       "You are a weather assistant. You do not know where the user lives: "
                       "call get_user_city first, then get_weather for that city.",
                       "What is the weather where I live?", tool_choice="required",
                       parallel_tool_calls=False, reset_tool_choice=False,
                       tool_use_behavior=StopAtTools(stop_at_tool_names=["get_weather"]))
    assert calls_of(result) == [("get_user_city", {}), ("get_weather", {"city": "Lyon"})]
    assert seen == ["get_user_city", "get_weather(Lyon)"]
    assert result.final_output == "sunny, 23 degrees Celsius in Lyon"


def test_the_anthropic_sdk_runs_a_tool_round_trip_on_qwen(qwen):
    """tool_use -> tool_result on a real model: the named tool_choice makes the call (its
    grammar), tool_choice none the answer from the result (the model is not offered the
    tool again, which a 1.5B model otherwise calls once more)."""
    import anthropic

    weather = {"name": "get_weather", "description": "The current weather of a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}
    client = anthropic.Anthropic(base_url=qwen.base_url, api_key="unused", max_retries=0,
                                 timeout=600)
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    greedy = {"temperature": 0}
    first = client.messages.create(model=REAL, max_tokens=48, tools=[weather], messages=ask,
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   extra_body=greedy)
    assert first.stop_reason == "tool_use", first.content
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    final = client.messages.create(
        model=REAL, max_tokens=40, tools=[weather], tool_choice={"type": "none"},
        extra_body=greedy, messages=[
            *ask, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "sunny, 18 degrees Celsius"}]}])
    assert final.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in final.content if b.type == "text")
    assert "18" in text, text  # the answer uses the tool's result
