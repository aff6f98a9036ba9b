"""Integrations: optional features, each loaded only when a run asks for it (tests/test_size.py checks that the
default run imports none of them).

    lora.py      peft LoRA adapters (--lora-r): add, load, the reference with adapters off
    trackers.py  TensorBoard and Weights & Biases loggers (--report-to tensorboard,wandb)
    plot.py      `nanorl plot RUN_DIR`: every curve of one or more runs, overlaid (matplotlib)
    report.py    `nanorl report RUN_DIR`: one self-contained HTML page of a run
    vllm.py      rollouts on a vLLM engine in the trainer's process (--use_vllm true)

FSDP2 (--strategy fsdp) is a plugin beside the other backends: backends/fsdp.py.
"""
