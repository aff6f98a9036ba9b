"""Agents: episodes in which the model calls tools or acts in an environment over several turns (issue 35). Loaded
only by runs that give tools or an environment; the default run never imports it (tests/test_size.py).

    tools.py     TRL's tool and environment contract: schemas, parsing the model's calls, running them
    episodes.py  the episode: its prompt with the tools, the turns after the first reply, what it ends with
    python.py    the `python` tool: model-written programs run in the code sandbox (tasks/sandbox.py)

Built-in tasks with tools or an environment: tasks/calculator.py (`--task calculator`), tasks/guess.py (`--task
guess`).
"""
