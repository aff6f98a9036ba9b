def digits(completions, **kw):  # a reward the tiny random model's samples differ on
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
