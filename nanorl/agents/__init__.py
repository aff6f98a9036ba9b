"""Agents: episodes in which the model calls tools or acts in an environment over several turns (issue 35). Loaded
only by runs that give tools or an environment; the default run never imports it (tests/test_size.py).

    tools.py   TRL's tool and environment contract: schemas, parsing the model's calls, running them
"""
