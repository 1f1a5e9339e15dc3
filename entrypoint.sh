#!/usr/bin/env bash
# entrypoint.sh - start-up of the mixed-precision TensorFlow training image.
#
# Runs under tini (PID 1).  Starts as root only to prepare the container
# (user IDs, SSH keys, token), then every user-facing process runs as the
# unprivileged user `tf` (dropped with setpriv from util-linux); only sshd stays
# root, because it must switch to the logging-in user itself.
#
# Usage (the container's command):
#   (none) | serve      sshd + JupyterLab on 8888 (root dir /workspace); if either
#                       dies the container exits non-zero
#   self-test [ARGS]    the image's own pytest on the shipped tests (GPU tests run
#                       when a GPU is visible); ARGS go to pytest
#   anything else       run as user tf, exit status passed through
#                       (e.g. `python -m app train ...`, `bash -lc '...'`)
#
# Environment:
#   NB_UID, NB_GID       UID/GID for user tf (default 1000/1000).  Set them to
#                        your host's `id -u` / `id -g` so files written to mounted
#                        volumes are yours.  0 is refused.
#   JUPYTER_TOKEN        JupyterLab token (URL-safe characters)
#   JUPYTER_TOKEN_FILE   file holding the token (e.g. a Docker secret)
#                        neither: a random token.  The token is written to
#                        /home/tf/.jupyter/token (mode 600) and printed once as
#                        a full URL.  An empty token is refused: never no auth.
#   JUPYTER_HOST_PORT    host port shown in that URL (default 8888)
#   PUBLIC_KEY           OpenSSH public key(s) allowed to log in as tf, one
#                        per line; options (from=, command=...) are kept
#   PUBLIC_KEY_FILE      file with public keys (set but empty, or holding no
#                        key: refused); a file mounted at
#                        /home/tf/.ssh/authorized_keys is used too
#   SSH_PASSWORD         enables password login for tf (off by default)
#   SSH_PASSWORD_FILE    same, read from a file
#   ENABLE_SSH           1 (default) or 0 to run JupyterLab only
#   TFMP_QUIET           1: no start-up banner for batch commands
#   TFMP_TENSORBOARD_LOGDIR  folder JupyterLab's TensorBoard (/tensorboard/) shows
#                        (default $TFMP_WORKSPACE/runs, where `python -m app train`
#                        writes runs); an absolute path (created if missing) or a
#                        URL such as gs://bucket/runs
set -euo pipefail

readonly NB_USER=tf
readonly USER_HOME=/home/tf
readonly WORKSPACE=/workspace
TOKEN_FILE=$USER_HOME/.jupyter/token # moved under $HOME when started as non-root
readonly STATE_DIR=/run/tfmp
readonly ENV_FILE=/etc/tfmp/container.env
# sshd applies this root-owned include (SetEnv) to every SSH session; see save_environment.
readonly SSHD_ENV_CONF=/etc/ssh/sshd_config.d/tfmp-environment.conf
# What SetEnv cannot carry, as shell code, sourced by /etc/bash.bashrc (see save_environment).
readonly SSH_EXTRA_ENV=/etc/tfmp/ssh-extra-env.sh
readonly HOST_KEY_DIR=/etc/ssh/host_keys
readonly KEYS_DIR=/etc/ssh/authorized_keys
readonly TESTS_ROOT=/opt/tfmp

log() { printf '%s [entrypoint] %-5s %s\n' "$(date -u +%H:%M:%S)" "$1" "$2" >&2; }
info() { log INFO "$*"; }
warn() { log WARN "$*"; }
fatal() {
  log FATAL "$*"
  exit 64
}

is_root() { [[ $(id -u) -eq 0 ]]; }

# --- checks of the environment ------------------------------------------------

check_ids() {
  NB_UID=${NB_UID:-1000}
  NB_GID=${NB_GID:-1000}
  [[ $NB_UID =~ ^[0-9]+$ ]] || fatal "NB_UID must be a number (your host's \`id -u\`). Received: NB_UID='$NB_UID'"
  [[ $NB_GID =~ ^[0-9]+$ ]] || fatal "NB_GID must be a number (your host's \`id -g\`). Received: NB_GID='$NB_GID'"
  [[ $NB_UID -ne 0 ]] || fatal "NB_UID=0 is refused: the user must not be root (use your host's \`id -u\`)"
}

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

# --- user ----------------------------------------------------------------------

