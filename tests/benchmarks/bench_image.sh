#!/usr/bin/env bash
# Benchmark of the image (not a test): build, rebuild and start-up figures.
#
#   full build      seconds for `docker compose build --no-cache` (apt + pip + app)
#   app rebuild     seconds to rebuild after a change in app/ (on a copy of the
#                   build context, so the work tree is never touched)
#   size added      image size minus base size
#   up -> healthy   seconds from `docker compose up -d` to "healthy" (CPU override),
#                   first start (host keys generated) and warm starts (median)
#   tensorboard     seconds for the first open of /tensorboard/ (with the token): it
#                   starts TensorBoard behind JupyterLab
#   docker stop     seconds for `docker stop` of the running service
#
# Targets: healthy <= 15 s on 2 cores; app rebuild < 10% of a full build; TensorBoard's
# first open <= 90 s; docker stop < 3 s (median).  Exits 1 when a target is missed, so a
# run can be used as a check.
#
# Usage: tests/benchmarks/bench_image.sh [--runs N] [--json FILE]
# Environment: BASE_IMAGE (default the stand-in tfmp/standin-base:2.9.3),
#              PIP_CA_FILE (default the system CA bundle, if present)
set -euo pipefail

log() { printf '%s [bench] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

runs=3
json_out=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--runs needs a positive number"
      runs=$2
      shift 2
      ;;
    --json)
      [[ -n ${2:-} ]] || die "--json needs a file name"
      json_out=$2
      shift 2
      ;;
    *) die "unknown option '$1'; allowed: --runs N, --json FILE" ;;
  esac
done

repo=$(cd "$(dirname "$0")/../.." && pwd)
export BASE_IMAGE=${BASE_IMAGE:-tfmp/standin-base:2.9.3}
if [[ -z ${PIP_CA_FILE:-} && -f /etc/ssl/certs/ca-certificates.crt ]]; then
  export PIP_CA_FILE=/etc/ssl/certs/ca-certificates.crt
fi
export IMAGE=tfmp/train:bench
export COMPOSE_PROJECT_NAME=tfmpbench$$
export BIND_ADDRESS=127.0.0.1
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
JUPYTER_HOST_PORT=$(free_port)
SSH_HOST_PORT=$(free_port)
export JUPYTER_HOST_PORT SSH_HOST_PORT
# Sandboxed engines cannot raise RLIMIT_MEMLOCK to unlimited (see docs/image.md).
hard=$(awk '/Max locked memory/ {print $5}' "/proc/$(pgrep -o -x dockerd)/limits" 2>/dev/null || echo unlimited)
if [[ $hard != unlimited && -n $hard ]]; then export MEMLOCK_LIMIT=$hard; fi

docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || die "base $BASE_IMAGE missing (tests/image/make_standin_base.sh)"

ctx=$(mktemp -d /tmp/tfmp-bench-ctx.XXXXXX)
cleanup() {
  (cd "$ctx" && docker compose -f docker-compose.yml -f docker-compose.cpu.yml down -v -t 5 >/dev/null 2>&1) || true
  rm -rf "$ctx"
}
trap cleanup EXIT
# A copy of the build context: the benchmark edits app/ there, never in the repo.
tar -C "$repo" --exclude=.git --exclude='__pycache__' -cf - . | tar -C "$ctx" -xf -
cd "$ctx"
compose() { docker compose -f docker-compose.yml -f docker-compose.cpu.yml "$@"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$(now)"; }

log "full build without cache (base $BASE_IMAGE)"
t0=$(now)
compose build --no-cache -q tfmp >/dev/null 2>&1 || die "full build failed"
full_build=$(since "$t0")

log "rebuild after a change in app/"
printf '\n# benchmark edit %s\n' "$(now)" >>app/__init__.py
t0=$(now)
compose build -q tfmp >/dev/null 2>&1 || die "rebuild failed"
app_rebuild=$(since "$t0")

base_size=$(docker image inspect -f '{{.Size}}' "$BASE_IMAGE")
image_size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
added_mb=$(((image_size - base_size) / 1000000))

wait_healthy() {
  local cid state
  cid=$(compose ps -q tfmp)
  for _ in $(seq 600); do
    state=$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null || echo starting)
    [[ $state == healthy ]] && return 0
    [[ $state == unhealthy ]] && die "the service became unhealthy"
    sleep 0.1
  done
  die "not healthy after 60 s"
}

