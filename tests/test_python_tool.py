"""The python tool (agents/python.py): a model's program runs in the code sandbox and what it printed comes back as
the tool message; an exception, a limit or a crash is raised as a short ProgramError (the episode answers it as an
error); output is cut; the sandbox's isolation holds through the tool; and an episode whose scripted reply calls it
gets the program's output in its tool message."""

import json
import os
import sys
import time
import uuid

import pytest
import torch
from transformers.utils import get_json_schema

from nanorl import online
from nanorl.agents import python as tool_module
from nanorl.agents.episodes import Agent
from nanorl.agents.python import MAX_CHARS, ProgramError, python
from nanorl.config import GRPOConfig
from nanorl.models import tiny_model_and_tokenizer
from nanorl.sampling import Rollouts
from nanorl.tasks import Example, sandbox
from nanorl.tasks.sandbox import Limits

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux only")


def test_what_the_program_printed_comes_back():
    assert python("print(6 * 7)\nprint('done')") == "42\ndone"
    assert python("import sys\nprint('out')\nprint('err', file=sys.stderr)") == "out\nerr"  # stdout, then stderr
    assert python("x = 1") == "(no output: print() what you want to see)"


def test_an_exception_comes_back_as_its_last_traceback_line_with_what_was_printed():
    with pytest.raises(ProgramError) as raised:
        python("print('before')\nd = {}\nd['key']")
    assert str(raised.value) == "KeyError: 'key' (line 3)\nIt printed:\nbefore"
    with pytest.raises(ProgramError, match=r"^SyntaxError: .* \(line 1\)$"):
        python("print(")
    with pytest.raises(ProgramError, match=r"^it ended with exit 3$"):
        python("import sys\nsys.exit(3)")


def test_an_infinite_loop_is_stopped_within_its_limits(monkeypatch):
    monkeypatch.setattr(tool_module, "LIMITS", Limits(wall_s=2.0, cpu_s=30))  # the wall clock stops it
    t0 = time.perf_counter()
    with pytest.raises(ProgramError, match="^stopped: it ran past its 2 s limit$"):
        python("while True:\n    pass")
    assert time.perf_counter() - t0 < 2.0 + 5
    monkeypatch.setattr(tool_module, "LIMITS", Limits(wall_s=30.0, cpu_s=1))  # the CPU limit stops it
    t0 = time.perf_counter()
    with pytest.raises(ProgramError, match="^stopped: it used more than its 1 s of CPU time$"):
        python("while True:\n    pass")
    assert time.perf_counter() - t0 < 1.0 + 5


def test_output_is_cut_and_says_so():
    note = f"\n[cut to its first {MAX_CHARS} characters]"
    assert python("print('x' * 100_000)") == "x" * MAX_CHARS + note
    with pytest.raises(ProgramError) as raised:
        python("print('y' * 100_000)\nraise ValueError('z' * 100_000)")
    assert str(raised.value) == ("ValueError: " + "z" * 100_000)[:MAX_CHARS] + note


def test_its_schema_is_one_required_string_named_code():
    schema = get_json_schema(python)
    assert schema["type"] == "function" and schema["function"]["name"] == "python"
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["code"] and list(parameters["properties"]) == ["code"]
    assert parameters["properties"]["code"]["type"] == "string" and parameters["properties"]["code"]["description"]
    assert schema["function"]["description"] and schema["function"]["return"] == {"type": "string"}


def isolated() -> bool:
    """Whether programs get the sandbox's own root here: as root, or in a user namespace (a kernel may refuse one;
    then the program runs in the host's files and there is no isolation to test)."""
    if os.geteuid() == 0:
        return True
    sandbox.run_python("pass", Limits(wall_s=5.0))
    return sandbox.USER_NAMESPACES


def test_the_sandbox_isolation_holds_through_the_tool(tmp_path, monkeypatch):
    if not isolated():
        pytest.skip("no namespaces here: the sandbox gives only its limits")
    secret = uuid.uuid4().hex
    canary = tmp_path / "canary.txt"
    canary.write_text(secret)
    monkeypatch.setenv("NANORL_PYTHON_TOOL_SECRET", secret)
    assert canary.read_text() == secret  # the host reads it
    with pytest.raises(ProgramError, match="^FileNotFoundError: .*canary.txt'? \\(line 1\\)$"):
        python(f"print(open({str(canary)!r}).read())")
    seen = python(f"import os\nprint(os.path.exists({str(tmp_path)!r}))\nprint(dict(os.environ))")
    assert seen.startswith("False\n{") and secret not in seen  # neither the folder nor the trainer's environment
    assert python("open('/tmp/own.txt', 'w').write('mine')\nprint(open('/tmp/own.txt').read())") == "mine"


class Scripted:
    """A sampler (sampling.Sampler) that replays script(prompt text, turn) -> reply text, as tests/test_episodes.py
    does: a random tiny model never writes a tool call."""

    def __init__(self, tok, script):
        self.tok, self.script, self.turn = tok, script, 0

    def generate(self, prompts, group_size, params, seed):
        self.turn += 1
        rows = [p for p in prompts for _ in range(group_size)]
        out = [
            (self.tok(self.script(self.tok.decode(p), self.turn), add_special_tokens=False)["input_ids"])
            + [self.tok.eos_token_id]
            for p in rows
        ]
        logps = [torch.full((len(c),), -1.0) for c in out]
        return Rollouts([list(p) for p in rows], out, logps, [False] * len(out), group_size)

    def sync_weights(self, model):
        pass


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_an_episode_that_calls_python_gets_its_output_in_the_tool_message():
    def script(prompt, turn):
        if turn > 1:
            return "It is 42."
        return call("print(6*7)") if "6 * 7" in prompt else call("print(1 / 0)")

    _, tok = tiny_model_and_tokenizer()
    cfg = GRPOConfig(model="tiny", prompts_per_step=2, samples_per_prompt=1, max_new_tokens=200)
    agent = Agent(tools=[python], max_new_tokens=cfg.max_new_tokens)
    examples = [Example("What is 6 * 7?", {"answer": 42}), Example("What is 1 / 0?", {})]
    timer = {"rollout": 0.0, "reward": 0.0, "tokens": 0}
    sampler = Scripted(tok, script)
    roll, texts = online.rollout(sampler, tok, examples, cfg, 0, timer, agent)
    assert texts == ["It is 42.", "It is 42."] and sampler.turn == 2
    assert [m["role"] for m in agent.messages[0]] == ["user", "assistant", "tool", "assistant"]
    assert agent.messages[0][2] == {"role": "tool", "name": "python", "content": "42"}
    assert "\n<|im_start|>tool\n42<|im_end|>\n" in tok.decode(roll.completion_ids[0])  # its tokens, not the model's
    error = agent.messages[1][2]["content"]
    assert error == "Error: tool 'python' raised ProgramError: ZeroDivisionError: division by zero (line 1)"
    assert agent.failures == [0, 1] and agent.metrics(roll)["tools/failure_frequency"] == 0.5
