# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only, as root): SSH logins as user tf.
#
# Environment:
#   ENABLE_SSH           1 (default; 0 under JupyterHub, whose users come through the
#                        hub) or 0 to run JupyterLab only
#   PUBLIC_KEY           OpenSSH public key(s) allowed to log in as tf, one
#                        per line; options (from=, command=...) are kept
#   PUBLIC_KEY_FILE      file with public keys (set but empty, or holding no
#                        key: refused); a file mounted at
#                        /home/tf/.ssh/authorized_keys is used too
#   SSH_PASSWORD         enables password login for tf (off by default)
#   SSH_PASSWORD_FILE    same, read from a file
#   SSH_HOST_PORT        host port shown in the start-up line (default 2222)

readonly HOST_KEY_DIR=/etc/ssh/host_keys
readonly KEYS_DIR=/etc/ssh/authorized_keys

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

# Options for both `sshd -t` and the daemon; set by setup_ssh.
SSHD_OPTS=()
setup_ssh() {
  local keys password="" type
  install -d -m 755 "$KEYS_DIR"
  keys=$(mktemp)
  if [[ -n ${PUBLIC_KEY:-} ]]; then
    validate_keys <(printf '%s\n' "$PUBLIC_KEY") PUBLIC_KEY "$keys"
  fi
  if [[ ${PUBLIC_KEY_FILE+set} == set ]]; then
    [[ -n $PUBLIC_KEY_FILE ]] || fatal "PUBLIC_KEY_FILE is set but empty; unset it or give the path of a file of public keys"
    refuse_user_path PUBLIC_KEY_FILE
    [[ -f $PUBLIC_KEY_FILE && -r $PUBLIC_KEY_FILE ]] || fatal "PUBLIC_KEY_FILE='$PUBLIC_KEY_FILE' is not a readable file"
    validate_keys "$PUBLIC_KEY_FILE" PUBLIC_KEY_FILE "$keys"
    ((KEYS_FOUND > 0)) || fatal "PUBLIC_KEY_FILE='$PUBLIC_KEY_FILE' holds no public key"
  fi
  # The user's own file (or one mounted there), read as the user, as sshd reads it:
  # root never opens a path below the home, which the user may have made a link to
  # /etc/shadow (docs/image.md, "Security").
  local home_keys=$USER_HOME/.ssh/authorized_keys user_keys
  user_keys=$(mktemp)
  if "${HELPER_CMD[@]}" test -f "$home_keys"; then
    if "${HELPER_CMD[@]}" cat -- "$home_keys" >"$user_keys" 2>/dev/null; then
      validate_keys "$user_keys" "$home_keys"
    else
      warn "SSH: $home_keys is not readable by UID $NB_UID, so sshd cannot use it either"
    fi
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
  if [[ ! -s $KEYS_DIR/$NB_USER && ! -s $user_keys && -z $password ]]; then
    warn "SSH: no PUBLIC_KEY, PUBLIC_KEY_FILE, authorized_keys or SSH_PASSWORD given: nobody can log in over SSH"
  fi
  rm -f "$user_keys"

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
  install -d -m 755 /run/sshd
  readonly SSHD_OPTS
  # Checked once the sessions' environment is written, after the hooks (00-environment.sh).
  after_hooks check_sshd_config
  service sshd sshd '{"port": 22}' start_sshd
  announce "SSH: ssh -p ${SSH_HOST_PORT:-2222} $NB_USER@127.0.0.1"
}

check_sshd_config() {
  if ((${#SETENV_SKIPPED[@]})); then
    info "SSH: ${SETENV_SKIPPED[*]} reach(es) SSH commands through /etc/bash.bashrc, not SetEnv (no \" or # there); sftp does not need them"
  fi
  /usr/sbin/sshd -t "${SSHD_OPTS[@]}" || fatal "sshd refused its configuration (see above)"
}

# sshd logs to the container log (it ends lines with CR LF), minus the
# healthcheck's connections.
start_sshd() {
  exec /usr/sbin/sshd -D -e "${SSHD_OPTS[@]}" 2> >(sed -u -e 's/\r$//' \
    -e '/^Connection closed by 127\.0\.0\.1 port [0-9]* \[preauth\]$/d' >&2)
}

SSH_ON=1
[[ $JUPYTER_HUB == 0 ]] || SSH_ON=0
SSH_ON=${ENABLE_SSH:-$SSH_ON}
[[ $SSH_ON =~ ^[01]$ ]] || fatal "ENABLE_SSH must be 1 or 0. Received: ENABLE_SSH='${ENABLE_SSH:-}'"
check_port_var SSH_HOST_PORT
if [[ $SSH_ON == 1 ]] && ! is_root; then
  warn "started as a non-root user (--user): SSH needs root to switch users, so only JupyterLab runs"
elif [[ $SSH_ON == 1 ]] && ! has_cap SYS_CHROOT; then
  # sshd confines every login's pre-authentication process with chroot(2): without the
  # capability each login fails ("chroot: Operation not permitted") while the start looked
  # healthy.  Off, as for --user, rather than a server nobody can log in to.
  warn "SSH: the container lacks the SYS_CHROOT capability (--cap-drop), which sshd needs for every login, so only JupyterLab runs; add --cap-add SYS_CHROOT, or ENABLE_SSH=0 to turn SSH off without this line"
elif [[ $SSH_ON == 1 ]]; then
  setup_ssh
fi
