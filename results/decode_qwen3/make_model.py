"""A random model of Qwen3-0.6B's architecture and size (its config.json's sizes; SmolLM2's tokenizer, whose ids fit
the vocabulary), for `python benchmarks/decode.py --model FOLDER`:  python results/decode_qwen3/make_model.py FOLDER"""
import sys

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from nanorl.models import load_model

_, tok = load_model("smollm2-135m")
cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
