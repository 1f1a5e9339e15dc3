#!/usr/bin/env bash
# entrypoint.sh - start-up of the mixed-precision TensorFlow training image.
#
# Runs under tini (PID 1).  Starts as root only to prepare the container
# (user IDs, SSH keys, token), then every user-facing process runs as the
# unprivileged user `tf` (dropped with setpriv from util-linux); only sshd stays
# root, because it must switch to the logging-in user itself.
#
# Usage (the container's command):
#   (none) | serve      sshd + Jupyter on 8888 (JupyterLab and the Notebook interface,
#                       root dir /workspace); if either dies the container exits non-zero
#   self-test [ARGS]    the image's own pytest on the shipped tests (GPU tests run
#                       when a GPU is visible); ARGS go to pytest
#   anything else       run as user tf, exit status passed through
#                       (e.g. `tfmp train ...`, `bash -lc '...'`)
#
# This file is the core: it fits the user (UID/GID, home), sources the parts in
# $PARTS_DIR in name order (every mode; a part returns early when its mode is
# not running), then starts and supervises the services they registered, runs
# the self-test or execs the command.  Each part documents its own variables:
#   00-environment.sh  the container's environment for login shells and SSH
#   05-banner.sh       versions, GPUs, /dev/shm      (TFMP_QUIET)
#   07-home.sh         the persistent home: image files refreshed, user packages checked
#   08-jupyter-tls.sh  JupyterLab over TLS           (JUPYTER_TLS[_HOSTNAMES], JUPYTER_CERTFILE, JUPYTER_KEYFILE)
#   10-jupyter.sh      token, Jupyter server         (JUPYTER_UI, JUPYTER_TOKEN[_FILE], JUPYTER_HOST_PORT)
#   20-ssh.sh          keys, password, sshd          (ENABLE_SSH, PUBLIC_KEY[_FILE], SSH_PASSWORD[_FILE])
#   30-notebooks.sh    guide notebooks in /workspace/notebooks
#   40-tensorboard.sh  TensorBoard's runs folder     (TFMP_TENSORBOARD_LOGDIR)
#
# Environment read here:
#   NB_UID, NB_GID       UID/GID for user tf (default 1000/1000).  Set them to
#                        your host's `id -u` / `id -g` so files written to mounted
#                        volumes are yours.  0 is refused.
#
# What the parts may use (set here once, read-only before any part runs):
#   MODE                serve | self-test | command
#   NB_USER USER_HOME WORKSPACE  the user, its home, the Jupyter root folder
#   NB_UID NB_GID       the user's IDs after remapping (or the --user IDs)
#   TOKEN_FILE          where the Jupyter token goes (under $HOME when not root)
#   USER_CMD            prefix running a command as the user, without PRIVATE_VARS
#   PRIVATE_VARS        start-up secrets never passed to user processes
#   log/info/warn/fatal, is_root, secret_from_env    (below)
#   service NAME LABEL HEALTH_JSON FUNCTION          register a supervised process
#   announce LINE                                    a "==>" line once services run
set -euo pipefail

readonly NB_USER=tf
readonly USER_HOME=/home/tf
readonly WORKSPACE=/workspace
readonly STATE_DIR=/run/tfmp
readonly TESTS_ROOT=/opt/tfmp
readonly PARTS_DIR=/usr/local/lib/tfmp/entrypoint.d
# Start-up secrets and internal variables: never passed to user processes.
readonly PRIVATE_VARS=(JUPYTER_TOKEN SSH_PASSWORD PUBLIC_KEY TFMP_JUPYTER_TOKEN_PATH)

log() { printf '%s [entrypoint] %-5s %s\n' "$(date -u +%H:%M:%S)" "$1" "$2" >&2; }
info() { log INFO "$*"; }
warn() { log WARN "$*"; }
fatal() {
  log FATAL "$*"
  exit 64
}

is_root() { [[ $(id -u) -eq 0 ]]; }