first_open() {
  local cid token t0
  cid=$(compose ps -q tfmp)
  token=$(docker exec "$cid" cat /home/tf/.jupyter/token)
  t0=$(now)
  curl -fsS -o /dev/null --max-time 300 -H "Authorization: token $token" \
    "http://127.0.0.1:$JUPYTER_HOST_PORT/tensorboard/" || die "/tensorboard/ did not open"
  since "$t0"
}

healthy_times=()
stop_times=()
tensorboard_times=()
for i in $(seq 0 "$runs"); do
  t0=$(now)
  compose up -d --no-build tfmp >/dev/null 2>&1 || die "compose up failed"
  wait_healthy
  healthy_times+=("$(since "$t0")")
  opened=$(first_open) || die "/tensorboard/ did not open"
  tensorboard_times+=("$opened")
  cid=$(compose ps -q tfmp)
  t0=$(now)
  docker stop "$cid" >/dev/null
  stop_times+=("$(since "$t0")")
  compose down -t 5 >/dev/null 2>&1 # keeps the volumes: later starts reuse host keys
  log "start $i: healthy after ${healthy_times[-1]} s, /tensorboard/ ${tensorboard_times[-1]} s, stop ${stop_times[-1]} s"
done

python3 - "$full_build" "$app_rebuild" "$added_mb" "${json_out:-}" "${healthy_times[*]}" "${stop_times[*]}" "${tensorboard_times[*]}" <<'PY'
import json, statistics, sys
full, app, added_mb, out = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
healthy = [float(x) for x in sys.argv[5].split()]
stops = [float(x) for x in sys.argv[6].split()]
tensorboard = [float(x) for x in sys.argv[7].split()]
res = {
    "full_build_s": full, "app_rebuild_s": app, "app_rebuild_ratio": round(app / full, 3),
    "size_added_mb": added_mb,
    "up_to_healthy_first_s": healthy[0],
    "up_to_healthy_warm_median_s": statistics.median(healthy[1:]) if len(healthy) > 1 else None,
    "docker_stop_median_s": statistics.median(stops),
    "tensorboard_first_open_max_s": max(tensorboard),
    "targets": {"healthy_le_15s": max(healthy) <= 15, "app_rebuild_lt_10pct": app / full < 0.10,
                "tensorboard_first_open_le_90s": max(tensorboard) <= 90,
                "docker_stop_median_lt_3s": statistics.median(stops) < 3},
}
rows = [("full build (no cache)", f"{full:.1f} s"),
        ("app/ change rebuild", f"{app:.1f} s ({100 * app / full:.1f}% of full; target < 10%)"),
        ("size added over base", f"{added_mb} MB"),
        ("up -d -> healthy, first", f"{healthy[0]:.1f} s (target <= 15 s)"),
        ("up -d -> healthy, warm median", f"{res['up_to_healthy_warm_median_s']} s"),
        ("/tensorboard/ first open, max", f"{max(tensorboard):.1f} s (target <= 90 s)"),
        ("docker stop, median", f"{res['docker_stop_median_s']:.2f} s (target < 3 s)")]
width = max(len(r[0]) for r in rows)
for name, value in rows:
    print(f"{name:<{width}}  {value}")
if out:
    with open(out, "w") as fh:
        json.dump(res, fh, indent=2)
missed = [name for name, met in res["targets"].items() if not met]
print("targets: all met" if not missed else f"targets MISSED: {', '.join(missed)}")
sys.exit(1 if missed else 0)
PY