remap_user() {
  local cur_uid cur_gid changed=0
  cur_uid=$(id -u "$NB_USER")
  cur_gid=$(id -g "$NB_USER")
  if [[ $NB_GID != "$cur_gid" ]]; then
    groupmod -o -g "$NB_GID" "$NB_USER"
    info "group $NB_USER now has GID $NB_GID"
    changed=1
  fi
  if [[ $NB_UID != "$cur_uid" ]]; then
    usermod -o -u "$NB_UID" "$NB_USER"
    info "user $NB_USER now has UID $NB_UID"
    changed=1
  fi
  if [[ $changed == 1 ]]; then
    # Read-only mounts below the home (an authorized_keys file) stay as they are.
    chown -R "$NB_UID:$NB_GID" "$USER_HOME" 2>/dev/null || true
  fi
  # Only the top of the workspace, and only if the user could not write there
  # (a fresh bind mount created by Docker as root, or a volume from another UID).
  if ! setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups test -w "$WORKSPACE"; then
    chown "$NB_UID:$NB_GID" "$WORKSPACE"
    info "made $WORKSPACE writable for UID $NB_UID (top directory only)"
  fi
}

# Variables that are start-up secrets or internal: never passed to user processes.
readonly PRIVATE_VARS=(JUPYTER_TOKEN SSH_PASSWORD PUBLIC_KEY TFMP_JUPYTER_TOKEN_PATH)

# USER_CMD: the prefix that runs a command as the unprivileged user with a
# clean identity (setpriv from util-linux: no extra package, no setuid binary).
USER_CMD=()
build_user_cmd() {
  local name
  USER_CMD=()
  if is_root; then
    USER_CMD=(setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups)
  fi
  USER_CMD+=(env)
  for name in "${PRIVATE_VARS[@]}"; do USER_CMD+=(-u "$name"); done
  if is_root; then
    USER_CMD+=(HOME="$USER_HOME" USER="$NB_USER" LOGNAME="$NB_USER" SHELL=/bin/bash)
  fi
}

# --- environment parity for SSH sessions ---------------------------------------