read_secret_file() { # $1 = variable name holding a path
  local var=$1 path=${!1}
  [[ -f $path && -r $path ]] || fatal "$var='$path' is not a readable file"
  tr -d '\r\n' <"$path"
}

# A secret from NAME or NAME_FILE (e.g. a Docker secret); prints "" when neither is set.
# $1 = NAME, $2 = why an empty value is refused.  Call as `v=$(secret_from_env ...)`:
# a fatal in the subshell fails the assignment, and set -e stops the script.
secret_from_env() {
  local name=$1 why=$2 file_var="${1}_FILE" value=""
  if [[ -n ${!file_var:-} && -n ${!name:-} ]]; then
    fatal "set $name or $file_var, not both"
  fi
  if [[ -n ${!file_var:-} ]]; then
    # Explicit: set -e is not inherited by this function's own subshell.
    value=$(read_secret_file "$file_var") || exit
    [[ -n $value ]] || fatal "$file_var='${!file_var}' is empty; $why"
  elif [[ ${!name+set} == set ]]; then
    value=${!name}
    # A .env file saved by a Windows editor ends every value with CR: never meant.
    if [[ $value == *$'\r' ]]; then
      value=${value%$'\r'}
      warn "$name: removed a trailing carriage return (Windows line ending in .env?)"
    fi
    [[ -n $value ]] || fatal "$name is set but empty; $why"
  fi
  [[ $value != *$'\n'* ]] || fatal "$name must be a single line"
  printf '%s' "$value"
}

# --- the user ----------------------------------------------------------------------

check_ids() {
  NB_UID=${NB_UID:-1000}
  NB_GID=${NB_GID:-1000}
  [[ $NB_UID =~ ^[0-9]+$ ]] || fatal "NB_UID must be a number (your host's \`id -u\`). Received: NB_UID='$NB_UID'"
  [[ $NB_GID =~ ^[0-9]+$ ]] || fatal "NB_GID must be a number (your host's \`id -g\`). Received: NB_GID='$NB_GID'"
  [[ $NB_UID -ne 0 ]] || fatal "NB_UID=0 is refused: the user must not be root (use your host's \`id -u\`)"
}

remap_user() {
  local cur_uid cur_gid
  cur_uid=$(id -u "$NB_USER")
  cur_gid=$(id -g "$NB_USER")
  if [[ $NB_GID != "$cur_gid" ]]; then
    groupmod -o -g "$NB_GID" "$NB_USER"
    info "group $NB_USER now has GID $NB_GID"
  fi
  if [[ $NB_UID != "$cur_uid" ]]; then
    usermod -o -u "$NB_UID" "$NB_USER"
    info "user $NB_USER now has UID $NB_UID"
  fi
  # The home's owner decides, not the remap: the home may be a volume that outlives
  # the container, so the same NB_UID in a new container costs nothing, and a home
  # left by another UID (or copied by Docker from the image) is re-owned once.
  if [[ $(stat -c %u:%g "$USER_HOME") != "$NB_UID:$NB_GID" ]]; then
    # Read-only mounts below the home (an authorized_keys file) stay as they are.
    chown -R "$NB_UID:$NB_GID" "$USER_HOME" 2>/dev/null || true
    info "re-owned $USER_HOME for UID $NB_UID, GID $NB_GID"
  fi
  # Only the top of the workspace, and only if the user could not write there
  # (a fresh bind mount created by Docker as root, or a volume from another UID).
  if ! setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups test -w "$WORKSPACE"; then
    chown "$NB_UID:$NB_GID" "$WORKSPACE"
    info "made $WORKSPACE writable for UID $NB_UID (top directory only)"
  fi
}

# Prints USER_CMD, NUL-separated: the prefix that runs a command as the unprivileged
# user with a clean identity (setpriv from util-linux: no extra package, no setuid binary).
user_cmd() {
  local name
  if is_root; then printf '%s\0' setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups; fi
  printf '%s\0' env
  for name in "${PRIVATE_VARS[@]}"; do printf '%s\0' -u "$name"; done
  if is_root; then printf '%s\0' HOME="$USER_HOME" USER="$NB_USER" LOGNAME="$NB_USER" SHELL=/bin/bash; fi
}

