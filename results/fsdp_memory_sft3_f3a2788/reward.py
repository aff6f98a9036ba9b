def distinct(completions, **kw):  # differs between a random model's samples: something to learn from
    return [len(set(c)) / max(len(c), 1) for c in completions]
