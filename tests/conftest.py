"""Shared fixtures: a tiny random Llama and a char-level chat tokenizer, built offline (no downloads)."""

import pytest
import torch

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
