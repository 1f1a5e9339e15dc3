# shellcheck shell=bash
# Part of entrypoint.sh (sourced, every mode, as root): rights the operator grants the user
# at start, with docker-stacks' names.  Only a root start can grant them; a --user start
# that asks gets one WARN line.  Nothing below the home is read to decide (docs/image.md,
# "Security"): the operator's environment decides, never a file the user controls.
#
# Environment:
#   GRANT_SUDO        yes or 1: passwordless sudo for the user (root inside the container:
#                     a risk, off by default); no, 0 or unset: none
#   CHOWN_EXTRA       folders (separated by commas) given to NB_UID:NB_GID at start, e.g.
#                     a mounted /data; outside the home and the workspace (the user's
#                     already) and above neither, absolute, with no symlink in the path
#                     (checked again on the folder itself when it is re-owned);
#                     no system folder (/etc, /usr, ...) unless GRANT_SUDO gives root anyway
#   CHOWN_EXTRA_OPTS  -R: their contents too (links are changed, never followed)

readonly SUDOERS_FILE=/etc/sudoers.d/tfmp-grant-sudo
# The system's folders and the image's (root runs its start from /opt/tfmp and /usr): the
# user who owns one, or a folder above one (whose entries they may then rename and
# replace), can make themselves root (a passwd without root's password, a start script).
readonly CHOWN_EXTRA_SYSTEM=(/bin /boot /dev /etc /lib /lib32 /lib64 /libx32 /opt/tfmp /proc
                             /root /run /sbin /sys /tmp /usr /var)

grant_sudo() {
  local grant=${GRANT_SUDO:-no} tmp
  [[ $grant =~ ^(yes|1|no|0)$ ]] ||
    fatal "GRANT_SUDO must be yes or 1 (passwordless sudo for $NB_USER), or no or 0 (unset: no). Received: GRANT_SUDO='$GRANT_SUDO'"
  if ! is_root; then
    [[ $grant =~ ^(no|0)$ ]] ||
      warn "GRANT_SUDO=$grant needs a root start: started with --user, $NB_USER gets no sudo"
    return 0
  fi
  # The container's files outlive a restart: taken away at every start that does not ask.
  rm -f "$SUDOERS_FILE"
  [[ $grant =~ ^(yes|1)$ ]] || return 0
  command -v sudo >/dev/null || fatal "GRANT_SUDO=$grant: sudo is not installed in this image"
  install -d -m 750 /etc/sudoers.d
  tmp=$(mktemp /etc/sudoers.d/.tfmp.XXXXXX)
  printf '# Written by entrypoint.sh: GRANT_SUDO=%s\n%s ALL=(ALL) NOPASSWD:ALL\n' "$grant" "$NB_USER" >"$tmp"
  chmod 440 "$tmp"
  visudo -c -q -f "$tmp" >/dev/null || fatal "GRANT_SUDO: sudo refused the rule it was given (visudo -c)"
  mv -f "$tmp" "$SUDOERS_FILE"
  warn "GRANT_SUDO=$grant: $NB_USER may run any command as root with sudo, without a password"
}