# Two copies of the container's environment, both root-owned:
#  - $ENV_FILE, NAME=value lines, re-applied by login shells (profile.d);
#  - $SSHD_ENV_CONF, one sshd `SetEnv` line applied by sshd to every session
#    (shell, exec, sftp).  No PermitUserEnvironment: a user-writable
#    ~/.ssh/environment could set LD_PRELOAD & co. for sshd-started sessions.
# sshd's own rules (checked with `sshd -T` on 8.4; 8.2 has the same parser,
# which OpenSSH replaced only in 8.7): only the FIRST
# SetEnv line counts, so all variables go on one line, each as "NAME=value";
# there is no escape for '"' (an error), and '#' ends the line wherever it is
# (silently dropping the rest).  Such values go to $SSH_EXTRA_ENV instead, as
# shell code: `ssh host 'command'` runs `bash -c`, and Debian's and Ubuntu's
# bash read /etc/bash.bashrc when sshd starts them (SSH_SOURCE_BASHRC), where
# the Dockerfile sources that file; login shells have $ENV_FILE; internal-sftp
# runs no process.
# Backslashes are literal there; OpenSSH 8.7+ would read \\ and \" as escapes
# (revisit if the base moves to a newer OpenSSH).
SETENV_SKIPPED=()
save_environment() {
  local tmp entry name value setenv=() shell_code=()
  mkdir -p "$(dirname "$ENV_FILE")"
  tmp=$(mktemp "$ENV_FILE.XXXXXX")
  while IFS= read -r -d '' entry; do
    name=${entry%%=*}
    value=${entry#*=}
    case $name in
      HOME | PWD | OLDPWD | SHLVL | _ | HOSTNAME | USER | LOGNAME | SHELL | MAIL | TERM) continue ;;
    esac
    case " ${PRIVATE_VARS[*]} " in *" $name "*) continue ;; esac
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    if [[ $value == *$'\n'* ]]; then
      warn "not passing $name to SSH sessions: its value spans several lines"
      continue
    fi
    printf '%s=%s\n' "$name" "$value" >>"$tmp"
    case $value in
      *'"'* | *'#'*)
        SETENV_SKIPPED+=("$name")
        shell_code+=("export $name=$(printf '%q' "$value")")
        ;;
      *) setenv+=("\"$name=$value\"") ;;
    esac
  done < <(env -0)
  chown "root:$NB_GID" "$tmp"
  chmod 0640 "$tmp"
  mv -f "$tmp" "$ENV_FILE"

  rm -f "$SSH_EXTRA_ENV"
  if ((${#shell_code[@]})); then
    tmp=$(mktemp "$SSH_EXTRA_ENV.XXXXXX")
    printf '%s\n' "# Written by entrypoint.sh: values sshd's SetEnv cannot carry." "${shell_code[@]}" >"$tmp"
    chown "root:$NB_GID" "$tmp"
    chmod 0640 "$tmp"
    mv -f "$tmp" "$SSH_EXTRA_ENV"
  fi

  install -d -m 755 "$(dirname "$SSHD_ENV_CONF")"
  tmp=$(mktemp "$SSHD_ENV_CONF.XXXXXX")
  {
    echo "# Written by entrypoint.sh at every start: the container's environment for SSH sessions."
    if ((${#setenv[@]})); then printf 'SetEnv %s\n' "${setenv[*]}"; fi
  } >"$tmp"
  chmod 0600 "$tmp"
  mv -f "$tmp" "$SSHD_ENV_CONF"
  install -d -m 700 -o "$NB_UID" -g "$NB_GID" "$USER_HOME/.ssh"
}

# --- banner --------------------------------------------------------------------

banner() {
  local versions gpus shm_kb line
  versions=$(python3 - <<'PY' 2>/dev/null || true
import platform
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return "not installed"

print(f"Python {platform.python_version()}, "
      f"TensorFlow {version('tensorflow', 'tensorflow-gpu', 'tensorflow-cpu')}, "
      f"JupyterLab {version('jupyterlab')}, numpy {version('numpy')}")
PY
  )
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
  # importing TensorFlow (app/gpu_problems.py; docs/image.md, "No GPU?").
  local problems
  problems=$(timeout 20 python3 -m app.gpu_problems --banner 2>/dev/null || true)
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
}

# --- JupyterLab token ------------------------------------------------------------

setup_token() {
  local token source=JUPYTER_TOKEN
  [[ -z ${JUPYTER_TOKEN_FILE:-} ]] || source=JUPYTER_TOKEN_FILE
  token=$(secret_from_env JUPYTER_TOKEN "an empty token would disable authentication (unset it for a random one)")
  [[ -n $token ]] || token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
  # Only the offending characters are shown, never the token.
  [[ $token =~ ^[A-Za-z0-9._~-]+$ ]] ||
    fatal "$source: the Jupyter token may contain only letters, digits and . _ ~ - (it goes into URLs); found: $(printf '%q' "${token//[A-Za-z0-9._~-]/}")"
  ((${#token} >= 8)) || warn "the Jupyter token is shorter than 8 characters"
  install -d -m 700 "$(dirname "$TOKEN_FILE")"
  (umask 077 && printf '%s\n' "$token" >"$TOKEN_FILE")
  chmod 600 "$TOKEN_FILE"
  if is_root; then chown -R "$NB_UID:$NB_GID" "$(dirname "$TOKEN_FILE")"; fi
  JUPYTER_URL="http://127.0.0.1:${JUPYTER_HOST_PORT:-8888}/lab?token=$token"
}

# --- SSH -------------------------------------------------------------------------

SSHD_OPTS=()

# Number of keys on one authorized_keys line: a key type followed by base64
# ("AAAA...").  ssh-keygen and sshd read a second key pasted on the same line
# as part of the first one's comment, so only the first would ever work.
keys_on_line() {
  local -a words
  local i n=0
  read -ra words <<<"$1"
  for ((i = 0; i + 1 < ${#words[@]}; i++)); do
    if [[ ${words[i]} =~ ^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)$ &&
      ${words[i + 1]} == AAAA* ]]; then
      n=$((n + 1))
    fi
  done
  echo "$n"
}

# Checks every line of an authorized_keys-style file (options such as from=
# and command= are kept: sshd enforces them).  $1 = file, $2 = where it came
# from (named in the FATAL line), $3 = file to append the key lines to, without
# Windows line endings ("" = check only).  Sets KEYS_FOUND.
KEYS_FOUND=0
validate_keys() {
  local file=$1 origin=$2 out=${3:-} line n=0 one
  KEYS_FOUND=0
  one=$(mktemp)
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ -z ${line//[[:space:]]/} || $line == '#'* ]] && continue
    printf '%s\n' "$line" >"$one"
    if ! ssh-keygen -l -f "$one" >/dev/null 2>&1; then
      rm -f "$one"
      fatal "$origin line $n is not an OpenSSH public key: '${line:0:40}...'"
    fi
    if (($(keys_on_line "$line") > 1)); then
      rm -f "$one"
      fatal "$origin line $n holds more than one key: put each key on a line of its own"
    fi
    if [[ -n $out ]]; then printf '%s\n' "$line" >>"$out"; fi
    KEYS_FOUND=$((KEYS_FOUND + 1))
  done <"$file"
  rm -f "$one"
}

setup_ssh() {
  local keys password="" type
  install -d -m 755 "$KEYS_DIR"
  keys=$(mktemp)
  if [[ -n ${PUBLIC_KEY:-} ]]; then
    validate_keys <(printf '%s\n' "$PUBLIC_KEY") PUBLIC_KEY "$keys"
  fi
  if [[ ${PUBLIC_KEY_FILE+set} == set ]]; then
    [[ -n $PUBLIC_KEY_FILE ]] || fatal "PUBLIC_KEY_FILE is set but empty; unset it or give the path of a file of public keys"
    [[ -f $PUBLIC_KEY_FILE && -r $PUBLIC_KEY_FILE ]] || fatal "PUBLIC_KEY_FILE='$PUBLIC_KEY_FILE' is not a readable file"
    validate_keys "$PUBLIC_KEY_FILE" PUBLIC_KEY_FILE "$keys"
    ((KEYS_FOUND > 0)) || fatal "PUBLIC_KEY_FILE='$PUBLIC_KEY_FILE' holds no public key"
  fi
  if [[ -f $USER_HOME/.ssh/authorized_keys ]]; then
    validate_keys "$USER_HOME/.ssh/authorized_keys" "$USER_HOME/.ssh/authorized_keys"
  fi
  # Root-owned copy, read by sshd whatever the ownership of mounted files.
  chmod 644 "$keys"
  mv -f "$keys" "$KEYS_DIR/$NB_USER"

  password=$(secret_from_env SSH_PASSWORD "unset it to keep password login off")
  if [[ -n $password ]]; then
    printf '%s:%s\n' "$NB_USER" "$password" | chpasswd
    SSHD_OPTS+=(-o PasswordAuthentication=yes)
    info "SSH: password login enabled for $NB_USER (SSH_PASSWORD); keys are safer"
  else
    # '*': no password can match, but the account is not "locked" (which
    # would make sshd refuse key logins too).
    usermod -p '*' "$NB_USER"
  fi
  if [[ ! -s $KEYS_DIR/$NB_USER && ! -s $USER_HOME/.ssh/authorized_keys && -z $password ]]; then
    warn "SSH: no PUBLIC_KEY, PUBLIC_KEY_FILE, authorized_keys or SSH_PASSWORD given: nobody can log in over SSH"
  fi

  # Host keys: generated once into the volume, reused on every later start.
  install -d -m 755 "$HOST_KEY_DIR"
  for type in ed25519 rsa; do
    if [[ ! -s $HOST_KEY_DIR/ssh_host_${type}_key ]]; then
      rm -f "$HOST_KEY_DIR/ssh_host_${type}_key" "$HOST_KEY_DIR/ssh_host_${type}_key.pub"
      ssh-keygen -q -N '' -t "$type" -f "$HOST_KEY_DIR/ssh_host_${type}_key"
      info "SSH: generated the $type host key in $HOST_KEY_DIR"
    fi
    chmod 600 "$HOST_KEY_DIR/ssh_host_${type}_key"
  done
  info "SSH host key: $(ssh-keygen -l -f "$HOST_KEY_DIR/ssh_host_ed25519_key.pub" | awk '{print $2, $4}')"
  if ((${#SETENV_SKIPPED[@]})); then
    info "SSH: ${SETENV_SKIPPED[*]} reach(es) SSH commands through /etc/bash.bashrc, not SetEnv (no \" or # there); sftp does not need them"
  fi
  install -d -m 755 /run/sshd
  /usr/sbin/sshd -t "${SSHD_OPTS[@]}" || fatal "sshd refused its configuration (see above)"
}

# --- guide notebooks ---------------------------------------------------------------

# Copies the package's guide notebooks into the workspace, as the user: missing
# ones are added, unedited copies refreshed, edited ones never touched (the
# app's own `notebooks --install` decides).  A failure costs the notebooks, not
# the service.
install_notebooks() {
  local out
  if out=$("${USER_CMD[@]}" python3 -m app notebooks --install "$WORKSPACE/notebooks" 2>&1); then
    info "guide notebooks in $WORKSPACE/notebooks ($(grep -c . <<<"$out") checked)"
  else
    warn "could not install the guide notebooks into $WORKSPACE/notebooks: $(tail -n 1 <<<"$out")"
  fi
}

# --- TensorBoard (JupyterLab tile at /tensorboard/, started on first use) ---------

# Checked at start, as the user: a bad TFMP_TENSORBOARD_LOGDIR stops here with one
# line instead of a tile that fails later.  The default folder the user did not ask
# for (e.g. a read-only /workspace under --user) only warns, as the notebooks do.
# Sets TENSORBOARD_LOGDIR.
check_tensorboard_logdir() {
  local out
  if out=$("${USER_CMD[@]}" /usr/local/bin/tfmp-tensorboard --check 2>&1); then
    TENSORBOARD_LOGDIR=$out
    return
  fi
  [[ -z ${TFMP_TENSORBOARD_LOGDIR:-} ]] || fatal "${out#tfmp-tensorboard: }"
  warn "TensorBoard: ${out#tfmp-tensorboard: } (the tile shows runs once that folder exists)"
  TENSORBOARD_LOGDIR="${TFMP_WORKSPACE:-/workspace}/runs"
}

# --- modes -----------------------------------------------------------------------

serve() {
  local ssh_enabled=${ENABLE_SSH:-1} sshd_pid="" jupyter_pid status first
  [[ $ssh_enabled =~ ^[01]$ ]] || fatal "ENABLE_SSH must be 1 or 0. Received: ENABLE_SSH='$ssh_enabled'"
  if ! is_root && [[ $ssh_enabled == 1 ]]; then
    warn "started as a non-root user (--user): SSH needs root to switch users, so only JupyterLab runs"
    ssh_enabled=0
  fi
  setup_token
  [[ $ssh_enabled == 0 ]] || setup_ssh
  mkdir -p "$STATE_DIR"
  install_notebooks
  check_tensorboard_logdir

  local stopping=0
  trap 'stopping=1' TERM INT

  if [[ $ssh_enabled == 1 ]]; then
    # sshd logs to the container log (it ends lines with CR LF), minus the
    # healthcheck's connections.
    /usr/sbin/sshd -D -e "${SSHD_OPTS[@]}" 2> >(sed -u -e 's/\r$//' \
      -e '/^Connection closed by 127\.0\.0\.1 port [0-9]* \[preauth\]$/d' >&2) &
    sshd_pid=$!
  fi
  "${USER_CMD[@]}" TFMP_JUPYTER_TOKEN_PATH="$TOKEN_FILE" jupyter lab --no-browser &
  jupyter_pid=$!

  if [[ -n $sshd_pid ]]; then
    printf '{"jupyter": {"token_file": "%s"}, "sshd": {"port": 22}}\n' "$TOKEN_FILE" >"$STATE_DIR/services"
  else
    printf '{"jupyter": {"token_file": "%s"}}\n' "$TOKEN_FILE" >"$STATE_DIR/services"
  fi
  info "==> Jupyter URL: $JUPYTER_URL   (token also in $TOKEN_FILE)"
  [[ -z $sshd_pid ]] || info "==> SSH: ssh -p ${SSH_HOST_PORT:-2222} $NB_USER@127.0.0.1"
  info "==> TensorBoard: http://127.0.0.1:${JUPYTER_HOST_PORT:-8888}/tensorboard/ (launcher tile; runs in $TENSORBOARD_LOGDIR)"

  status=0
  wait -n || status=$?
  if [[ $stopping == 1 ]]; then
    info "stopping (signal received)"
    kill -TERM ${sshd_pid:+"$sshd_pid"} "$jupyter_pid" 2>/dev/null || true
    wait || true
    exit 0
  fi
  first=JupyterLab
  if [[ -n $sshd_pid ]] && ! kill -0 "$sshd_pid" 2>/dev/null; then first=sshd; fi
  log ERROR "$first exited (status $status): stopping the container so its restart policy can act"
  kill -TERM ${sshd_pid:+"$sshd_pid"} "$jupyter_pid" 2>/dev/null || true
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
  local mode=${1:-serve}
  if is_root; then
    check_ids
    remap_user
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
  build_user_cmd
  # Every mode: login shells (`bash -lc`, SSH, Jupyter terminals) re-apply it.
  if is_root; then save_environment; fi
  case $mode in
    serve)
      [[ $# -le 1 ]] || fatal "serve takes no arguments. Received: ${*:2}"
      banner
      serve
      ;;
    self-test)
      shift
      banner
      self_test "$@"
      ;;
    *)
      [[ ${TFMP_QUIET:-0} == 1 ]] || banner
      exec "${USER_CMD[@]}" "$@"
      ;;
  esac
}

main "$@"
