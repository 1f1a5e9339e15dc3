#!/usr/bin/env bash
# entrypoint.sh - start-up of the mixed-precision TensorFlow training image.
#
# Runs under tini (PID 1).  Starts as root only to prepare the container
# (user IDs, SSH keys, token), then every user-facing process runs as the
# unprivileged user `tf` (dropped with setpriv from util-linux); only sshd stays
# root, because it must switch to the logging-in user itself.
#
# Usage (the container's command):
#   (none) | serve [JUPYTER OPTIONS]
#                       sshd + Jupyter on 8888 (JupyterLab and the Notebook interface,
#                       root dir /workspace); if either dies the container exits non-zero.
#                       Options (--ServerApp.base_url=/x/ ...) go to the Jupyter server;
#                       started by JupyterHub the server is jupyterhub-singleuser.
#                       docker-stacks' start commands (start-notebook.py, start-notebook.sh,
#                       start-singleuser.py, start-singleuser.sh, jupyterhub-singleuser:
#                       KubeSpawner's default) are the same as `serve`; `start.sh CMD`
#                       is CMD
#   -h | --help | help  what follows, and exit
#   self-test [ARGS]    the image's own pytest on the shipped tests (GPU tests run
#                       when a GPU is visible); ARGS go to pytest
#   anything else       run as user tf, exit status passed through
#                       (e.g. `tfmp train ...`, `bash -lc '...'`); a tfmp command
#                       alone (`train ...`) is `tfmp train ...`
#
# This file is the core: it fits the user (UID/GID, home), then sources the parts
# by phase, each folder in name order:
#   $PARTS_DIR/always/  every mode: the environment for SSH and login shells, the
#                       banner, the persistent home
#   $PARTS_DIR/serve/   serve only: TLS, the Jupyter token and server, sshd, the
#                       guide notebooks, TensorBoard's folder
# then starts and supervises the services they registered, runs the self-test or
# execs the command.  A part's variables are listed once, in its "Environment:"
# block (docs/image.md's table is checked against those blocks).  Between the
# phases and just before the services or the command start, the user's own hooks
# run, as jupyter/docker-stacks runs them (/usr/local/bin/run-hooks.sh, sourced):
#   $HOOKS_DIR/start-notebook.d/   after the "always" parts
#   $HOOKS_DIR/before-notebook.d/  last, before the services or the command
# (not for self-test, which checks the image as shipped).
#
# Environment read here:
#   NB_UID, NB_GID       UID/GID for user tf (default 1000/1000).  Set them to
#                        your host's `id -u` / `id -g` so files written to mounted
#                        volumes are yours.  0 is refused.
#   TFMP_GPU_PROFILING   1: the user's processes keep CAP_SYS_ADMIN (ambient), which
#                        NVIDIA's driver asks of a GPU profiler (CUPTI) unless the host
#                        allows everyone; needs --cap-add SYS_ADMIN.  Default 0.
#   JUPYTER_ENV_VARS_TO_UNSET  names (separated by commas) removed from the environment
#                        after the hooks ran: the services, the command and SSH sessions
#                        never see them (docker-stacks' name; e.g. a secret only a hook needs)
#
# Started with `--user UID:GID` (no root), a UID without a passwd entry is named `tf`,
# home /home/tf, through nss_wrapper (LD_PRELOAD; setuid programs ignore it, so the name
# gives no rights): whoami, ~, pip --user and git work.  The image's home is writable by
# GID 0, as OpenShift's arbitrary UIDs run (--user UID:0); another GID gets a private
# HOME in /tmp, with a warning.
#
# What the parts may use (set here once, read-only before any part runs):
#   MODE                serve | self-test | command
#   SERVE_ARGS          the Jupyter options after `serve` (checked by serve/10-jupyter.sh)
#   NB_USER USER_HOME WORKSPACE  the user, its home, the Jupyter root folder
#   STATE_DIR           /run/tfmp: root's own (root:root 755) after a root start
#   NB_UID NB_GID       the user's IDs after remapping (or the --user IDs)
#   TOKEN_FILE          where the Jupyter server and the healthcheck read the token: root's
#                       $STATE_DIR/jupyter/token (group NB_GID may read), under $HOME when not root
#   HOME_TOKEN_FILE     the user's copy, ~/.jupyter/token (written as the user)
#   USER_CMD            prefix running a command as the user, without PRIVATE_VARS
#   HELPER_CMD          the same for the image's own programs the start runs as the user
#                       (tfmp-home, tfmp notebooks, ...): no user site, no secret (user_cmd)
#   PRIVATE_VARS        start-up secrets never passed to user processes
#   log/info/warn/fatal, is_root, has_cap, secret_from_env, refuse_user_path,
#   check_port_var NAME                                                (below)
#   service NAME LABEL HEALTH_JSON FUNCTION          register a supervised process
#   announce LINE                                    a "==>" line once services run
#   after_hooks FUNCTION                             run FUNCTION after the user's hooks
#
# Root at start never follows or writes a path the user controls (the home, the
# workspace): it does such things as the user (HELPER_CMD), or keeps its own files where
# the user cannot write (docs/image.md, "Security: root at start and the user's files";
# tests/image/test_static.py and test_home.py check it).
set -euo pipefail

# docker-stacks' NB_USER, if a start passed one, before the name is fixed (see stacks_not_read).
readonly REQUESTED_NB_USER=${NB_USER:-}
readonly NB_USER=tf
readonly USER_HOME=/home/tf
readonly WORKSPACE=/workspace
readonly STATE_DIR=/run/tfmp
readonly TESTS_ROOT=/opt/tfmp
readonly PARTS_DIR=/usr/local/lib/tfmp/start
# docker-stacks' folders for a user's own start-up hooks (root's; an image built FROM
# this one, or a read-only mount, puts files there).
readonly HOOKS_DIR=/usr/local/bin
readonly RUN_HOOKS=/usr/local/bin/run-hooks.sh
# tfmp's commands (app/commands/__init__.py's COMMANDS; tests/image/test_static.py checks
# the two agree): `docker run IMAGE train ...` is `tfmp train ...`, as a training container's
# command is in SageMaker's convention.
readonly TFMP_COMMANDS=(train env benchmark notebooks check tune)
# Start-up secrets and internal variables: never passed to user processes.
readonly PRIVATE_VARS=(JUPYTER_TOKEN SSH_PASSWORD PUBLIC_KEY TFMP_JUPYTER_TOKEN_PATH)
# JupyterHub's token for the single-user server: the server needs it, no start helper does.
readonly SERVER_SECRETS=(JUPYTERHUB_API_TOKEN JPY_API_TOKEN)

