# shellcheck shell=bash
# Part of entrypoint.sh (sourced, every mode): the persistent home.  Compose mounts
# the `home` volume on /home/tf, so what the user installs or configures there
# (pip --user packages, JupyterLab settings and workspaces, shell history, ~/.ssh
# client files, ~/.vscode-server) outlives the container and the image.  Docker
# copies the image's home into that volume only while it is empty, so:
#  - the image's own files (shell profile, ~/.ssh and ~/.jupyter folders) are
#    brought in from the pristine copy $IMAGE_HOME, as the user: missing ones are
#    added, copies the user never edited refreshed, edited ones left alone
#    (`tfmp-home sync`);
#  - a user-site package that would break TensorFlow (outside the image's
#    constraints, e.g. numpy 2 installed with --no-deps or PIP_CONSTRAINT unset, or a
#    `pip check` conflict it causes) gets one WARN line naming it (`tfmp-home check`).
# Everything here runs as the user, the glob test too: root never reads a path below the
# home (docs/image.md, "Security").  The core re-owns a home the image made for another
# UID, and refuses any other home that NB_UID does not own (entrypoint.sh, fit_home).

readonly IMAGE_HOME=/usr/local/share/tfmp/home

sync_image_home() {
  local out
  # A private HOME in /tmp (--user with a UID the image does not know) gets the files too.
  if out=$("${HELPER_CMD[@]}" /usr/local/bin/tfmp-home sync --image-home "$IMAGE_HOME" 2>&1); then
    # Said only when there is something to say (a batch job's log stays short).
    [[ $out == *": 0 added, 0 refreshed, 0 kept" ]] || info "$out"
  else
    warn "could not refresh the image's files in the home: $(tail -n 1 <<<"$out")"
  fi
}

# Nothing to check (no `pip install --user` yet, or the user site switched off) costs
# no Python start: batch jobs start as fast as before.
check_user_packages() {
  local home line out
  if is_root; then home=$USER_HOME; else home=$HOME; fi
  [[ -z ${PYTHONNOUSERSITE:-} ]] || return 0
  # shellcheck disable=SC2016  # expanded by the user's shell
  if [[ -z ${PYTHONUSERBASE:-} ]] &&
    ! "${HELPER_CMD[@]}" bash -c 'compgen -G "$1" >/dev/null' bash \
      "$home/.local/lib/python3*/site-packages/*.*-info"; then
    return 0
  fi
  if ! out=$("${HELPER_CMD[@]}" /usr/local/bin/tfmp-home check 2>&1); then
    warn "could not check the user's pip packages: $(tail -n 1 <<<"$out")"
    return 0
  fi
  while IFS= read -r line; do
    [[ -z $line ]] || warn "$line"
  done <<<"$out"
}

sync_image_home
check_user_packages
