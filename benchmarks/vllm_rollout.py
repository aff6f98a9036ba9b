"""Rollout tokens/s of a colocated vLLM engine (integrations/vllm.py) and nanorl's sampler, in one process, turn
about: SmolLM2-135M in fp32, 8 prompts x 8 samples at temperature 1, 32 and 256 new tokens, two rounds each.
Run it where vLLM is installed (tests/vllm.sh makes such a venv):

    .vllm-venv/bin/python benchmarks/vllm_rollout.py

(benchmarks/decode.py --vllm adds `generate` and the model-forward step; at 256 tokens all four in one process
needed more than 24 GB.)
"""

import os
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache for the engine on a CPU

from nanorl.config import GRPOConfig  # noqa: E402
from nanorl.data import render_prompt  # noqa: E402
from nanorl.integrations.vllm import VllmSampler  # noqa: E402
from nanorl.models import load_model, stop_token_ids  # noqa: E402
from nanorl.sampling import LocalSampler, SamplingParams  # noqa: E402

model, tok = load_model("smollm2-135m")
model.eval()
stops = stop_token_ids(model, tok)
samplers = {"vllm": VllmSampler(GRPOConfig(model="smollm2-135m"), model, tok, stops)}
samplers["nanorl"] = LocalSampler(model, stops, tok.pad_token_id)
prompts = [render_prompt(tok, f"What is {i}+{i * 3}?") for i in range(8)]
for new in (32, 256):
    for _round in range(2):
        for name, sampler in samplers.items():
            t = time.perf_counter()
            roll = sampler.generate(prompts, 8, SamplingParams(new), 1)
            n, dt = sum(map(len, roll.completion_ids)), time.perf_counter() - t
            print(f"{new} new tokens, {name}: {n} tokens in {dt:.1f} s, {n / dt:.0f} tokens/s", flush=True)
