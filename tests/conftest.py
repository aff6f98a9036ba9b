"""Shared fixtures: a tiny random Llama and a char-level chat tokenizer, built offline (no downloads)."""

import pytest
import torch

from nanorl.models import tiny_model_and_tokenizer


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return tiny_model_and_tokenizer(seed=0)
