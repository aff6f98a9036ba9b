"""Integrations: what nanorl connects to, beside the core and outside its line budget (tests/test_size.py).

    hub.py    model names -> local folders: the PyPI-wheel alias (smollm2-135m), GGUF conversion, the cache
    plot.py   `nanorl plot RUN_DIR`: reward and held-out accuracy curves (matplotlib)

Next to land here: trackers (TensorBoard, W&B) as loggers, peft adapters, distributed wrappers, the report.
"""
