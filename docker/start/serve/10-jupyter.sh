# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only): the Jupyter token and the Jupyter server,
# which serves both interfaces behind that token: JupyterLab (/lab) and the Notebook
# interface (/tree, /notebooks/..., /edit/...).
#
# Environment:
#   JUPYTER_UI           lab (default) or notebook: where `/` lands and which address
#                        the start-up line prints (/lab or /tree); both always work
#   JUPYTER_TOKEN        JupyterLab token (URL-safe characters)
#   JUPYTER_TOKEN_FILE   file holding the token (e.g. a Docker secret)
#                        neither: a random token.  The token is written to
#                        $TOKEN_FILE (root's, for the server and the healthcheck)
#                        and, as the user, to $HOME_TOKEN_FILE (mode 600).
#                        An empty token is refused: never no auth.
#   JUPYTER_LOG_TOKEN    1: the start-up line is the full URL with the token; 0: the URL
#                        without it and where the token is (log drivers ship logs off the
#                        machine).  Default 0 when the token came from JUPYTER_TOKEN_FILE
#                        (a secret kept out of the environment), 1 otherwise.
#   JUPYTER_HOST_PORT    host port shown in that URL (default 8888)
# TLS (https:// in that URL, the certificate's fingerprint beside it) is decided by
# 08-jupyter-tls.sh.

readonly HOME_TOKEN_DIR=${HOME_TOKEN_FILE%/*}

# The token goes to $TOKEN_FILE, where the server reads it (jupyter_server_config.py):
# never in argv or the environment of kernels and terminals.
setup_jupyter() {
  local token source=JUPYTER_TOKEN landing
  case ${JUPYTER_UI:-lab} in
    lab) landing=/lab ;;
    notebook) landing=/tree ;;
    *) fatal "JUPYTER_UI must be lab or notebook. Received: JUPYTER_UI='$JUPYTER_UI'" ;;
  esac
  [[ -z ${JUPYTER_TOKEN_FILE:-} ]] || source=JUPYTER_TOKEN_FILE
  token=$(secret_from_env JUPYTER_TOKEN "an empty token would disable authentication (unset it for a random one)")
  [[ -n $token ]] || token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  # Only the offending characters are shown, never the token.
  [[ $token =~ ^[A-Za-z0-9._~-]+$ ]] ||
    fatal "$source: the Jupyter token may contain only letters, digits and . _ ~ - (it goes into URLs); found: $(printf '%q' "${token//[A-Za-z0-9._~-]/}")"
  ((${#token} >= 8)) || warn "the Jupyter token is shorter than 8 characters"
  local log_token=${JUPYTER_LOG_TOKEN:-}
  if [[ -z $log_token ]]; then
    if [[ $source == JUPYTER_TOKEN_FILE ]]; then log_token=0; else log_token=1; fi
  fi
  [[ $log_token =~ ^[01]$ ]] ||
    fatal "JUPYTER_LOG_TOKEN must be 1 (print the URL with the token) or 0 (print it without; unset: 0 with JUPYTER_TOKEN_FILE, else 1). Received: JUPYTER_LOG_TOKEN='$JUPYTER_LOG_TOKEN'"
  write_token "$token"
  readonly JUPYTER_LANDING=$landing
  local health="\"token_file\": \"$TOKEN_FILE\"" url
  # The healthcheck then asks over https and checks that this certificate is the one served.
  [[ -z $JUPYTER_TLS_PIN ]] || health+=", \"certfile\": \"$JUPYTER_TLS_PIN\""
  service jupyter JupyterLab "{$health}" start_jupyter
  url="$JUPYTER_SCHEME://127.0.0.1:${JUPYTER_HOST_PORT:-8888}$landing"
  if [[ $log_token == 1 ]]; then
    announce "Jupyter URL: $url?token=$token   (token also in $HOME_TOKEN_FILE)"
  else
    local where=$HOME_TOKEN_FILE
    [[ -z ${JUPYTER_TOKEN_FILE:-} ]] || where="JUPYTER_TOKEN_FILE='$JUPYTER_TOKEN_FILE' and $HOME_TOKEN_FILE"
    announce "Jupyter URL: $url   (token not logged, JUPYTER_LOG_TOKEN=0: it is in $where; open $url?token=<token>)"
  fi
  [[ -z $JUPYTER_TLS_NOTE ]] || announce "$JUPYTER_TLS_NOTE"
}

# Root's copy ($TOKEN_FILE, in root's $STATE_DIR: the server reads it through its group,
# the healthcheck as root) and the user's ($HOME_TOKEN_FILE, written as the user: the
# home is the user's, and root would follow a ~/.jupyter made a symlink to /etc).
# Without root both are the same file.  The token goes through stdin, never argv.
# shellcheck disable=SC2016  # the sh -c scripts are expanded by the user's shell
write_token() {
  if is_root; then
    install -d -m 750 -o root -g "$NB_GID" "$(dirname "$TOKEN_FILE")"
    (umask 077 && printf '%s\n' "$1" >"$TOKEN_FILE")
    chgrp "$NB_GID" "$TOKEN_FILE"
    chmod 640 "$TOKEN_FILE"
  fi
  # The server writes its settings there, as the user: a ~/.jupyter the user cannot write
  # (a link to /root, say) would stop it with a traceback; one line instead.
  "${USER_CMD[@]}" sh -c 'umask 077 && mkdir -p "$1"; test -d "$1" -a -w "$1"' sh "$HOME_TOKEN_DIR" 2>/dev/null ||
    fatal "$HOME_TOKEN_DIR is not a folder UID $NB_UID can write (a link to a folder of root's?): JupyterLab keeps its settings there; remove it (the next start makes a new one) or make it a folder of the user's"
  printf '%s\n' "$1" | "${USER_CMD[@]}" sh -c 'umask 077 && cat >"$1" && chmod 600 "$1"' sh "$HOME_TOKEN_FILE" 2>/dev/null || {
    is_root || fatal "could not write the Jupyter token to $HOME_TOKEN_FILE"
    warn "could not write the user's copy of the Jupyter token to $HOME_TOKEN_FILE (as UID $NB_UID); the server's is $TOKEN_FILE"
  }
}

# One server for both interfaces; LabApp.default_url is where it sends `/`.
start_jupyter() {
  local tls=()
  [[ -z $JUPYTER_TLS_CERT ]] || tls=(TFMP_JUPYTER_CERTFILE="$JUPYTER_TLS_CERT" TFMP_JUPYTER_KEYFILE="$JUPYTER_TLS_KEY")
  exec "${USER_CMD[@]}" TFMP_JUPYTER_TOKEN_PATH="$TOKEN_FILE" "${tls[@]}" jupyter lab --no-browser \
    --LabApp.default_url="$JUPYTER_LANDING"
}

setup_jupyter
