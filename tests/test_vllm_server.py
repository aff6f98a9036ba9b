"""The vLLM integration's failures that need no vLLM (tests/test_vllm.py runs the engines where it is installed): no
server answering ends in one line after vllm_server_timeout, `nanorl vllm-serve` without vLLM says what to install,
and LoRA the engines cannot take stops before an engine starts."""

import importlib.util
import socket
import subprocess
import sys
import time

import pytest

from nanorl.config import GRPOConfig
from nanorl.errors import ConfigError
from nanorl.hub import tiny_model_and_tokenizer


def test_no_server_ends_in_one_line_after_the_timeout():
    from nanorl.integrations.vllm import VllmServerSampler

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_port=port, vllm_server_timeout=1.0)
    model, tok = tiny_model_and_tokenizer()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no vLLM server answers at http://0.0.0.0:{port} after 1 s"):
        VllmServerSampler(cfg, model, tok, [tok.eos_token_id])
    assert time.monotonic() - start < 10


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_serve_without_vllm_says_what_to_install():
    done = subprocess.run([sys.executable, "-m", "nanorl.cli", "vllm-serve"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("nanorl: error: nanorl vllm-serve: vLLM is not installed")
    assert len(done.stderr.strip().splitlines()) == 1


def test_lora_the_engines_cannot_take_stops_before_any_engine_starts():
    """engine_weights merges adapters of linear layers; on the embedding or the (tied) head: one line, before vLLM
    is imported."""
    from nanorl.integrations.vllm import make_vllm_sampler
    from nanorl.models import trainable

    for target, name in (("embed_tokens,q_proj", "embed_tokens"), ("lm_head,q_proj", "lm_head")):
        model, tok = tiny_model_and_tokenizer()
        lora = trainable(model, GRPOConfig(lora_r=4, lora_target=target))
        with pytest.raises(ConfigError, match=f"LoRA merged into linear layers; not .*{name}"):
            make_vllm_sampler(GRPOConfig(use_vllm=False, lora_r=4), lora, tok, [tok.eos_token_id])
