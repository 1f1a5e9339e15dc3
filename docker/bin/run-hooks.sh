# shellcheck shell=bash
# run-hooks.sh DIR - a user's start-up hooks, as jupyter/docker-stacks runs them
# (installed as /usr/local/bin/run-hooks.sh; SOURCED, not run: entrypoint.sh sources it
# for /usr/local/bin/start-notebook.d and /usr/local/bin/before-notebook.d, and an image
# built FROM this one may source it for a folder of its own).
#
# Every file of DIR, in name order: a *.sh file is sourced (what it exports reaches what
# follows), an executable file is run, anything else is skipped.  A hook that fails is one
# ERROR line naming it and its status, and the next hook runs (docker-stacks' rule: a hook
# is the image user's addition, not a reason to refuse the start).  While hooks run, the
# caller's `set -e`, `set -u` and pipefail are off (docker-stacks' hooks are written for a
# shell without them) and restored afterwards.

if ! declare -F info >/dev/null; then
  # Sourced on its own (not by entrypoint.sh): the entrypoint's line format.
  log() { printf '%s [entrypoint] %-5s %s\n' "$(date -u +%H:%M:%S)" "$1" "$2" >&2; }
  info() { log INFO "$*"; }
  warn() { log WARN "$*"; }
fi

if (($# != 1)); then
  log ERROR "run-hooks.sh: give exactly one folder of hooks. Received: $#"
  return 2
fi
if [[ ! -d $1 ]]; then
  log ERROR "run-hooks.sh: '$1' is not a folder"
  return 2
fi

# The caller's options, read in this shell: a $(set +o) would run in a subshell, which
# bash starts without errexit, and "restore" the caller's set -e to off.
_tfmp_hooks_opts=""
if [[ $- == *e* ]]; then _tfmp_hooks_opts+=e; fi
if [[ $- == *u* ]]; then _tfmp_hooks_opts+=u; fi
if [[ -o pipefail ]]; then _tfmp_hooks_opts+=p; fi
set +euo pipefail
info "hooks in $1, as UID $(id -u), GID $(id -g)"
for _tfmp_hook in "${1%/}"/*; do
  [[ -e $_tfmp_hook ]] || continue
  if [[ $_tfmp_hook == *.sh ]]; then
    info "hook: sourcing $_tfmp_hook"
    # shellcheck source=/dev/null  # the user's own file
    source "$_tfmp_hook"
    _tfmp_hook_status=$?
    set +euo pipefail
  elif [[ -f $_tfmp_hook && -x $_tfmp_hook ]]; then
    info "hook: running $_tfmp_hook"
    "$_tfmp_hook"
    _tfmp_hook_status=$?
  else
    warn "hook: skipped $_tfmp_hook (neither *.sh nor executable)"
    continue
  fi
  if ((_tfmp_hook_status != 0)); then
    log ERROR "hook $_tfmp_hook exited with status $_tfmp_hook_status; the start goes on"
  fi
done
if [[ $_tfmp_hooks_opts == *e* ]]; then set -e; fi
if [[ $_tfmp_hooks_opts == *u* ]]; then set -u; fi
if [[ $_tfmp_hooks_opts == *p* ]]; then set -o pipefail; fi
unset _tfmp_hook _tfmp_hook_status _tfmp_hooks_opts
