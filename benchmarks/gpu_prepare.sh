#!/usr/bin/env bash
# Everything benchmarks/gpu.sh needs on a lent GPU machine that has no network, prepared here (with the package
# registries) into two git-ignored folders that travel with the `device` tool's `carry`:
#
#   .gpu/smollm2-135m-shape   SmolLM2-135M's config.json and tokenizer, no weights (540 MB of weights cannot
#                             travel; gpu.sh gives such a folder random weights of that shape)
#   .gpu/tiny-shape           the tests' tiny model's config and tokenizer: gpu.sh's plumbing check on a CPU
#   .whl/                     Python 3.12 wheels of what that machine lacks (TRL, datasets and their needs),
#                             at the versions installed here
#
#   bash benchmarks/gpu_prepare.sh
#
# Then, on the GPU (one call; the command is in benchmarks/gpu.sh's header), or its plumbing here on a CPU:
#   GPU_SH_DEVICE=cpu bash benchmarks/gpu.sh .gpu/tiny-shape /tmp/gpu_dry
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu .whl
python3 - <<'EOF'
import shutil
from pathlib import Path

from nanorl.hub import resolve_model_path, tiny_model_and_tokenizer

src, dst = resolve_model_path("smollm2-135m"), Path(".gpu/smollm2-135m-shape")
dst.mkdir(exist_ok=True)
for f in src.iterdir():
    if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".pt")):
        shutil.copy(f, dst / f.name)
model, tok = tiny_model_and_tokenizer()
model.config.save_pretrained(".gpu/tiny-shape")
tok.save_pretrained(".gpu/tiny-shape")
print(f"[prepare] .gpu/smollm2-135m-shape ({', '.join(sorted(p.name for p in dst.iterdir()))}) and .gpu/tiny-shape")
EOF
pins=$(python3 -m pip list --format freeze 2>/dev/null | grep -iE '^(trl|datasets|dill|multiprocess)==' || true)
if [ "$(echo "$pins" | grep -c ==)" != 4 ]; then
  echo "gpu_prepare.sh: trl, datasets, dill and multiprocess must be installed here" \
       "(pip install -e \".[bench]\"); found: ${pins:-none}" >&2
  exit 1
fi
tmp=$(mktemp -d)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" $pins
rm -f .whl/*.whl && mv "$tmp"/*.whl .whl/ && rmdir "$tmp"
echo "[prepare] .whl: $(ls .whl | tr '\n' ' ')($(du -sh .whl | cut -f1))"
