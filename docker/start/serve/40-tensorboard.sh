# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only): TensorBoard, a JupyterLab tile at
# /tensorboard/ started on first use (jupyter_server_config.py, tfmp-tensorboard).
#
# Environment:
#   TFMP_TENSORBOARD_LOGDIR  folder JupyterLab's TensorBoard (/tensorboard/) shows
#                        (default $TFMP_WORKSPACE/runs, where `tfmp train`
#                        writes runs); an absolute path (created if missing) or a
#                        URL such as gs://bucket/runs

# Checked at start, as the user: a bad TFMP_TENSORBOARD_LOGDIR stops here with one
# line instead of a tile that fails later.  The default folder the user did not ask
# for (e.g. a read-only /workspace under --user) only warns, as the notebooks do.
check_tensorboard_logdir() {
  local out logdir
  if out=$("${HELPER_CMD[@]}" /usr/local/bin/tfmp-tensorboard --check 2>&1); then
    logdir=$out
  else
    [[ -z ${TFMP_TENSORBOARD_LOGDIR:-} ]] || fatal "${out#tfmp-tensorboard: }"
    warn "TensorBoard: ${out#tfmp-tensorboard: } (the tile shows runs once that folder exists)"
    logdir="${TFMP_WORKSPACE:-/workspace}/runs"
  fi
  if [[ $JUPYTER_HUB == 1 ]]; then
    announce "TensorBoard: ${JUPYTER_BASE_URL}tensorboard/ through the hub (launcher tile; runs in $logdir)"
  else
    announce "TensorBoard: $JUPYTER_PUBLIC${JUPYTER_BASE_URL}tensorboard/ (launcher tile; runs in $logdir)"
  fi
}

check_tensorboard_logdir
