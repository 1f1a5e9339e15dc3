# shellcheck shell=bash
# Part of entrypoint.sh (sourced, every mode, before 00-environment.sh saves the
# environment for SSH sessions): one TensorFlow inter-op thread on a CPU with AMX when
# no GPU is visible, so that TF 2.9's bfloat16 training cannot hang there.
#
# Why: on AMX CPUs (Intel Xeon 4th generation and later) TF 2.9's oneDNN runs a bfloat16
# convolution's weight gradient (jit_avx512_core_amx_convolution_bwd_weights) as a
# parallel region whose threads meet at a spinning barrier.  TensorFlow hands those
# threads to its intra-op pool.  When two such ops run at once (the two branches of a
# residual block, started by two inter-op threads), each can hold one pool thread
# spinning at its barrier while the thread it waits for is queued behind the other:
# both spin forever, at 100% of every core, and SIGTERM cannot stop the step.
# Measured on a 2-core Xeon with AMX (`tfmp train --model resnet --precision
# mixed_bfloat16`): 3 runs in 10 hung; with one inter-op thread 10 in 10 finished,
# float32 10 in 10, and TF 2.21's oneDNN 8 in 8.  `--precision auto` picks
# mixed_bfloat16 on such a CPU, so this is the default path there.
#
# One inter-op thread runs one op at a time, each over every core: Intel's own
# advice for oneDNN on one socket.  Not with a GPU (its ops are not oneDNN's, and
# several GPUs' kernels are launched from inter-op threads), and never over a value
# the user set.
#
# The line saying so is printed with the banner (not before a batch command under
# TFMP_QUIET=1, 05-banner.sh's variable).
#
# Environment:
#   TF_NUM_INTEROP_THREADS  TensorFlow's own; set to 1 here only when unset

cpu_threads() {
  [[ -z ${TF_NUM_INTEROP_THREADS+set} ]] || return 0
  compgen -G '/dev/nvidia[0-9]*' >/dev/null && return 0
  grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null || return 0
  export TF_NUM_INTEROP_THREADS=1
  # Said with the banner's lines (none for a quiet batch command: TFMP_QUIET=1).
  [[ $MODE != command || ${TFMP_QUIET:-0} != 1 ]] || return 0
  info "TF_NUM_INTEROP_THREADS=1: this CPU has AMX and no GPU is visible; TF 2.9's bfloat16 convolutions can deadlock here with several inter-op threads (docs/image.md, \"CPUs with AMX\"); set TF_NUM_INTEROP_THREADS yourself to override"
}

cpu_threads