chown_extra_refuse_user_path() { # $1 = the path as given, $2 = the path to judge
  if [[ $2 == "$USER_HOME" || $2 == "$USER_HOME"/* || $2 == "$WORKSPACE" || $2 == "$WORKSPACE"/* ]]; then
    fatal "CHOWN_EXTRA: '$1' is in $USER_HOME or $WORKSPACE, which the user owns already (and controls: root never walks there)"
  fi
}

chown_extra_refuse_above_user_path() { # $1 = the path as given, $2 = the path to judge
  if [[ $USER_HOME == "$2"/* || $WORKSPACE == "$2"/* ]]; then
    fatal "CHOWN_EXTRA: '$1' holds $USER_HOME or $WORKSPACE: the user could replace them with links that root's start then follows; allowed: a folder of your data beside them, e.g. a mounted /data"
  fi
}

chown_extra_refuse_system_path() { # $1 = the path as given, $2 = the real path
  local sys
  [[ ${GRANT_SUDO:-no} =~ ^(no|0)$ ]] || return 0   # root is the user's already: warned above
  for sys in "${CHOWN_EXTRA_SYSTEM[@]}"; do
    if [[ $2 == "$sys" || $2 == "$sys"/* || $sys == "$2"/* ]]; then
      fatal "CHOWN_EXTRA: '$1' is a system folder or holds one ($sys): owning it would let UID $NB_UID make itself root; allowed: a folder of your data, e.g. a mounted /data, or GRANT_SUDO=yes where root is meant"
    fi
  done
}

# Re-owns one judged folder, $1 (its real path), and only that folder: the path is
# walked once, by `cd -P`, and the folder then held as the working directory is the one
# changed (`chown .`), after the kernel's path of it (`pwd -P`) is checked to be $1.  A
# parent the user may write (a /data given earlier) could be swapped for a symlink to
# /usr/local between the judging and a chown by path, even with -h (which protects only
# the last component): root would re-own /usr/local/bin.  In a subshell, so root's own
# working directory stays.  $2... = chown's options (-R: links are re-owned themselves,
# none followed below).
chown_extra_folder() {
  local real=$1 held
  shift
  (
    cd -P -- "$real" 2>/dev/null ||
      fatal "CHOWN_EXTRA: '$real' is no longer a folder (it changed after it was checked): nothing was re-owned there"
    held=$(pwd -P)
    [[ $held == "$real" ]] ||
      fatal "CHOWN_EXTRA: '$real' changed after it was checked (it now leads to '$held', through a symlink in its path): nothing was re-owned there; allowed: a folder whose parents only root may change"
    chown -h "$@" -- "$NB_UID:$NB_GID" .
  )
}

chown_extra() {
  local opts=() path real list=()
  [[ -n ${CHOWN_EXTRA:-} ]] || return 0
  case ${CHOWN_EXTRA_OPTS:-} in
    "") ;;
    -R) opts=(-R) ;;
    *) fatal "CHOWN_EXTRA_OPTS may be -R (the folders' contents too) or unset. Received: CHOWN_EXTRA_OPTS='$CHOWN_EXTRA_OPTS'" ;;
  esac
  if ! is_root; then
    warn "CHOWN_EXTRA needs a root start: started with --user, nothing was re-owned"
    return 0
  fi
  IFS=',' read -ra list <<<"$CHOWN_EXTRA"
  # Every folder is judged before any is re-owned: a list refused at its third entry
  # changes nothing.
  local reals=()
  for path in "${list[@]}"; do
    path=${path#"${path%%[![:space:]]*}"} path=${path%"${path##*[![:space:]]}"}
    [[ -n $path ]] || continue
    [[ $path == /* ]] || fatal "CHOWN_EXTRA: '$path' is not an absolute path"
    # Decided on the path as given first: root does not even look below the home.
    chown_extra_refuse_user_path "$path" "$path"
    [[ -e $path ]] || fatal "CHOWN_EXTRA: '$path' does not exist in the container (mount it first)"
    real=$(realpath -e -- "$path")
    chown_extra_refuse_user_path "$path" "$real"
    if [[ $real != "${path%/}" && $real != "$path" ]]; then
      [[ /$path/ != */../* && /$path/ != */./* ]] ||
        fatal "CHOWN_EXTRA: '$path' holds '.' or '..' (it is '$real'): give the folder's plain path"
      fatal "CHOWN_EXTRA: '$path' goes through a symlink (to '$real'): give the real path"
    fi
    [[ $real != / ]] || fatal "CHOWN_EXTRA: '/' is refused"
    # Folders only: a file cannot be held open without following it, as a folder is by cd.
    [[ -d $real ]] || fatal "CHOWN_EXTRA: '$path' is not a folder; allowed: folders, e.g. a mounted /data"
    chown_extra_refuse_above_user_path "$path" "$real"
    chown_extra_refuse_system_path "$path" "$real"
    reals+=("$real")
  done
  for real in "${reals[@]}"; do
    chown_extra_folder "$real" "${opts[@]}" || exit
    info "CHOWN_EXTRA: $real now belongs to UID $NB_UID, GID $NB_GID${opts[*]:+ (with its contents)}"
  done
}

grant_sudo
chown_extra
