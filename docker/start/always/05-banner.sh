# shellcheck shell=bash
# Part of entrypoint.sh (sourced, every mode): the start-up banner - image version,
# Python/TensorFlow/JupyterLab/numpy versions, CUDA/cuDNN, the GPUs or why none is usable, /dev/shm,
# and whether anything is mounted on the workspace.
#
# Environment:
#   TFMP_QUIET  1: no banner for batch commands (serve and self-test always show it)

banner() {
  local versions gpus shm_kb line
  versions=$(tfmp-versions 2>/dev/null || true)
  info "== Mixed-precision TensorFlow training image ${TFMP_IMAGE_VERSION:-dev} =="
  info "${versions:-versions unknown}; CUDA ${CUDA_VERSION:-n/a}, cuDNN ${CUDNN_VERSION:-n/a}"
  gpus=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(timeout 10 nvidia-smi -L 2>/dev/null || true)
  fi
  if [[ -n $gpus ]]; then
    while IFS= read -r line; do info "GPU: $line"; done <<<"$gpus"
  fi
  # Why no GPU (or no fast one): one WARN line per problem and one per fix, without
  # importing TensorFlow (app/machine/gpu_problems.py; docs/image.md, "No GPU?").  Run from /
  # so a user's app.py or app/ in the working folder cannot stand in for the package.
  local problems
  problems=$(
    cd / || exit 0
    timeout 20 python3 -m app.machine.gpu_problems --banner 2>/dev/null || true
  )
  if [[ -n $problems ]]; then
    while IFS= read -r line; do warn "$line"; done <<<"$problems"
  fi
  shm_kb=$(df -k --output=size /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ' || echo 0)
  if [[ $shm_kb =~ ^[0-9]+$ ]] && ((shm_kb < 1048576)); then
    warn "/dev/shm is only $((shm_kb / 1024)) MiB: data pipelines may fail; NVIDIA recommends" \
      "--shm-size=1g --ulimit memlock=-1 --ulimit stack=67108864 (the compose file sets these)"
  else
    info "/dev/shm: $((shm_kb / 1024)) MiB"
  fi
  # Runs, models and notebooks are saved under the workspace: with nothing mounted there
  # they stay in this container's own layer and go with it (a `docker run --rm` batch job
  # loses its model the moment it ends).
  if [[ -d $WORKSPACE ]] && ! workspace_mounted; then
    warn "$WORKSPACE is not a mounted folder or volume: what is saved there (runs, models," \
      "notebooks) goes with this container; mount one: docker run -v \"\$PWD\":$WORKSPACE ..." \
      "(the compose file mounts the volume 'workspace')"
  fi
}

# Is the workspace a mount point (a bind mount, a named or anonymous volume, a Kubernetes
# volume)?  mountpoint(1) reads /proc/self/mountinfo; without it, a mount shows as another
# device than the root's.
workspace_mounted() {
  if command -v mountpoint >/dev/null 2>&1; then
    mountpoint -q "$WORKSPACE"
    return
  fi
  [[ $(stat -c %d "$WORKSPACE" 2>/dev/null) != "$(stat -c %d / 2>/dev/null)" ]]
}

[[ ${TFMP_QUIET:-0} =~ ^[01]$ ]] ||
  fatal "TFMP_QUIET must be 1 (no banner before batch commands) or 0. Received: TFMP_QUIET='$TFMP_QUIET'"
if [[ $MODE != command || ${TFMP_QUIET:-0} != 1 ]]; then banner; fi
