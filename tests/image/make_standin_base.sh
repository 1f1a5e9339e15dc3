#!/usr/bin/env bash
# Build a local stand-in for the TensorFlow 2.9.3 GPU runtime image.
#
# Why: the real base (tensorflow/tensorflow:2.9.3-gpu, CUDA 11.2 / cuDNN 8.1,
# Ubuntu 20.04, Python 3.8) cannot be pulled where no registry is reachable,
# as on our development and CI machines.  The image tests build the project's
# real Dockerfile FROM this stand-in instead:
#   Debian bullseye (debootstrap) + Python 3.9 + tensorflow-cpu==2.9.3, numpy<2,
#   with the same environment variables the real base sets, and - on purpose -
#   an unreachable NVIDIA apt source like the one that breaks `apt-get update`
#   in images derived from CUDA 11.x bases, so the Dockerfile must cope with it.
#
# TensorFlow comes from a wheelhouse that the HOST downloads (its pip knows the
# index and CA bundle); the container installs it with --no-index.
#
# Usage: tests/image/make_standin_base.sh [--force]
# Environment:
#   STANDIN_IMAGE   tag to create            (default tfmp/standin-base:2.9.3)
#   TFMP_CACHE      where rootfs + wheels go  (default /var/cache/tfmp)
#   DEBIAN_MIRROR   Debian mirror URL         (default: the host's own apt source)
set -euo pipefail

STANDIN_IMAGE="${STANDIN_IMAGE:-tfmp/standin-base:2.9.3}"
TFMP_CACHE="${TFMP_CACHE:-/var/cache/tfmp}"
SUITE=bullseye
PY_TAG=39

log() { printf '%s [standin] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) die "unknown option '$1'; allowed: --force" ;;
esac

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "Docker engine not reachable; start dockerd first"

if [[ $force -eq 0 ]] && docker image inspect "$STANDIN_IMAGE" >/dev/null 2>&1; then
  log "$STANDIN_IMAGE already exists (use --force to rebuild)"
  exit 0
fi

host_debian_mirror() {
  # First Debian URI the host's apt uses (deb822 .sources or one-line .list).
  local uri
  uri=$(grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
  if [[ -z "$uri" ]]; then
    uri=$(grep -h -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
  fi
  printf '%s' "$uri"
}

mirror="${DEBIAN_MIRROR:-$(host_debian_mirror)}"
[[ -n "$mirror" ]] || die "no Debian mirror found; set DEBIAN_MIRROR"
command -v debootstrap >/dev/null || die "debootstrap not installed (apt-get install debootstrap)"

mkdir -p "$TFMP_CACHE"
rootfs="$TFMP_CACHE/rootfs-$SUITE"
wheels="$TFMP_CACHE/wheels-cp$PY_TAG"

# 1. Root filesystem.
if [[ ! -x "$rootfs/usr/bin/python3" ]]; then
  log "debootstrap $SUITE into $rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-distutils,ca-certificates,bash,procps \
    "$SUITE" "$rootfs" "$mirror" >"$TFMP_CACHE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$TFMP_CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $TFMP_CACHE/debootstrap.log)"; }
fi

# 2. Wheelhouse for Python 3.9 / manylinux, downloaded by the host's pip.
# pip evaluates environment markers of dependencies against the HOST
# interpreter (3.11 here), so the backports TF's tree needs only on Python < 3.10
# (markdown -> importlib-metadata -> zipp) must be named explicitly.
if [[ ! -f "$wheels/.complete-v2" ]]; then
  log "downloading tensorflow-cpu 2.9.3 wheels into $wheels"
  mkdir -p "$wheels"
  python3 -m pip download --quiet --dest "$wheels" \
    --only-binary=:all: --python-version "$PY_TAG" --implementation cp --abi "cp$PY_TAG" \
    --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
    --platform any \
    "tensorflow-cpu==2.9.3" "numpy>=1.20,<2" "protobuf>=3.9.2,<3.20" "pip==24.3.1" "setuptools<70" "wheel" \
    "importlib-metadata>=4.4" "zipp>=3.1"
  touch "$wheels/.complete-v2"
fi

# 3. Import the bare root filesystem, install TensorFlow into it, commit with
#    the real base's environment.
bare="${STANDIN_IMAGE%%:*}-bare:$SUITE"
log "importing $rootfs as $bare"
tar -C "$rootfs" -c . | docker import - "$bare" >/dev/null

cid=$(docker create -v "$wheels:/wheels:ro" "$bare" bash -euo pipefail -c '
  python3 -m pip install --no-cache-dir --no-index --find-links /wheels "pip==24.3.1"
  python3 -m pip install --no-cache-dir --no-index --find-links /wheels \
      "tensorflow-cpu==2.9.3" "numpy>=1.20,<2" "protobuf<3.20"
  ln -sf /usr/bin/python3 /usr/local/bin/python
  # Like the CUDA 11.x bases: an NVIDIA apt source that the derived image must
  # not depend on (here it is unreachable on purpose).
  echo "deb http://127.0.0.1:9/cuda/repos/ubuntu2004/x86_64 /" > /etc/apt/sources.list.d/cuda.list
  rm -rf /var/lib/apt/lists/* /root/.cache
  python3 -c "import tensorflow as tf, numpy; print(\"stand-in TF\", tf.__version__, \"numpy\", numpy.__version__)"
')
trap 'docker rm -f "$cid" >/dev/null 2>&1 || true' EXIT
docker start -a "$cid"

docker commit \
  --change 'ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LD_LIBRARY_PATH=/usr/local/cuda/extras/CUPTI/lib64:/usr/local/cuda/lib64:/usr/local/nvidia/lib:/usr/local/nvidia/lib64' \
  --change 'ENV NVIDIA_VISIBLE_DEVICES=all' \
  --change 'ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility' \
  --change 'ENV CUDA_VERSION=11.2.1' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' \
  "$cid" "$STANDIN_IMAGE" >/dev/null
log "built $STANDIN_IMAGE"
