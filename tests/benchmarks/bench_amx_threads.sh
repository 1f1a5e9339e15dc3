#!/usr/bin/env bash
# Benchmark of the image (not a test): what one TensorFlow inter-op thread costs on a CPU
# with AMX, where the entrypoint sets TF_NUM_INTEROP_THREADS=1 so that TF 2.9's bfloat16
# convolutions cannot deadlock (docs/image.md, "CPUs with AMX").
#
# Each pair trains the same job twice in fresh containers: once as the image starts it
# (one inter-op thread) and once with TF_NUM_INTEROP_THREADS=0 (kept by the entrypoint:
# TensorFlow's default), in ABBA order so that a drift of the machine falls on both sides.
# A side's figure is the median samples/s of its epochs after the first (the first holds
# the tracing).  Prints each pair and the median and mean of the ratios one/default - 1.
# mixed_bfloat16 with convolutions is not a side here: with TensorFlow's default it can
# hang, which is why the setting exists.
#
# Usage: tests/benchmarks/bench_amx_threads.sh [MODEL] [POLICY] [PAIRS]
#        (default: resnet float32 4)
# Environment: TFMP_TEST_IMAGE (default tfmp/train:test)
set -euo pipefail

model=${1:-resnet} policy=${2:-float32} pairs=${3:-4}
image=${TFMP_TEST_IMAGE:-tfmp/train:test}
grep -qw amx_bf16 /proc/cpuinfo || echo "note: this CPU has no AMX; the entrypoint leaves TensorFlow's default, so both sides measure the same" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rate() {   # $1: one | default -> median samples/s of epochs 2..
  local out="$work/$1" env=()
  [[ $1 == default ]] && env=(-e TF_NUM_INTEROP_THREADS=0)
  rm -rf "$out"; mkdir -p "$out"; chmod 777 "$out"
  docker run --rm -e TFMP_QUIET=1 "${env[@]}" -v "$out":/out "$image" \
    tfmp train --model "$model" --dataset synthetic --precision "$policy" --epochs 3 \
    --max-train-samples 2048 --max-val-samples 256 --no-save-model --offline \
    --progress lines --output /out/run >/dev/null 2>"$work/err" ||
    { tail -n 5 "$work/err" >&2; exit 1; }
  python3 -c 'import json, statistics, sys
m = json.load(open(sys.argv[1]))
print(statistics.median(e["samples_per_second"] for e in m["epochs"][1:]))' "$out/run/metrics.json"
}

ratios=()
for i in $(seq "$pairs"); do
  if ((i % 2)); then one=$(rate one); default=$(rate default)
  else default=$(rate default); one=$(rate one); fi
  ratio=$(python3 -c "print(f'{$one / $default - 1:+.1%}')")
  printf 'pair %d: one inter-op thread %.1f samples/s, default %.1f: %s\n' "$i" "$one" "$default" "$ratio"
  ratios+=("$one" "$default")
done
python3 - "${ratios[@]}" <<'PY'
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
r = [one / default - 1 for one, default in zip(v[::2], v[1::2])]
print(f"one/default - 1: median {statistics.median(r):+.1%}, mean {statistics.mean(r):+.1%} "
      f"over {len(r)} pairs")
PY
