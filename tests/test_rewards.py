from nanorl.grpo import overlong_penalty
from nanorl.tasks.rewards import contains, exact, extract_final_number, final_number


def test_final_number_takes_the_last_number():
    assert final_number("2+2?", "2 + 2 = 4.", answer=4) == 1.0
    assert final_number("2+2?", "it is 4, not 5", answer=4) == 0.0
    assert final_number("", "1,234", answer="1234") == 1.0
    assert final_number("", "no digits here", answer=0) == 0.0
    assert extract_final_number("-3.5 and then -7") == -7.0
    assert exact("", "  42 ", answer=42) == 1.0 and contains("", "x = 42!", answer=42) == 1.0


def test_dapo_soft_overlong_penalty():
    # max 32 tokens, buffer 8: free up to 24, then a linear ramp to -1 at 32
    assert overlong_penalty(10, 32, 8) == 0.0 and overlong_penalty(24, 32, 8) == 0.0
    assert overlong_penalty(28, 32, 8) == -0.5
    assert overlong_penalty(32, 32, 8) == -1.0 and overlong_penalty(40, 32, 8) == -1.0


def test_math_answers_extraction_and_equivalence():
    from nanorl.tasks.math_answer import extract_answer, math_reward

    assert extract_answer("so x = \\boxed{\\frac{3}{4}} and 5") == "\\frac{3}{4}"
    assert extract_answer("work...\n#### 1,234") == "1,234"
    assert extract_answer("<answer>42</answer> 7") == "42"
    assert extract_answer("it is 12 apples, then 15") == "15"
    right = ["\\boxed{\\frac{3}{4}}", "The answer is 0.75.", "#### 3/4", "<answer>0.75</answer>", "\\boxed{0.750}"]
    for text in right:
        assert math_reward("", text, answer="3/4") == 1.0, text
    assert math_reward("", "costs $1,200 in total: #### $1,200", answer=1200) == 1.0  # units and commas stripped
    assert math_reward("", "#### 45%", answer="45") == 1.0
    for text in ["\\boxed{0.74}", "no answer here", "", "\\boxed{", "#### \\frac{1}{0}"]:
        assert math_reward("", text, answer="3/4") == 0.0, text


def test_math_verify_handles_symbolic_answers():
    import pytest

    pytest.importorskip("math_verify")
    from nanorl.tasks.math_answer import math_reward

    assert math_reward("", "\\boxed{\\sqrt{2}/2}", answer="\\frac{\\sqrt{2}}{2}") == 1.0
    assert math_reward("", "\\boxed{2\\pi}", answer="\\pi") == 0.0


def test_the_math_reward_without_math_verify_stops_at_setup(monkeypatch):
    import importlib.util

    import pytest

    from nanorl.tasks import Example, RewardSetupError, Task
    from nanorl.tasks.math_answer import math_reward

    task = Task("t", train=[Example("1+1?", {"answer": "2"})], eval=[], reward=[("math", math_reward, 1.0)])
    task.check()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else find_spec(name, *a)
    )
    with pytest.raises(RewardSetupError, match="needs math-verify"):  # before any model, not string equality later
        task.check()


def test_countdown_reward_right_wrong_malformed_adversarial():
    from nanorl.tasks.countdown import countdown_reward, countdown_task

    f = dict(numbers=[2, 4, 7], target=20)
    assert countdown_reward("", "<think>7-2=5, 5*4=20</think><answer>(7 - 2) * 4</answer>", **f) == 1.0
    assert countdown_reward("", "<answer>(7 - 2) * 4 = 20</answer>", **f) == 1.0
    assert countdown_reward("", "<answer>7 * 4 - 8</answer>", **f) == 0.0  # 8 is not a given number
    assert countdown_reward("", "<answer>(7 - 2) * 4 * 1</answer>", **f) == 0.0  # extra number
    assert countdown_reward("", "<answer>7 + 4 + 2</answer>", **f) == 0.0  # wrong value
    for bad in [
        "<answer>__import__('os').system('true')</answer>",
        "<answer>2 ** 4 + 7</answer>",
        "<answer>" + "(" * 500 + "2" + ")" * 500 + "</answer>",
        "<answer>7/(2-2)*4</answer>",
        "",
    ]:
        assert countdown_reward("", bad, **f) == 0.0
    task = countdown_task(eval_size=50, n_train=200)
    for ex in task.train[:50] + task.eval:  # every generated problem is solvable and held out once
        assert ex.fields["target"] > 0 and len(ex.fields["numbers"]) == 3
    assert not {e.prompt for e in task.eval} & {e.prompt for e in task.train}


def test_format_rewards():
    from nanorl.tasks.rewards import answer_tag, length_penalty, think_answer_format

    assert think_answer_format("", "<think>a</think>\n<answer>b</answer>") == 1.0
    assert think_answer_format("", "<answer>b</answer><think>a</think>") == 0.0
    assert think_answer_format("", "<think>a</think><answer>b</answer> trailing") == 0.0
    assert answer_tag("", "x <answer>1</answer>") == 1.0 and answer_tag("", "<answer>1") == 0.0
    assert length_penalty("", "w " * 50, max_words=100) == 0.0
    assert length_penalty("", "w " * 150, max_words=100) == -0.5
    assert length_penalty("", "w " * 1000, max_words=100) == -1.0


def test_reward_specs_composition_and_user_functions(tmp_path):
    import pytest

    from nanorl.tasks import Example, Task, load_reward, parse_reward_spec

    f = tmp_path / "my_rewards.py"
    f.write_text("def shout(prompt, completion, **_):\n    return float(completion.isupper())\n")
    parts = parse_reward_spec(f"final_number=1, answer_tag=0.5, {f}:shout=0.25")
    assert [(n, w) for n, _, w in parts] == [("final_number", 1.0), ("answer_tag", 0.5), ("shout", 0.25)]
    task = Task("t", train=[Example("q", {"answer": 3})], eval=[], reward=parts)
    named, total, errors = task.score_parts([Example("q", {"answer": 3})] * 2, ["<answer>3</answer>", "NO"])
    assert named == {"final_number": [1.0, 0.0], "answer_tag": [1.0, 0.0], "shout": [0.0, 1.0]}
    assert total == [1.5, 0.25] and errors == 0
    assert load_reward("nanorl.tasks.rewards:exact")("", "x", answer="x") == 1.0
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        parse_reward_spec("nope=1")
    with pytest.raises(ValueError, match="weight of 'exact'"):
        parse_reward_spec("exact=heavy")
    with pytest.raises(FileNotFoundError, match="missing.py"):
        parse_reward_spec("missing.py:f")


def test_a_failing_user_reward_stops_with_its_input_or_scores_zero():
    import pytest

    from nanorl.tasks import Example, Task

    def broken(prompt, completion, **_):
        if "boom" in completion:
            raise KeyError("no such key")
        return 1.0

    task = Task("t", train=[Example("the prompt")], eval=[], reward=broken)
    with pytest.raises(RuntimeError, match=r"'the prompt'.*'boom!'.*KeyError"):
        task.score_parts([Example("the prompt")] * 2, ["fine", "boom!"])
    task.on_error = "zero"
    named, total, errors = task.score_parts([Example("the prompt")] * 2, ["fine", "boom!"])
    assert total == [1.0, 0.0] and errors == 1
