"""Tools for agent episodes, with TRL's contract (TRL 1.16 GRPOTrainer `tools=` and `environment_factory=`;
notes/trl_tools_contract.md), so that a TRL user's tool functions and environment classes run unchanged.

    schemas = tool_schemas([calculate])               # transformers.utils.get_json_schema of each function
    content, calls = parse_tool_calls(completion)     # <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    messages, failures = run_tool_calls(calls, tools_by_name(tools=[calculate]), timeout_s=10)

A tool is a plain Python function, sync or async, with a type hint on every argument and a Google-style
docstring describing each one (transformers builds its JSON schema from them; the chat template renders it). An
environment is a class: `reset(**row) -> str | None`, its public methods are its tools, and an optional
`get_reward() -> float` scores the episode; `environment_tools(env)` finds the tools of one instance, as TRL does.

Tool calls are read in the format of the Hermes / Qwen2.5 / Qwen3 / SmolLM3 chat templates,
`<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 2"}}</tool_call>` (one block per call), and in
Llama 3.x's bare JSON form, `{"name": ..., "parameters": {...}}` as the whole reply. transformers parses replies
only for tokenizers that ship a response template, which none of these models' tokenizers do, so the parsing is
here. A model whose chat template has no tool support (SmolLM2, nanorl's default) is told the same `<tool_call>`
format in its system prompt (`fallback_system_prompt`).

What goes wrong is answered, never raised: malformed JSON, an unknown tool, arguments the tool does not take, a
tool that raises and a tool that runs past `timeout_s` each become a `tool` message saying so (and count as a
failure, TRL's `tools/failure_frequency`). A reply's async tools run concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
from dataclasses import dataclass, field

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)  # an unclosed last block is still a call


@dataclass
class ToolCall:
    """One call the model wrote: a tool's name and its arguments, or what was wrong with it (`error`)."""

    name: str
    arguments: dict = field(default_factory=dict)
    error: str = ""


def tool_schemas(tools) -> list[dict]:
    """The JSON schema of each tool, as the chat template receives it (transformers.utils.get_json_schema)."""
    from transformers.utils import get_json_schema

    return [get_json_schema(fn) for fn in tools]


def environment_tools(env) -> list:
    """The tools of an environment instance: its public methods (not reset or get_reward), bound to it; TRL reads
    them the same way (the functions of its class, inherited ones included, that do not start with `_`)."""
    names = [n for n, _ in inspect.getmembers(type(env), inspect.isfunction)]
    return [getattr(env, n) for n in names if not n.startswith("_") and n not in ("reset", "get_reward")]


def tools_by_name(tools) -> dict:
    """{name: callable} of a list of tools; two with one name are an error (the model could not tell them apart)."""
    out: dict = {}
    for fn in tools:
        name = getattr(fn, "__name__", type(fn).__name__)
        if name in out:
            raise ValueError(f"two tools are named {name!r}: a tool's name is how the model calls it")
        out[name] = fn
    return out


def _call(payload) -> ToolCall:
    """A decoded JSON call -> ToolCall; `arguments` (TRL, Hermes, Qwen) or `parameters` (Llama 3.x)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object with a "name" and its "arguments"')
    args = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(payload["name"], error=f"the arguments of {payload['name']!r} are not valid JSON")
    if not isinstance(args, dict):
        return ToolCall(payload["name"], error=f"the arguments of {payload['name']!r} must be a JSON object")
    return ToolCall(payload["name"], args)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A reply -> (its text without the calls, the calls in order). No call: (text, [])."""
    blocks = TOOL_CALL.findall(text)
    if not blocks:
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):  # Llama 3.x: the whole reply is one JSON call
            try:
                payload = json.loads(stripped)
            except json.JSONDecodeError:
                return text, []
            if isinstance(payload, dict) and "name" in payload and ("parameters" in payload or "arguments" in payload):
                return "", [_call(payload)]
        return text, []
    calls = []
    for block in blocks:
        try:
            calls.append(_call(json.loads(block.strip())))
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({e.msg} at character {e.pos})"))
    return TOOL_CALL.sub("", text).strip(), calls


async def _run_async(fn, arguments: dict, timeout_s: float):
    return await asyncio.wait_for(fn(**arguments), timeout_s)


def run_tool_calls(calls: list[ToolCall], tools: dict, timeout_s: float = 10.0) -> tuple[list[dict], int]:
    """Run a reply's calls -> (one `tool` message per call, in order; how many failed). Sync tools run one after
    another, each in a worker thread that is waited for at most timeout_s (a thread cannot be killed: a tool past
    its time keeps its thread until it returns, and its result is dropped); async tools run concurrently, each
    cancelled at timeout_s."""
    results: list = [None] * len(calls)
    pending = {}  # index -> coroutine of an async tool
    for i, call in enumerate(calls):
        fn = tools.get(call.name)
        if call.error:
            results[i] = {"error": call.error}
        elif fn is None:
            results[i] = {"error": f"unknown tool {call.name!r}; the tools are {', '.join(sorted(tools)) or 'none'}"}
        elif inspect.iscoroutinefunction(fn):
            pending[i] = _run_async(fn, call.arguments, timeout_s)
        else:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
            try:
                results[i] = {"result": pool.submit(fn, **call.arguments).result(timeout=timeout_s)}
            except concurrent.futures.TimeoutError:
                results[i] = {"error": f"tool {call.name!r} took longer than {timeout_s:g} s"}
            except Exception as e:  # the model's arguments or the tool itself: the model is told, the run goes on
                results[i] = {"error": f"tool {call.name!r} raised {type(e).__name__}: {e}"}
            finally:
                pool.shutdown(wait=False)
    if pending:

        async def gather():
            return await asyncio.gather(*pending.values(), return_exceptions=True)

        for i, out in zip(pending, asyncio.run(gather())):
            if isinstance(out, asyncio.TimeoutError):
                results[i] = {"error": f"tool {calls[i].name!r} took longer than {timeout_s:g} s"}
            elif isinstance(out, BaseException):
                results[i] = {"error": f"tool {calls[i].name!r} raised {type(out).__name__}: {out}"}
            else:
                results[i] = {"result": out}
    messages = [
        {"role": "tool", "name": call.name, "content": str(r["result"]) if "result" in r else f"Error: {r['error']}"}
        for call, r in zip(calls, results)
    ]
    return messages, sum("error" in r for r in results)


def fallback_system_prompt(tools) -> str:
    """For a chat template without tool support: the tools and the call format, told in the system prompt."""
    listed = "\n".join(json.dumps(s["function"]) for s in tool_schemas(tools))
    return (
        "You can call these tools:\n"
        f"{listed}\n"
        'To call one, write <tool_call>{"name": NAME, "arguments": {ARGUMENT: VALUE}}</tool_call> and stop; '
        "its result comes back in the next message. When you know the answer, reply without a tool call."
    )


def template_supports_tools(tok) -> bool:
    """Whether the tokenizer's chat template renders tools (it mentions them); else the fallback prompt is used."""
    template = getattr(tok, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(template.values())
    return "tools" in template and "tool_call" in template
