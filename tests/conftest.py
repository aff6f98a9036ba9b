"""Shared fixtures: a tiny random Llama and a char-level chat tokenizer, built offline (no downloads)."""

import os

# MKL's matmuls may depend on the memory alignment of their operands (on an AMD EPYC, family 25 model 17, with
# --backend torch: a resumed process, with another heap layout, parted from the uninterrupted run in the last bits
# at its second step). Its conditional numerical reproducibility mode makes the bit-for-bit comparisons of runs
# hold on any CPU; set before torch loads MKL, inherited by the tests' subprocesses.
os.environ.setdefault("MKL_CBWR", "AUTO")

import pytest  # noqa: E402
import torch  # noqa: E402

from nanorl.models import tiny_model_and_tokenizer


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return tiny_model_and_tokenizer(seed=0)


@pytest.fixture(params=["auto", "torch"])
def each_backend(request, monkeypatch):
    """Run a test with nanorl's CPU speed-ups (auto) and without them (torch): NANORL_BACKEND, which
    subprocesses inherit too. Loop test modules use it for every test (`pytestmark`)."""
    monkeypatch.setenv("NANORL_BACKEND", request.param)
    return request.param