# --- services the parts register, supervised in serve mode ---------------------------

SERVICE_KEYS=() SERVICE_LABELS=() SERVICE_HEALTH=() SERVICE_STARTERS=() ANNOUNCEMENTS=()

# $1 = key in $STATE_DIR/services (the healthcheck's list), $2 = name in messages,
# $3 = that key's JSON value for the healthcheck, $4 = a function that execs the process.
service() {
  SERVICE_KEYS+=("$1") SERVICE_LABELS+=("$2") SERVICE_HEALTH+=("$3") SERVICE_STARTERS+=("$4")
}

announce() { ANNOUNCEMENTS+=("$*"); }

# Starts the registered services; the first to exit stops the container (non-zero, so
# a restart policy acts), a TERM/INT stops them all with status 0.
supervise() {
  local pids=() json="" i status first line stopping=0
  trap 'stopping=1' TERM INT
  for i in "${!SERVICE_STARTERS[@]}"; do
    "${SERVICE_STARTERS[i]}" &
    pids+=($!)
    json+="${json:+, }\"${SERVICE_KEYS[i]}\": ${SERVICE_HEALTH[i]}"
  done
  mkdir -p "$STATE_DIR"
  printf '{%s}\n' "$json" >"$STATE_DIR/services"
  for line in "${ANNOUNCEMENTS[@]}"; do info "==> $line"; done

  status=0
  wait -n || status=$?
  if [[ $stopping == 1 ]]; then
    info "stopping (signal received)"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait || true
    exit 0
  fi
  first=${SERVICE_LABELS[0]}
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[i]}" 2>/dev/null; then
      first=${SERVICE_LABELS[i]}
      break
    fi
  done
  log ERROR "$first exited (status $status): stopping the container so its restart policy can act"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
  exit $((status == 0 ? 1 : status))
}

self_test() {
  info "self-test: the image's pytest on $TESTS_ROOT/tests (GPU tests run only where a GPU is visible)"
  cd "$TESTS_ROOT"
  local suites=() dir
  for dir in tests/unit tests/gpu; do [[ -d $dir ]] && suites+=("$dir"); done
  ((${#suites[@]})) || fatal "no tests shipped in $TESTS_ROOT/tests"
  exec "${USER_CMD[@]}" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -p no:cacheprovider -q --image-self-test "${suites[@]}" "$@"
}

main() {
  local part
  case ${1:-serve} in
    serve)
      MODE=serve
      [[ $# -le 1 ]] || fatal "serve takes no arguments. Received: ${*:2}"
      ;;
    self-test) MODE=self-test ;;
    *) MODE="command" ;;
  esac
  if is_root; then
    check_ids
    remap_user
    TOKEN_FILE=$USER_HOME/.jupyter/token
  else
    NB_UID=$(id -u)
    NB_GID=$(id -g)
    # `--user UID:GID` with a UID the image does not know: a private HOME.
    if [[ ! -w ${HOME:-/nonexistent} ]]; then
      export HOME=/tmp/home-$NB_UID
      install -d -m 700 "$HOME"
    fi
    TOKEN_FILE=$HOME/.jupyter/token
  fi
  mapfile -d '' USER_CMD < <(user_cmd)
  # shellcheck disable=SC2034  # TOKEN_FILE is read by the parts
  readonly MODE NB_UID NB_GID TOKEN_FILE USER_CMD

  for part in "$PARTS_DIR"/*.sh; do
    # shellcheck source=/dev/null  # each part is checked on its own (tests/image/test_static.py)
    source "$part"
  done

  case $MODE in
    serve) supervise ;;
    self-test)
      shift
      self_test "$@"
      ;;
    *) exec "${USER_CMD[@]}" "$@" ;;
  esac
}

main "$@"
