"""The vLLM server client's failures, which need no vLLM (tests/test_vllm.py runs the server itself where it is
installed): no server answering ends in one line after vllm_server_timeout, and `nanorl vllm-serve` without vLLM
says what to install."""

import importlib.util
import socket
import subprocess
import sys
import time

import pytest

from nanorl.config import GRPOConfig
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