log() { printf '%s [entrypoint] %-5s %s\n' "$(date -u +%H:%M:%S)" "$1" "$2" >&2; }
info() { log INFO "$*"; }
warn() { log WARN "$*"; }
fatal() {
  log FATAL "$*"
  exit 64
}

is_root() { [[ $(id -u) -eq 0 ]]; }

# --- hardened starts: dropped capabilities, a read-only root --------------------------

# The names of capabilities (linux/capability.h) that the effective set $1 (CapEff of
# /proc/<pid>/status: hex) lacks, of those named after it, separated by spaces.  Decoded
# here: capsh is not in every image built on this one.
caps_missing() {
  local -A bit=([CHOWN]=0 [DAC_OVERRIDE]=1 [DAC_READ_SEARCH]=2 [FOWNER]=3 [KILL]=5
    [SETGID]=6 [SETUID]=7 [NET_BIND_SERVICE]=10 [SYS_CHROOT]=18 [SYS_ADMIN]=21)
  local set=$1 name missing=()
  [[ $set =~ ^[0-9a-fA-F]{1,16}$ ]] || set=0
  shift
  for name in "$@"; do
    (((16#$set >> bit[$name]) & 1)) || missing+=("$name")
  done
  printf '%s' "${missing[*]}"
}

# has_cap NAME: whether the root start holds capability NAME (for the parts: SSH asks for
# SYS_CHROOT).  A --user start holds none and asks for none.
CAP_EFF=0
has_cap() { [[ -z $(caps_missing "$CAP_EFF" "$1") ]]; }

# A root start with capabilities dropped (--cap-drop ALL, a Kubernetes securityContext)
# failed half-way with a tool's "Operation not permitted", or misjudged what it could not
# read (a home of another UID looked empty, or mounted by someone else).  Checked once,
# before any change.  The start needs CHOWN (/run/tfmp, a home and a workspace handed to
# NB_UID), DAC_OVERRIDE (to look into a home or workspace of another UID; DAC_READ_SEARCH
# does as well) and SETUID, SETGID (setpriv: everything the user runs).  Without KILL its
# SIGTERM never reaches the user's jobs at `docker stop` (root signalling another UID), and
# without SYS_CHROOT sshd refuses every login (serve/20-ssh.sh): the start goes on, warned.
check_capabilities() {
  local missing
  is_root || return 0
  CAP_EFF=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  readonly CAP_EFF
  missing=$(caps_missing "$CAP_EFF" CHOWN DAC_OVERRIDE SETUID SETGID)
  if [[ $missing == *DAC_OVERRIDE* ]] && has_cap DAC_READ_SEARCH; then
    missing=$(caps_missing "$CAP_EFF" CHOWN SETUID SETGID)
  fi
  if [[ -n $missing ]]; then
    fatal "started as root without the capabilities $missing (--cap-drop): the start hands /run/tfmp, the home and the workspace to NB_UID (CHOWN), looks into folders of other UIDs (DAC_OVERRIDE) and runs everything as the user $NB_USER (SETUID, SETGID); allowed: --cap-add ${missing// / --cap-add } (docs/image.md, \"Hardened starts\"), or --user UID:GID, a start without root, which needs none"
  fi
  if ! has_cap KILL; then
    warn "no KILL capability (--cap-drop): at docker stop the user's jobs get no SIGTERM from the start, so tfmp train saves no checkpoint and is killed at the stop timeout; add --cap-add KILL"
  fi
}

# Whether / is mounted read-only (--read-only): the options of mount point / in mountinfo.
root_fs_read_only() {
  awk '$5 == "/" { n = split($6, o, ","); for (i = 1; i <= n; i++) if (o[i] == "ro") ro = 1 }
    END { exit !ro }' /proc/self/mountinfo
}

# A read-only root (--read-only) stopped a root start at its first write with a tool's own
# error (groupmod, chown, mktemp) and odd exit codes.  A root start writes /etc (the user's
# IDs, the sessions' environment, sudo and SSH settings): refused, before any change.  A
# --user start writes only $STATE_DIR and /tmp (a private HOME, Jupyter's runtime files):
# refused when either is not writable, naming the tmpfs to add.
check_root_fs() {
  local dir missing=()
  root_fs_read_only || return 0
  if is_root; then
    fatal "the root file system is read-only (--read-only) and a root start writes /etc (the user's IDs, SSH) and $STATE_DIR; allowed: --read-only with --user UID:GID (a start without root), --tmpfs $STATE_DIR --tmpfs /tmp, and volumes for $USER_HOME and $WORKSPACE (docs/image.md, \"Hardened starts\")"
  fi
  for dir in "$STATE_DIR" /tmp; do
    [[ -d $dir && -w $dir ]] || missing+=("--tmpfs $dir")
  done
  if ((${#missing[@]})); then
    fatal "the root file system is read-only (--read-only) and a start with --user writes $STATE_DIR and /tmp; add ${missing[*]} (docs/image.md, \"Hardened starts\")"
  fi
}

# A file root reads at start (a secret, a key, a certificate) must not be one the user
# controls: in the home or the workspace the user could make it a link to /etc/shadow or an
# SSH host key between starts.  Checked on the path as given and as resolved; --user
# starts read as the user anyway.  $1 = variable name holding a path.
refuse_user_path() {
  local var=$1 path=${!1} real dir
  is_root || return 0
  real=$(realpath -m -- "$path")
  for dir in "$USER_HOME" "$WORKSPACE"; do
    if [[ $path == "$dir"/* || $real == "$dir"/* ]]; then
      fatal "$var='$path' is in $dir, which the user controls, and root reads it at start: mount it elsewhere (e.g. under /run/secrets or /certs)"
    fi
  done
}

read_secret_file() { # $1 = variable name holding a path
  local var=$1 path=${!1} value
  refuse_user_path "$var"
  [[ -f $path && -r $path ]] || fatal "$var='$path' is not a readable file"
  # One line, its line ending dropped (\n, or \r\n from a Windows editor); two lines were
  # joined into one secret that neither line is.
  value=$(<"$path")
  value=${value%$'\r'}
  [[ $value != *$'\n'* ]] || fatal "$var='$path' holds more than one line; allowed: the secret alone, on one line"
  printf '%s' "$value"
}

# $1 = a variable holding a TCP port (unset or empty: not given).  The host ports are only
# shown in the start-up lines, and were shown as given: `ssh -p -1 ...`.
check_port_var() {
  local value=${!1:-}
  [[ -z $value ]] && return 0
  if [[ $value =~ ^[1-9][0-9]{0,4}$ ]] && ((value <= 65535)); then return 0; fi
  fatal "$1 must be a port number (1-65535). Received: $1='$value'"
}

# A secret from NAME or NAME_FILE (e.g. a Docker secret); prints "" when neither is set.
# $1 = NAME, $2 = why an empty value is refused.  Call as `v=$(secret_from_env ...)`:
# a fatal in the subshell fails the assignment, and set -e stops the script.
secret_from_env() {
  local name=$1 why=$2 file_var="${1}_FILE" value=""
  # Set but empty is a mistake, as for $name itself and PUBLIC_KEY_FILE: never read as unset.
  if [[ ${!file_var+set} == set && -z ${!file_var} ]]; then
    fatal "$file_var is set but empty; unset it or give the path of a file holding $name"
  fi
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
  # Given (not empty): the home the image made may be handed to these IDs (fit_home).
  NB_IDS_GIVEN=no
  [[ -z ${NB_UID:-}${NB_GID:-} ]] || NB_IDS_GIVEN=yes
  NB_UID=${NB_UID:-1000}
  NB_GID=${NB_GID:-1000}
  [[ $NB_UID =~ ^[0-9]+$ ]] || fatal "NB_UID must be a number (your host's \`id -u\`). Received: NB_UID='$NB_UID'"
  [[ $NB_GID =~ ^[0-9]+$ ]] || fatal "NB_GID must be a number (your host's \`id -g\`). Received: NB_GID='$NB_GID'"
  # Compared as text first: bash arithmetic reads 08 as bad octal and wraps 2**64 to 0.
  [[ $NB_UID =~ ^0+$ ]] && fatal "NB_UID=0 is refused: the user must not be root; allowed: your host user's \`id -u\`, or, where that is root (0), the UID of a regular user who should own the files (e.g. 1000), or no NB_UID (the image's user, UID 1000)"
  id_in_range NB_UID "$NB_UID" "id -u"
  id_in_range NB_GID "$NB_GID" "id -g"
  NB_UID=$((10#$NB_UID)) NB_GID=$((10#$NB_GID))
}

# $1 = name, $2 = digits, $3 = the host command that prints it.  Linux IDs are 32-bit, and
# 4294967295 is (uid_t)-1, "no ID"; leading zeros are dropped.
id_in_range() {
  local digits=${2#"${2%%[!0]*}"}
  if ((${#digits} > 10)) || ((10#${digits:-0} > 4294967294)); then
    fatal "$1 must be at most 4294967294 (your host's \`$3\`). Received: $1='$2'"
  fi
}

remap_user() {
  local cur_uid cur_gid
  cur_uid=$(id -u "$NB_USER")
  cur_gid=$(id -g "$NB_USER")
  if [[ $NB_GID != "$cur_gid" ]]; then
    refuse_privileged_gid
    groupmod -o -g "$NB_GID" "$NB_USER"
    info "group $NB_USER now has GID $NB_GID"
  fi
  if [[ $NB_UID != "$cur_uid" ]]; then
    # `usermod -u` alone also re-owns, by path, every file of the old UID in the home
    # whenever the home's top belongs to the old or the new UID: a bind-mounted host
    # folder included.  Pointed at a home that does not exist it touches no file;
    # fit_home decides about the home.
    usermod -o -u "$NB_UID" -d /nonexistent "$NB_USER"
    usermod -d "$USER_HOME" "$NB_USER"
    info "user $NB_USER now has UID $NB_UID"
  fi
  fit_home
  # Only the top of the workspace, and only if the user could not write there and it is
  # root's (a fresh bind mount Docker created, or a folder of a host user who is root,
  # whose files a container user other than root must be able to add to), the image's own
  # (Dockerfile: tf, UID 1000, group 0; a new named volume is a copy of it), or NB_UID was
  # given (a volume an earlier NB_UID used, as the home).  Without IDs given, a folder of
  # another user is theirs: refused, not taken, before anything changed.
  if ! setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups test -w "$WORKSPACE"; then
    local why owner
    owner=$(stat -c %u:%g "$WORKSPACE")
    if [[ ${owner%:*} != 0 && $owner != 1000:0 && $NB_IDS_GIVEN != yes ]]; then
      fatal "the workspace $WORKSPACE belongs to UID ${owner%:*}, not NB_UID=$NB_UID, and UID $NB_UID may not write there: set $(ids_advice "${owner%:*}" "${owner#*:}"), or mount a folder of UID $NB_UID; a folder of another user is never re-owned"
    fi
    if why=$(chown "$NB_UID:$NB_GID" "$WORKSPACE" 2>&1); then
      info "made $WORKSPACE writable for UID $NB_UID (top directory only)"
      # What an earlier UID made there (the guide notebooks, runs) stays that UID's.
      if [[ ${owner%:*} != 0 && ${owner%:*} != "$NB_UID" ]] &&
        [[ -n $(find "$WORKSPACE" -mindepth 1 -maxdepth 1 -uid "${owner%:*}" -print -quit) ]]; then
        warn "what is below $WORKSPACE keeps its owner, UID ${owner%:*} (the workspace's before): UID $NB_UID may not change it; to hand it over, as root: chown -R --from=${owner%:*} $NB_UID:$NB_GID $WORKSPACE (docs/image.md, \"Files in mounted folders belong to you\")"
      fi
    else
      # A read-only mount (-v DIR:/workspace:ro) is a choice: commands that write elsewhere
      # (--output /tmp/run, a notebook saved outside) still run.
      warn "$WORKSPACE is not writable by UID $NB_UID and cannot be made so (${why##*: }): what is saved there fails; mount it read-write, or give --output (TFMP_OUTPUT) another folder"
    fi
  fi
}

# NB_GID makes the user a member of that GID, and `groupmod -o` shares it with whatever
# group of the image has it: sudo (27) with an SSH_PASSWORD would give root, shadow (42)
# /etc/shadow, adm and utmp the logs, 0 root's files.  Refused is a GID whose members may
# do with a system file what others may not (read, write or run it: find's test below), or
# that a sudo rule names (%name, %#GID), device nodes and the terminals' group included
# (tty: writing to root's terminal); none of the image's other groups (users, 100, as
# docker-stacks' NB_GID; dialout, 20, as a Mac's staff) gives anything.  Looked for at
# start, not listed at build: an image built FROM this one adds files and rules of its own.
refuse_privileged_gid() {
  local what name
  what=$(privileged_gid "$NB_GID") || return 0
  name=$(getent group "$NB_GID" | cut -d: -f1) || true
  [[ -z $name ]] || name=" '$name'"
  fatal "NB_GID=$NB_GID is the image's group$name, which $what: the user would get them; allowed: your host's \`id -g\` when it is not such a group, else another GID (e.g. 1000; files in mounted folders then take it)"
}

# The judgement of refuse_privileged_gid, for GID $1: prints what the group gives and
# succeeds when it is refused; fails for a GID that gives nothing.  Also asked before a FATAL
# advises the IDs of a mounted folder's owner (ids_advice): its advice is never a GID the
# start refuses.
privileged_gid() {
  local gid=$1 name file rule terminals
  # find's test: the group may read, write or run it and others may not.
  local rights=(-group "$gid" ! -type l \( \( -perm -g+r ! -perm -o+r \) -o
    \( -perm -g+w ! -perm -o+w \) -o \( -perm -g+x ! -perm -o+x \) \))
  name=$(getent group "$gid" | cut -d: -f1) || true
  local mounted=()
  mapfile -t mounted < <(mounts_below /)
  file=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path "$USER_HOME" \
    -o -path "$WORKSPACE" "${mounted[@]}" \) -prune -o "${rights[@]}" -print -quit \
    2>/dev/null) || true
  # Device nodes too (a disk given with --device, /dev/console under -t), and the group of
  # every terminal made later (devpts' gid=, tty): an admin's `docker exec -it` as root is a
  # /dev/pts node of mode 620 the group may write escape sequences and false output to.
  [[ -n $file ]] || file=$(find /dev "${rights[@]}" -print -quit 2>/dev/null) || true
  terminals=$(awk '$3 == "devpts" { n = split($4, o, ",")
    for (i = 1; i <= n; i++) if (o[i] ~ /^gid=/) { print substr(o[i], 5); exit } }' /proc/mounts) || true
  rule=$(grep -shE "^[[:space:]]*%(#$gid${name:+|$name})[[:space:]]" /etc/sudoers \
    /etc/sudoers.d/* | head -n 1) || true
  [[ -z $file && -z $rule && $terminals != "$gid" ]] && return 1
  local what="gives rights others lack on $file"
  [[ $terminals != "$gid" ]] || what="gives rights others lack on every terminal (/dev/pts, gid=$gid: an admin's docker exec -it among them)"
  [[ -z $rule ]] || what="a sudo rule names"
  printf '%s' "$what"
}

# The settings that make a folder of UID $1, GID $2 the user's, for a FATAL's advice:
# "NB_UID=U (and NB_GID=G)", or NB_UID alone when G is a group the start refuses as NB_GID
# (root's 0, shadow, ...): that advice was followed by a second FATAL.  The user then
# keeps a GID of its own, and the folder its group (fit_home uses it as it is).
ids_advice() {
  local name
  if ! privileged_gid "$2" >/dev/null; then
    printf 'NB_UID=%s (and NB_GID=%s)' "$1" "$2"
    return 0
  fi
  name=$(getent group "$2" | cut -d: -f1) || true
  [[ -z $name ]] || name=" '$name'"
  printf "NB_UID=%s with an NB_GID of your own (not %s, the folder's group%s, which NB_GID may not be)" \
    "$1" "$2" "$name"
}

# Every mount point of the kernel's table, decoded, NUL-terminated: mountinfo writes a space,
# tab, newline and backslash as octal escapes (a volume on "/home/tf/my data" is
# "/home/tf/my\040data" there).  The one reader of the table's mount points: the
# privileged-group search, the home's re-owning walk and the --user home check use it.
mount_points() {
  local point
  while read -r _ _ _ _ point _; do
    printf '%b\0' "$point"
  done </proc/self/mountinfo
}

is_mount_point() {
  local point
  while IFS= read -r -d '' point; do
    [[ $point == "$1" ]] && return 0
  done < <(mount_points)
  return 1
}

# find's "-o -path POINT" for every mount point below folder $1 (for "/", every one but /
# itself), one argument a line (in pairs, for mapfile -t), a glob character in a path
# escaped for -path.  Below the home, what is mounted (a data folder, an authorized_keys
# file) is not the home's; below /, what the admin mounted (-v DATA:/data, Docker's
# /etc/hosts) is not the image's: a host folder of the user's own group with rights only
# that group has (mode 750, umask 027) is what NB_GID=$(id -g) is for, and -xdev keeps find
# out of a mount but still judged its top.
mounts_below() {
  local top=${1%/}/ point
  while IFS= read -r -d '' point; do
    [[ $point != "$top" && $point == "$top"* ]] || continue
    point=${point//\\/\\\\}; point=${point//\*/\\*}; point=${point//\?/\\?}
    point=${point//\[/\\[}
    printf '%s\n' -o -path "$point"
  done < <(mount_points)
}

# The home's owner, when it is not NB_UID:NB_GID.  Everything below $USER_HOME is the
# user's to change (symlinks, hard links, a file swapped at any moment), so root looks
# only at the top (a mount point or the image's folder in root's /home: the user cannot
# replace it) and never opens a path below it (docs/image.md, "Security").
#
# Which homes may be re-owned: only one the image made.  Docker copies the image's
# /home/tf into a named volume when the volume is new, and a bind mount gets nothing,
# so the image carries $HOME_MARKER ("UID:GID" of the owner the image gave the home)
# and every re-owning rewrites it, as the new user.  A home whose top owner is the
# owner its marker names is the image's (a fresh volume, or one re-owned earlier);
# anything else that is not NB_UID's is a folder someone mounted, on a shared server
# usually another person's: refused, never re-owned.  Why a marker and not the mount
# table: a named volume and a bind mount look alike from inside (both are bind mounts
# of a host folder; only the folder's path differs, and that depends on the engine's
# data root and volume driver).  Copying a whole home (hidden files too) copies the
# marker: such a copy is treated as the image's, as the home it was copied from was.
# The marker is read as the home's owner, who may write it anyway: it can only claim
# the home is its own, which the owner check already needs.
#
# The re-owning itself (reown_home): no symlink followed (a link is re-owned itself), and
# `--from` re-owns only what the old UID (GID) owns, so a hard link in the home to a file
# of root's (or anyone's) keeps its owner.  No process of the user runs in this container
# yet (a restart ends them all); one in another container that mounts the same volume
# cannot lead the walk out of the home either (reown_home).
readonly HOME_MARKER=.local/state/tfmp/home-owner

# The re-owning walk: $1 = the old UID, $2 = the old GID (the home's top's).  The old UID's
# files get the new UID and the new GID whatever their group: the top's GID is not the one
# the old user wrote with (the image's home is group 0, a user's files have its NB_GID), and
# `--from=:TOP'S GID` left every file the user made in the old group.  Then what else has the
# old GID gets the new one (owner and group, docs/image.md).  find stays on the home's file
# system (what is mounted below the home, a host's folder, is not walked), follows no link,
# and -execdir hands chown a name in the folder it holds (./NAME, never a path through a
# folder that could be swapped); chown's own --from re-checks the owner at the change.
# Mounts below the home (an authorized_keys file, a data folder) are left as they are.
# find's PATH is the system's own: -execdir refuses to run with a relative PATH entry (the
# walk would then be skipped without a word), and root looks in no folder the user can write.
reown_home() {
  local old_uid=$1 old_gid=$2 path=/usr/sbin:/usr/bin:/sbin:/bin mounts=()
  # Mounts below the home: a volume or host folder mounted there is usually on the same
  # disk as the home (-xdev alone would walk it), and is not the image's.
  mapfile -t mounts < <(mounts_below "$USER_HOME")
  env PATH="$path" find "$USER_HOME" -xdev \( -false "${mounts[@]}" \) -prune -o -uid "$old_uid" \
    -execdir chown -h --from="$old_uid" "$NB_UID:$NB_GID" -- {} + 2>/dev/null || true
  env PATH="$path" find "$USER_HOME" -xdev \( -false "${mounts[@]}" \) -prune -o -gid "$old_gid" \
    -execdir chown -h --from=":$old_gid" ":$NB_GID" -- {} + 2>/dev/null || true
}

fit_home() {
  local owner old_uid old_gid marker=""
  owner=$(stat -c %u:%g "$USER_HOME")
  [[ $owner != "$NB_UID:$NB_GID" ]] || return 0
  old_uid=${owner%:*} old_gid=${owner#*:}
  # The image's own home for this UID: group 0 (for --user UID:0 starts, which have GID 0),
  # which the user, its owner, needs no change of; used as it is, without a walk or a word.
  if [[ $old_uid == "$NB_UID" && $old_gid == 0 ]] &&
    [[ $(setpriv --reuid="$old_uid" --regid="$old_gid" --clear-groups \
      head -c 64 -- "$USER_HOME/$HOME_MARKER" 2>/dev/null || true) == "$owner" ]]; then
    return 0
  fi
  if [[ -z $(find "$USER_HOME" -mindepth 1 -maxdepth 1 -print -quit) ]]; then
    # Empty (a bind mount Docker created for a missing host folder, as root): nothing
    # to hand over but the folder itself; 07-home.sh then fills it as the user.
    chown "$NB_UID:$NB_GID" "$USER_HOME"
    info "made the empty home $USER_HOME the home of UID $NB_UID, GID $NB_GID"
    return 0
  fi
  if [[ $old_uid != 0 ]]; then
    marker=$(setpriv --reuid="$old_uid" --regid="$old_gid" --clear-groups \
      head -c 64 -- "$USER_HOME/$HOME_MARKER" 2>/dev/null || true)
  fi
  if [[ $marker != "$owner" ]]; then
    if [[ $old_uid == "$NB_UID" ]]; then
      info "the home $USER_HOME has GID $old_gid, not NB_GID=$NB_GID: used as it is (a folder you mounted is never re-owned)"
      return 0
    fi
    fatal "the home $USER_HOME belongs to UID $old_uid, not NB_UID=$NB_UID: set $(ids_advice "$old_uid" "$old_gid") or mount a folder of UID $NB_UID; a folder you mounted is never re-owned"
  fi
  # Re-owned only for IDs given: a job started without them (UID 1000) that mounts the home
  # volume of a stack running as another UID would take the home from under that stack.
  if [[ $NB_IDS_GIVEN != yes ]]; then
    fatal "the home $USER_HOME belongs to UID $old_uid (GID $old_gid) and no NB_UID was given: set NB_UID=$old_uid and NB_GID=$old_gid to use it as it is, or the IDs it should have from now on (the image's home is then re-owned for them)"
  fi
  reown_home "$old_uid" "$old_gid"
  # shellcheck disable=SC2016  # expanded by the user's shell
  setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups \
    sh -c 'mkdir -p "$(dirname "$1")" && printf "%s\n" "$2" >"$1"' sh \
    "$USER_HOME/$HOME_MARKER" "$NB_UID:$NB_GID" 2>/dev/null ||
    warn "could not record the home's new owner in $USER_HOME/$HOME_MARKER (as UID $NB_UID)"
  info "re-owned $USER_HOME for UID $NB_UID, GID $NB_GID (it was the image's, of UID $old_uid)"
}

# Root's state at start, in $STATE_DIR: the healthcheck's list, the token the server and
# the healthcheck read, the server's certificate.  The image makes it writable by
# everyone (a --user start needs it) and the container's files outlive a restart, so a
# root start first takes it back (root:root 755: no one else can add an entry any more),
# then removes whatever the last run left (find -delete follows no symlink).
take_state_dir() {
  chown root:root "$STATE_DIR"
  chmod 755 "$STATE_DIR"
  find "$STATE_DIR" -mindepth 1 -delete
}

# TFMP_GPU_PROFILING=1: CAP_SYS_ADMIN stays with the user (setpriv's ambient set), so
# TensorFlow's profiler may read the GPU's kernels through CUPTI where the driver lets only
# administrators (RmProfilingAdminOnly: 1).  It is root's power inside the container: opt-in,
# and only when the container was given the capability.
check_gpu_profiling() {
  local bounding
  [[ ${TFMP_GPU_PROFILING:-0} =~ ^[01]$ ]] \
    || fatal "TFMP_GPU_PROFILING must be 1 or 0. Received: TFMP_GPU_PROFILING='${TFMP_GPU_PROFILING}'"
  [[ ${TFMP_GPU_PROFILING:-0} == 1 ]] || return 0
  is_root || fatal "TFMP_GPU_PROFILING=1 needs the container to start as root (no --user): it keeps CAP_SYS_ADMIN for the user tf"
  bounding=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  (((16#${bounding:-0} >> 21) & 1)) \
    || fatal "TFMP_GPU_PROFILING=1 needs CAP_SYS_ADMIN in the container: start it with --cap-add SYS_ADMIN (compose: cap_add: [SYS_ADMIN])"
  warn "TFMP_GPU_PROFILING=1: the user tf holds CAP_SYS_ADMIN (root's power inside the container) for GPU profiling"
}

# The PATH of the user's sessions: the container's, after `pip install --user`'s scripts
# (~/.local/bin), as Debian's ~/.profile puts them for login shells; so `ssh host cmd`, a
# kernel's `!cmd` and a job find them too.  Given to the services and the job (and SSH
# sessions' SetEnv; login shells other than root's add it in profile-container-env.sh), not
# to USER_CMD or HELPER_CMD themselves: the start-up's own commands as the user, whose
# results root reads, and root's own PATH (at start, and in `docker exec` shells, login or
# not) never look in a folder the user can write.
user_path() {
  local bin=$USER_HOME/.local/bin   # text only: root never looks in it
  case ":$PATH:" in
    *":$bin:"*) printf '%s' "$PATH" ;;
    *) printf '%s' "$bin:$PATH" ;;
  esac
}

# Prints USER_CMD, NUL-separated: the prefix that runs a command as the unprivileged
# user with a clean identity (setpriv from util-linux: no extra package, no setuid binary).
# With "helper": HELPER_CMD, for the image's own programs the root start runs as the user,
# whose results root reads (tfmp-home, tfmp notebooks, tfmp-tensorboard --check, tfmp-tls).
# They run before the hooks and the unset, and the user's own code must not run in them: a
# .pth file or usercustomize in the user site (~/.local/lib/python3.X/site-packages, on the
# home volume) would see every secret the start holds, and could leave a process racing
# root's later steps.  So: no user site (PYTHONNOUSERSITE, whatever starts Python), none of
# JUPYTER_ENV_VARS_TO_UNSET's variables nor the hub's token, and no GPU-profiling capability.
user_cmd() {
  local name purpose=${1:-session}
  if is_root; then
    printf '%s\0' setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups
    if [[ ${TFMP_GPU_PROFILING:-0} == 1 && $purpose != helper ]]; then
      printf '%s\0' --inh-caps=+sys_admin --ambient-caps=+sys_admin
    fi
  fi
  printf '%s\0' env
  for name in "${PRIVATE_VARS[@]}"; do printf '%s\0' -u "$name"; done
  if [[ $purpose == helper ]]; then
    for name in "${UNSET_VARS[@]}" JUPYTER_ENV_VARS_TO_UNSET "${SERVER_SECRETS[@]}"; do
      printf '%s\0' -u "$name"
    done
  fi
  if is_root; then printf '%s\0' HOME="$USER_HOME" USER="$NB_USER" LOGNAME="$NB_USER" SHELL=/bin/bash; fi
  if [[ $purpose == helper ]]; then printf '%s\0' PYTHONNOUSERSITE=1; fi
}

# --- services the parts register, supervised in serve mode ---------------------------

SERVICE_KEYS=() SERVICE_LABELS=() SERVICE_HEALTH=() SERVICE_STARTERS=() ANNOUNCEMENTS=()

# $1 = key in $STATE_DIR/services (the healthcheck's list), $2 = name in messages,
# $3 = that key's JSON value for the healthcheck, $4 = a function that execs the process.
service() {
  SERVICE_KEYS+=("$1") SERVICE_LABELS+=("$2") SERVICE_HEALTH+=("$3") SERVICE_STARTERS+=("$4")
}

announce() { ANNOUNCEMENTS+=("$*"); }

# $1 = a function the core runs once the user's hooks ran and JUPYTER_ENV_VARS_TO_UNSET was
# applied, before the services or the command start (in the order registered): what must
# see the start's final environment, a hook's exports included.
AFTER_HOOKS=()
after_hooks() { AFTER_HOOKS+=("$1"); }

# A `docker stop` reaches PID 1 alone, and when it exits every process left is killed: a
# `tfmp train` started over SSH, in a terminal or a kernel would lose its epoch and leave
# metrics.json "running".  So the user's own processes (a terminal's job too, not the shell
# itself) get the SIGTERM first (train saves a checkpoint on it) and up to STOP_WAIT seconds
# to end, before the services stop; Docker's
# stop timeout (compose: stop_grace_period) still bounds the whole.  $@ = the services' PIDs,
# stopped after (the Jupyter server ends its kernels itself).
readonly STOP_WAIT=50
stop_user_processes() {
  local services=" $* " mine=() pid parent waited=0
  user_processes() {
    mine=()
    for pid in $(pgrep -u "$NB_UID" 2>/dev/null); do
      # Not the entrypoint and its parents (a --user start runs them as this UID too), the
      # services, nor what a service runs itself (kernels, terminals' shells: Jupyter's own
      # shutdown ends them, and would restart a kernel that died before it).
      [[ $pid != "$$" && $pid != 1 && $pid != "$PPID" && $services != *" $pid "* ]] || continue
      parent=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') || continue
      [[ -n $parent && $services != *" $parent "* ]] || continue
      mine+=("$pid")
    done
  }
  user_processes
  ((${#mine[@]})) || return 0
  info "sending SIGTERM to ${#mine[@]} process(es) of UID $NB_UID (jobs started over SSH, in terminals or kernels save their checkpoints); waiting up to ${STOP_WAIT} s"
  kill -TERM "${mine[@]}" 2>/dev/null || true
  while ((waited < STOP_WAIT * 4)); do
    user_processes
    ((${#mine[@]})) || return 0
    sleep 0.25
    waited=$((waited + 1))
  done
  warn "${#mine[@]} process(es) of UID $NB_UID still running after ${STOP_WAIT} s: stopping anyway"
}

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
    stop_user_processes "${pids[@]}"
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
  # -o addopts: pyproject's options without its "-n 2 --dist loadgroup" (the image has no
  # pytest-xdist; one process also keeps a GPU box's GPU to one test at a time).
  exec "${USER_CMD[@]}" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -p no:cacheprovider -o "addopts=-ra --strict-markers" -q \
    --image-self-test "${suites[@]}" "$@"
}

# Sources every part of a phase ($PARTS_DIR/$1/*.sh) in name order.
source_parts() {
  local part
  for part in "$PARTS_DIR/$1"/*.sh; do
    # shellcheck source=/dev/null  # each part is checked on its own (tests/image/test_static.py)
    source "$part"
  done
}

# A user's hooks in $HOOKS_DIR/$1, by docker-stacks' run-hooks.sh (the one place hooks are
# run; docker/bin/run-hooks.sh): *.sh sourced, executables run, a failure logged.
run_hooks() {
  local dir=$HOOKS_DIR/$1 entries
  [[ -d $dir ]] || return 0
  # An empty folder (the image's own) says nothing: a batch job's log stays as it was.
  entries=("$dir"/*)
  [[ -e ${entries[0]} ]] || return 0
  # shellcheck source=docker/bin/run-hooks.sh
  source "$RUN_HOOKS" "$dir"
}

# JUPYTER_ENV_VARS_TO_UNSET, checked: the names, one per element.
UNSET_VARS=()
check_unset_vars() {
  local name
  [[ -n ${JUPYTER_ENV_VARS_TO_UNSET:-} ]] || return 0
  IFS=', ' read -ra UNSET_VARS <<<"$JUPYTER_ENV_VARS_TO_UNSET"
  for name in "${UNSET_VARS[@]}"; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
      fatal "JUPYTER_ENV_VARS_TO_UNSET must name variables, separated by commas. Received: '$name' in JUPYTER_ENV_VARS_TO_UNSET='$JUPYTER_ENV_VARS_TO_UNSET'"
  done
}

unset_vars() {
  local name
  for name in "${UNSET_VARS[@]}"; do
    [[ ${!name+set} == set ]] || continue
    if (unset "$name") 2>/dev/null; then
      unset "$name"
      info "unset $name (JUPYTER_ENV_VARS_TO_UNSET)"
    else
      warn "JUPYTER_ENV_VARS_TO_UNSET: $name is the entrypoint's own and stays"
    fi
  done
  unset JUPYTER_ENV_VARS_TO_UNSET
}

# docker-stacks' settings this image does not read: one WARN line each, with the reason
# (docs/image.md, "Coming from docker-stacks"), rather than a setting silently ignored.
stacks_not_read() {
  local name why
  if [[ -n $REQUESTED_NB_USER && $REQUESTED_NB_USER != "$NB_USER" ]]; then
    warn "NB_USER='$REQUESTED_NB_USER' is not read here: the user is always $NB_USER (home $USER_HOME); NB_UID/NB_GID give it your IDs"
  fi
  for name in NB_GROUP CHOWN_HOME CHOWN_HOME_OPTS DOCKER_STACKS_JUPYTER_CMD RESTARTABLE; do
    [[ -n ${!name:-} ]] || continue
    case $name in
      NB_GROUP) why="the group is $NB_USER's own, with NB_GID" ;;
      CHOWN_HOME*) why="a home the image made is re-owned for a new NB_UID by itself, one you mounted never" ;;
      DOCKER_STACKS_JUPYTER_CMD) why="the server is JupyterLab's with the Notebook interface beside it; JUPYTER_UI=notebook picks the landing page" ;;
      RESTARTABLE) why="a server that stops stops the container: use Docker's restart policy" ;;
    esac
    warn "$name is docker-stacks' and not read here: $why"
  done
}

# A --user start whose UID has no passwd entry (OpenShift, a Kubernetes runAsUser): the name
# tf and the home /home/tf for this container's processes, from a passwd file of its own
# read through nss_wrapper.  Not by writing /etc/passwd (docker-stacks makes it writable by
# GID 0): a user who may write /etc/passwd may give an account UID 0 and a password, and
# su or sudo, which trust it, make them root.  LD_PRELOAD is ignored by setuid programs.
name_unknown_uid() {
  local dir=$STATE_DIR/nss-$NB_UID lib
  id -un >/dev/null 2>&1 && return 0
  # awk reads to the end: an early exit would end ldconfig with SIGPIPE (status 141 under
  # pipefail, and set -e would stop the start without a word).
  lib=$(ldconfig -p 2>/dev/null | awk '$1 == "libnss_wrapper.so" && !found {print $NF; found = 1}')
  if [[ -z $lib ]]; then
    warn "UID $NB_UID has no entry in /etc/passwd and nss_wrapper is missing: whoami and git will fail"
    return 0
  fi
  if ! install -d -m 700 "$dir" 2>/dev/null || [[ ! -O $dir ]]; then
    fatal "$dir is not a folder of UID $NB_UID: it holds the passwd entry of this UID"
  fi
  sed -e "s/^$NB_USER:/$NB_USER-image:/" /etc/passwd >"$dir/passwd"
  printf '%s:x:%s:%s:%s:%s:/bin/bash\n' "$NB_USER" "$NB_UID" "$NB_GID" "$NB_USER" "$USER_HOME" >>"$dir/passwd"
  cp /etc/group "$dir/group"
  getent group "$NB_GID" >/dev/null || printf '%s:x:%s:\n' "$NB_USER" "$NB_GID" >>"$dir/group"
  export LD_PRELOAD="$lib${LD_PRELOAD:+ $LD_PRELOAD}" NSS_WRAPPER_PASSWD=$dir/passwd NSS_WRAPPER_GROUP=$dir/group
  export USER=$NB_USER LOGNAME=$NB_USER
  info "UID $NB_UID has no entry in /etc/passwd: named $NB_USER, home $USER_HOME, for this container's processes (nss_wrapper)"
}

# The home of a --user start: a HOME it was given that it may write (Docker gives "/" to
# a UID without a passwd entry), else /home/tf when that UID may write it, else a private
# folder.
user_home() {
  if [[ ${HOME:-/} != / && -w ${HOME:-/nonexistent} ]]; then
    return 0
  elif [[ -w $USER_HOME ]]; then
    export HOME=$USER_HOME
  else
    warn "$USER_HOME is not writable by UID $NB_UID, GID $NB_GID: $(home_not_writable_why); HOME is /tmp/home-$NB_UID, lost with the container"
    export HOME=/tmp/home-$NB_UID
    install -d -m 700 "$HOME"
  fi
}

# Why a --user start may not write $USER_HOME, and what works, for user_home's WARN.  The
# advice "--user UID:0" holds only for the image's own home (group 0, writable by it); a home
# volume a root start handed to an NB_UID belongs to that UID and group, and that advice,
# given to a start that already had GID 0, sent it in a circle.  Only a --user start asks:
# it looks at the top as the user itself (root never calls this; `top` keeps the path as the
# user's own, outside tests/image/test_static.py's rule for root).
home_not_writable_why() {
  local top=$USER_HOME owner mode
  ! is_root || return 0
  if ! owner=$(stat -c %u:%g "$top" 2>/dev/null); then
    printf 'it cannot be read; mount a folder that UID may write on %s' "$top"
    return 0
  fi
  mode=$(stat -c %a "$top")
  if root_fs_read_only && ! is_mount_point "$top"; then
    printf 'it is on the read-only root file system (--read-only): mount a volume on %s' "$top"
  elif [[ ${owner#*:} == 0 && $NB_GID != 0 && $((8#$mode & 8#020)) != 0 ]]; then
    printf 'it belongs to UID:GID %s (mode %s), writable by GID 0: start with --user %s:0, or mount a folder that UID may write on %s' \
      "$owner" "$mode" "$NB_UID" "$top"
  else
    printf 'it belongs to UID:GID %s (mode %s): start with --user %s, or as root with NB_UID=%s (and NB_GID) to re-own a home the image made (a volume; a folder you mounted never is), or mount a folder that UID may write on %s' \
      "$owner" "$mode" "$owner" "$NB_UID" "$top"
  fi
}

main() {
  # docker-stacks' `start.sh CMD...` (its entrypoint, often left in a CMD): run CMD as here;
  # alone, bash, as there.
  if [[ ${1:-} == start.sh ]]; then
    shift
    (($#)) || set -- bash
  fi
  case ${1:-} in
    -h | --help | help)
      usage
      exit 0
      ;;
  esac
  SERVE_ARGS=()
  case ${1:-serve} in
    serve | start-notebook.py | start-notebook.sh | start-singleuser.py | start-singleuser.sh | jupyterhub-singleuser)
      MODE=serve
      SERVE_ARGS=("${@:2}")
      ;;
    self-test) MODE=self-test ;;
    *) MODE="command" ;;
  esac
  check_root_fs
  check_capabilities
  check_unset_vars
  stacks_not_read
  if is_root; then
    check_ids
    remap_user
    take_state_dir
    TOKEN_FILE=$STATE_DIR/jupyter/token
    HOME_TOKEN_FILE=$USER_HOME/.jupyter/token
  else
    NB_UID=$(id -u)
    NB_GID=$(id -g)
    name_unknown_uid
    user_home
    TOKEN_FILE=$HOME/.jupyter/token
    HOME_TOKEN_FILE=$TOKEN_FILE
  fi
  check_gpu_profiling
  mapfile -d '' USER_CMD < <(user_cmd)
  mapfile -d '' HELPER_CMD < <(user_cmd helper)
  # shellcheck disable=SC2034  # TOKEN_FILE, HOME_TOKEN_FILE and HELPER_CMD are read by the parts
  readonly MODE SERVE_ARGS NB_UID NB_GID TOKEN_FILE HOME_TOKEN_FILE USER_CMD HELPER_CMD UNSET_VARS

  source_parts always
  [[ $MODE == self-test ]] || run_hooks start-notebook.d
  if [[ $MODE == serve ]]; then source_parts serve; fi
  [[ $MODE == self-test ]] || run_hooks before-notebook.d
  unset_vars
  local after
  for after in "${AFTER_HOOKS[@]}"; do "$after"; done

  case $MODE in
    serve) supervise ;;
    self-test)
      shift
      self_test "$@"
      ;;
    *)
      batch_command "$@"
      exec "${USER_CMD[@]}" PATH="$(user_path)" "${BATCH_CMD[@]}"
      ;;
  esac
}

# `docker run IMAGE --help`: the container's commands (docs/image.md has the rest).
usage() {
  # A tfmp command's name that is also a program on PATH (env) runs that program: name it,
  # so `docker run IMAGE env --json` is not a surprise from /usr/bin/env.
  local name alone=() shadowed=()
  for name in "${TFMP_COMMANDS[@]}"; do
    if command -v -- "$name" >/dev/null 2>&1; then shadowed+=("$name"); else alone+=("$name"); fi
  done
  local but=""
  [[ ${#shadowed[@]} -gt 0 ]] && but="; ${shadowed[*]} alone is the system's program: tfmp ${shadowed[0]}"
  cat <<EOF
usage: docker run [DOCKER OPTIONS] IMAGE [COMMAND [ARGS]]
  (none) | serve [JUPYTER OPTIONS]  sshd and Jupyter on 8888 (what docker compose up runs)
  tfmp COMMAND [FLAGS]              a batch job as the user tf; COMMAND: ${TFMP_COMMANDS[*]}
  COMMAND [FLAGS]                   the same without tfmp: ${alone[*]} (docker run IMAGE train --epochs 5${but})
  self-test [PYTEST ARGS]           the image's own tests (GPU tests when a GPU is visible)
  PROGRAM [ARGS]                    any program on PATH as the user tf (python, bash -lc CMD)
A command's flags: tfmp COMMAND --help.
EOF
}

# Sets BATCH_CMD, the command line a batch job runs: a tfmp command's name alone (`train`)
# becomes `tfmp train`, unless a program of that name is on PATH.  A program that is nowhere
# is one line and status 127, as a shell says it, not env's "No such file or directory".
batch_command() {
  BATCH_CMD=("$@")
  command -v -- "$1" >/dev/null 2>&1 && return 0
  local name
  for name in "${TFMP_COMMANDS[@]}"; do
    if [[ $1 == "$name" ]]; then
      BATCH_CMD=(tfmp "$@")
      return 0
    fi
  done
  log FATAL "no program named '$1' in the image (nothing on PATH, not a tfmp command); allowed: tfmp COMMAND or the command alone (${TFMP_COMMANDS[*]}), serve, self-test, or a program on PATH (python, bash -lc '...')"
  exit 127
}

main "$@"
