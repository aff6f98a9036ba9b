"""Tools with TRL's contract (nanorl/agents/tools.py): schemas from type hints and docstrings, calls parsed from
the model's reply in the Hermes/Qwen and Llama 3.x formats, an environment's public methods as its tools, and
every failure (malformed, unknown, raising, slow) answered to the model instead of stopping the run."""

import asyncio
import threading

from nanorl.agents.tools import (
    ToolCall,
    environment_tools,
    fallback_system_prompt,
    parse_tool_calls,
    run_tool_calls,
    template_supports_tools,
    tool_schemas,
    tools_by_name,
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


class Base:
    def shout(self, text: str) -> str:
        """Upper-case a text.

        Args:
            text: what to shout
        """
        return text.upper()


class Counter(Base):
    """An environment in the shape of TRL's documented IncrementEnv: reset, one tool, a reward of its own."""

    def reset(self, target: int = 3, **row) -> str:
        self.count, self.target = 0, target
        return f"Reach {target}."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count == self.target)

    def _helper(self):
        return None


def test_schemas_come_from_type_hints_and_docstrings():
    (schema,) = tool_schemas([multiply])
    assert schema["function"]["name"] == "multiply"
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first factor"}
    assert "Multiply two integers" in fallback_system_prompt([multiply])


def test_calls_in_the_hermes_format_one_block_each():
    text = 'Let me compute. <tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    content, calls = parse_tool_calls(text + '\n<tool_call>{"name": "async_add", "arguments": "{\\"a\\": 1, "b": 2}"}')
    assert content == "Let me compute."
    assert calls[0] == ToolCall("multiply", {"a": 6, "b": 7})
    assert calls[1].name == "" and "not valid JSON" in calls[1].error  # the unclosed last block, broken JSON
    _, calls = parse_tool_calls('<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>')
    assert calls == [ToolCall("multiply", {"a": 2, "b": 3})]  # arguments written as a JSON string
    assert parse_tool_calls("The answer is 42.") == ("The answer is 42.", [])
    assert parse_tool_calls('{"a": 1}') == ('{"a": 1}', [])  # JSON that is not a call is an answer


def test_calls_in_the_llama_format_and_bad_shapes():
    assert parse_tool_calls('{"name": "multiply", "parameters": {"a": 1, "b": 2}}')[1] == [
        ToolCall("multiply", {"a": 1, "b": 2})
    ]
    _, calls = parse_tool_calls(
        '<tool_call>["multiply"]</tool_call><tool_call>{"name": "m", "arguments": 3}</tool_call>'
    )
    assert "JSON object" in calls[0].error and "must be a JSON object" in calls[1].error


def test_an_environments_tools_are_its_public_methods():
    env = Counter()
    names = sorted(fn.__name__ for fn in environment_tools(env))
    assert names == ["increment", "shout"]  # inherited ones too; not reset, get_reward or _helper
    env.reset(target=2)
    tools = tools_by_name(environment_tools(env))
    messages, failures = run_tool_calls([ToolCall("increment", {"step": 2})], tools)
    assert messages == [{"role": "tool", "name": "increment", "content": "2"}] and failures == 0
    assert env.get_reward() == 1.0
    other = Counter()  # one instance per episode: no state is shared
    other.reset()
    assert tools_by_name(environment_tools(other))["increment"](1) == 1 and env.count == 2


def test_every_failure_is_answered_and_counted():
    def boom(x: int) -> int:
        """Fail.

        Args:
            x: anything
        """
        raise RuntimeError("it broke")

    tools = tools_by_name([multiply, boom])
    calls = [
        ToolCall("multiply", {"a": 2, "b": 5}),
        ToolCall("", error="the tool call is not valid JSON"),
        ToolCall("divide", {"a": 1}),
        ToolCall("boom", {"x": 1}),
        ToolCall("multiply", {"a": 2}),  # a missing argument: the tool's TypeError
    ]
    messages, failures = run_tool_calls(calls, tools)
    assert [m["content"] for m in messages][:1] == ["10"] and failures == 4
    assert "not valid JSON" in messages[1]["content"]
    assert "unknown tool 'divide'" in messages[2]["content"] and "boom, multiply" in messages[2]["content"]
    assert "RuntimeError: it broke" in messages[3]["content"]
    assert "TypeError" in messages[4]["content"]


def test_a_slow_tool_is_cut_at_its_timeout():
    release = threading.Event()

    def slow(x: int) -> int:
        """Wait.

        Args:
            x: anything
        """
        release.wait(30)
        return x

    messages, failures = run_tool_calls([ToolCall("slow", {"x": 1})], tools_by_name([slow]), timeout_s=0.2)
    release.set()
    assert failures == 1 and "took longer than 0.2 s" in messages[0]["content"]


def test_async_tools_of_a_reply_run_concurrently():
    box = {}

    async def wait_for_other(x: int) -> int:
        """Wait until the other tool has run.

        Args:
            x: anything
        """
        box.setdefault("event", asyncio.Event())
        await box["event"].wait()  # run one after the other, this would wait forever (and time out)
        return x

    async def release(x: int) -> int:
        """Let the other tool finish.

        Args:
            x: anything
        """
        box.setdefault("event", asyncio.Event()).set()
        return x + 1

    tools = tools_by_name([wait_for_other, release, async_add])
    calls = [
        ToolCall("wait_for_other", {"x": 1}),
        ToolCall("release", {"x": 1}),
        ToolCall("async_add", {"a": 1, "b": 2}),
    ]
    messages, failures = run_tool_calls(calls, tools, timeout_s=5)
    assert [m["content"] for m in messages] == ["1", "2", "3"] and failures == 0
    box.clear()  # alone, the tool waits for a release that never comes: cancelled at its timeout
    messages, failures = run_tool_calls([ToolCall("wait_for_other", {"x": 1})], tools, timeout_s=0.2)
    assert failures == 1 and "took longer" in messages[0]["content"]


def test_which_templates_render_tools():
    class Tok:
        chat_template = "{% if tools %}{{ tools }}{% endif %}<tool_call>"

    class Plain:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    assert template_supports_tools(Tok()) and not template_supports_tools(Plain())
