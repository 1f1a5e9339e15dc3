# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only): the package's guide notebooks in
# $WORKSPACE/notebooks, copied as the user: missing ones are added, unedited copies
# refreshed, edited ones never touched (`tfmp notebooks --install` decides).  A
# failure costs the notebooks, not the service.

install_notebooks() {
  local out
  # `tfmp`, not `python3 -m app`: the current folder is /workspace, and a user's own
  # app.py there would run instead of the package.
  if out=$("${HELPER_CMD[@]}" tfmp notebooks --install "$WORKSPACE/notebooks" 2>&1); then
    info "guide notebooks in $WORKSPACE/notebooks ($(grep -c . <<<"$out") checked)"
  else
    warn "could not install the guide notebooks into $WORKSPACE/notebooks: $(tail -n 1 <<<"$out")"
  fi
}

install_notebooks
