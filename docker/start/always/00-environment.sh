# shellcheck shell=bash
# Part of entrypoint.sh (sourced, every mode, as root): the container's environment
# for login shells and SSH sessions, so `tfmp train` over SSH finds the GPU as it
# does in Jupyter (PATH, LD_LIBRARY_PATH, CUDA/NVIDIA/TF variables, PIP_CONSTRAINT,
# variables passed with -e, and what the user's start-up hooks export).  Written once
# the hooks ran and JUPYTER_ENV_VARS_TO_UNSET was applied (after_hooks): written here,
# before them, it missed a hook's `export` that Jupyter and the command had.
#
# Two copies of it, both root-owned:
#  - $ENV_FILE, NAME=value lines, re-applied by login shells (profile.d), root's
#    (`docker exec C bash -l`) included;
#  - $SSHD_ENV_CONF, one sshd `SetEnv` line applied by sshd to every session
#    (shell, exec, sftp).  No PermitUserEnvironment: a user-writable
#    ~/.ssh/environment could set LD_PRELOAD & co. for sshd-started sessions.
# PATH differs: the user's sessions have ~/.local/bin first (entrypoint.sh, user_path),
# root's never (a `ls` the user put there would run as root).  SetEnv, which only the
# user's sessions get (sshd lets no one else in), carries the user's PATH; $ENV_FILE
# carries the container's, and the profile script puts the user's bin first for
# everyone but root (docker/config/profile-container-env.sh).
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
#
# Sets (read-only, once written) for the functions later parts register with after_hooks:
#   SETENV_SKIPPED  names that reach SSH commands through $SSH_EXTRA_ENV, not SetEnv

readonly ENV_FILE=/etc/tfmp/container.env
readonly SSHD_ENV_CONF=/etc/ssh/sshd_config.d/tfmp-environment.conf
readonly SSH_EXTRA_ENV=/etc/tfmp/ssh-extra-env.sh
readonly UNSET_PRIVATE=/etc/tfmp/unset-private.sh

# $SSH_EXTRA_ENV's line for NAME ($1) = VALUE ($2).  /etc/bash.bashrc sources that file in
# root's interactive shells too (`docker exec -it C bash`): a PATH there is the user's
# (VALUE) only for shells not of root, which keep the container's.
# shellcheck disable=SC2016  # $(id -u) is the reading shell's
shell_export() {
  if [[ $1 == PATH ]]; then
    printf 'if [ "$(id -u)" = 0 ]; then export PATH=%q; else export PATH=%q; fi' "$PATH" "$2"
  else
    printf 'export %s=%q' "$1" "$2"
  fi
}

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
    # Removed after the hooks (JUPYTER_ENV_VARS_TO_UNSET): SSH sessions never see them either.
    case " ${UNSET_VARS[*]} JUPYTER_ENV_VARS_TO_UNSET " in *" $name "*) continue ;; esac
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    if [[ $value == *$'\n'* ]]; then
      warn "not passing $name to SSH sessions: its value spans several lines"
      continue
    fi
    printf '%s=%s\n' "$name" "$value" >>"$tmp"
    # sshd's sessions are the user's alone: their PATH is the user's.
    [[ $name != PATH ]] || value=$(user_path)
    case $value in
      *'"'* | *'#'*)
        SETENV_SKIPPED+=("$name")
        shell_code+=("$(shell_export "$name" "$value")")
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

  save_private_names

  install -d -m 755 "$(dirname "$SSHD_ENV_CONF")"
  tmp=$(mktemp "$SSHD_ENV_CONF.XXXXXX")
  {
    echo "# Written by entrypoint.sh at every start: the container's environment for SSH sessions."
    if ((${#setenv[@]})); then printf 'SetEnv %s\n' "${setenv[*]}"; fi
  } >"$tmp"
  chmod 0600 "$tmp"
  mv -f "$tmp" "$SSHD_ENV_CONF"
  # ~/.ssh private, as sshd wants it: as the user (the home is the user's to change;
  # root would follow a ~/.ssh made a symlink to /etc).  Something else there is the
  # user's choice: one line, and sshd reads only the keys root keeps.
  "${HELPER_CMD[@]}" install -d -m 700 "$USER_HOME/.ssh" 2>/dev/null ||
    warn "$USER_HOME/.ssh is not a folder the user can make private (mode 700): keys there may not work over SSH"
  readonly SETENV_SKIPPED
}

# `docker exec` starts its process with the environment Docker keeps for the container, the
# start-up secrets and JUPYTER_ENV_VARS_TO_UNSET's variables included: nothing in the
# container can change that.  Login and interactive shells (the profile script, bash.bashrc)
# drop them at least, so what such a shell runs never inherits them (docs/image.md says what
# remains: the exec'd process's own environment).  Names only, checked as names.
save_private_names() {
  local tmp names=() name
  for name in "${PRIVATE_VARS[@]}" "${UNSET_VARS[@]}" JUPYTER_ENV_VARS_TO_UNSET; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && names+=("$name")
  done
  tmp=$(mktemp "$UNSET_PRIVATE.XXXXXX")
  printf '%s\n' "# Written by entrypoint.sh: what docker exec's shells drop." \
    "unset ${names[*]}" >"$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$UNSET_PRIVATE"
}

if is_root; then after_hooks save_environment; fi
