# shellcheck shell=bash
# Part of entrypoint.sh (sourced; serve mode): the Jupyter token and the Jupyter server,
# which serves both interfaces behind that token: JupyterLab (/lab) and the Notebook
# interface (/tree, /notebooks/..., /edit/...).
#
# Environment:
#   JUPYTER_UI           lab (default) or notebook: where `/` lands and which address
#                        the start-up line prints (/lab or /tree); both always work
#   JUPYTER_TOKEN        JupyterLab token (URL-safe characters)
#   JUPYTER_TOKEN_FILE   file holding the token (e.g. a Docker secret)
#                        neither: a random token.  The token is written to
#                        $TOKEN_FILE (mode 600) and printed once as a full URL.
#                        An empty token is refused: never no auth.
#   JUPYTER_HOST_PORT    host port shown in that URL (default 8888)
# TLS (https:// in that URL, the certificate's fingerprint beside it) is decided by
# 08-jupyter-tls.sh.
[[ $MODE == serve ]] || return 0

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
  [[ -n $token ]] || token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
  # Only the offending characters are shown, never the token.
  [[ $token =~ ^[A-Za-z0-9._~-]+$ ]] ||
    fatal "$source: the Jupyter token may contain only letters, digits and . _ ~ - (it goes into URLs); found: $(printf '%q' "${token//[A-Za-z0-9._~-]/}")"
  ((${#token} >= 8)) || warn "the Jupyter token is shorter than 8 characters"
  install -d -m 700 "$(dirname "$TOKEN_FILE")"
  (umask 077 && printf '%s\n' "$token" >"$TOKEN_FILE")
  chmod 600 "$TOKEN_FILE"
  if is_root; then chown -R "$NB_UID:$NB_GID" "$(dirname "$TOKEN_FILE")"; fi
  readonly JUPYTER_LANDING=$landing
  local health="\"token_file\": \"$TOKEN_FILE\""
  # The healthcheck then asks over https and checks that this certificate is the one served.
  [[ -z $JUPYTER_TLS_CERT ]] || health+=", \"certfile\": \"$JUPYTER_TLS_CERT\""
  service jupyter JupyterLab "{$health}" start_jupyter
  announce "Jupyter URL: $JUPYTER_SCHEME://127.0.0.1:${JUPYTER_HOST_PORT:-8888}$landing?token=$token   (token also in $TOKEN_FILE)"
  [[ -z $JUPYTER_TLS_NOTE ]] || announce "$JUPYTER_TLS_NOTE"
}

# One server for both interfaces; LabApp.default_url is where it sends `/`.
start_jupyter() {
  local tls=()
  [[ -z $JUPYTER_TLS_CERT ]] || tls=(TFMP_JUPYTER_CERTFILE="$JUPYTER_TLS_CERT" TFMP_JUPYTER_KEYFILE="$JUPYTER_TLS_KEY")
  exec "${USER_CMD[@]}" TFMP_JUPYTER_TOKEN_PATH="$TOKEN_FILE" "${tls[@]}" jupyter lab --no-browser \
    --LabApp.default_url="$JUPYTER_LANDING"
}

setup_jupyter
