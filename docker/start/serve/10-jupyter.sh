# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only): the Jupyter token and the Jupyter server,
# which serves both interfaces behind that token: JupyterLab (/lab) and the Notebook
# interface (/tree, /notebooks/..., /edit/...).  Started by JupyterHub (JUPYTERHUB_API_TOKEN
# set), the server is `jupyterhub-singleuser` instead, behind the hub's login: no token.
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
#   JUPYTER_HOST_PORT    host port shown in that URL (default: the server's port)
#   JUPYTER_PORT         the server's port in the container (default 8888); the
#                        healthcheck and the printed URL follow it
#   NOTEBOOK_ARGS        Jupyter server options, split as a shell would, passed before
#                        the ones after `serve` (docker-stacks' name); options that would
#                        weaken authentication are refused (tfmp-jupyter-args)
#   NB_UMASK             umask of the Jupyter server, its kernels and terminals (octal,
#                        e.g. 002; default: the container's, 022)
#   JUPYTERHUB_API_TOKEN set by JupyterHub's spawner (with JUPYTERHUB_API_URL,
#                        JUPYTERHUB_SERVICE_PREFIX and the other JUPYTERHUB_* variables):
#                        run jupyterhub-singleuser, authenticated by the hub
# TLS (https:// in that URL, the certificate's fingerprint beside it) is decided by
# 08-jupyter-tls.sh.
#
# Sets (read-only) for later parts:
#   JUPYTER_HUB       1 under JupyterHub, else 0
#   JUPYTER_PORT_IN   the port the server listens on in the container
#   JUPYTER_BASE_URL  its base URL: / or /prefix/ (the hub's prefix under JupyterHub)
#   JUPYTER_PUBLIC    scheme://127.0.0.1:host-port of the printed URLs (no trailing slash)

readonly HOME_TOKEN_DIR=${HOME_TOKEN_FILE%/*}

# The server's options: NOTEBOOK_ARGS and the arguments after `serve`, checked, with the
# port and base URL they give (tfmp-jupyter-args).  Sets JUPYTER_ARGS.
JUPYTER_ARGS=()
jupyter_options() {
  local out err parsed=() hub=()
  [[ $JUPYTER_HUB == 0 ]] || hub=(--hub)
  out=$(mktemp)
  err=$(/usr/local/bin/tfmp-jupyter-args "${hub[@]}" "${SERVE_ARGS[@]}" 2>&1 >"$out") || {
    rm -f "$out"
    fatal "${err:-tfmp-jupyter-args failed}"
  }
  mapfile -d '' parsed <"$out"
  rm -f "$out"
  JUPYTER_PORT_IN=${parsed[0]} JUPYTER_BASE_URL=${parsed[1]}
  JUPYTER_ARGS=("${parsed[@]:2}")
  if [[ -n ${NB_UMASK:-} && ! $NB_UMASK =~ ^0?[0-7]{3}$ ]]; then
    fatal "NB_UMASK must be an octal umask such as 022 or 002. Received: NB_UMASK='$NB_UMASK'"
  fi
  # Under a hub the printed URLs are the hub's paths; elsewhere the host's published port.
  check_port_var JUPYTER_HOST_PORT
  JUPYTER_PUBLIC="$JUPYTER_SCHEME://127.0.0.1:${JUPYTER_HOST_PORT:-$JUPYTER_PORT_IN}"
}

# Started by JupyterHub: the spawner sets JUPYTERHUB_API_TOKEN and the variables
# jupyterhub-singleuser reads; one missing is one line, not a server the hub cannot reach.
is_hub_start() {
  local var
  [[ -n ${JUPYTERHUB_API_TOKEN:-} ]] || return 1
  for var in JUPYTERHUB_API_URL JUPYTERHUB_SERVICE_PREFIX; do
    [[ -n ${!var:-} ]] || fatal "JUPYTERHUB_API_TOKEN is set but $var is not: a JupyterHub spawner sets both (start the image from the hub, or unset JUPYTERHUB_API_TOKEN)"
  done
  return 0
}

setup_hub() {
  local var
  for var in JUPYTER_TOKEN JUPYTER_TOKEN_FILE; do
    [[ -z ${!var:-} ]] || warn "$var is ignored under JupyterHub: the hub authenticates users"
  done
  # The hub talks to the server over its own URL (JUPYTERHUB_SERVICE_URL, http unless the hub
  # sets up internal TLS itself): the image's certificate is not used there.
  [[ $JUPYTER_SCHEME == http ]] ||
    warn "JUPYTER_TLS / JUPYTER_CERTFILE are not used under JupyterHub: the hub's proxy terminates TLS"
  readonly JUPYTER_LANDING=$1
  service jupyter "JupyterHub single-user server" \
    "{\"hub\": true, \"port\": $JUPYTER_PORT_IN, \"base_url\": \"$JUPYTER_BASE_URL\"}" start_jupyter
  announce "JupyterHub single-user server for ${JUPYTERHUB_USER:-?}: ${JUPYTERHUB_BASE_URL:-/}hub/ sends the user to $JUPYTER_BASE_URL (hub login, no token; hub API ${JUPYTERHUB_API_URL})"
}

# The token goes to $TOKEN_FILE, where the server reads it (jupyter_server_config.py):
# never in argv or the environment of kernels and terminals.
# Each character of $1 once, quoted as itself ('$', ' ', '"'), a control character as bash
# writes it ($'\t'): printf %q alone showed a backslash the user never typed ("\ " for a space).
shown_chars() {
  local s=$1 c i out=""
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    if [[ $c == [[:print:]] ]]; then
      [[ $c == "'" ]] && c="\"'\"" || c="'$c'"
    else
      c=$(printf '%q' "$c")
    fi
    [[ ", $out, " == *", $c, "* ]] || out+=${out:+, }$c
  done
  printf '%s' "$out"
}

setup_jupyter() {
  local token source=JUPYTER_TOKEN landing
  case ${JUPYTER_UI:-lab} in
    lab) landing=lab ;;
    notebook) landing=tree ;;
    *) fatal "JUPYTER_UI must be lab or notebook. Received: JUPYTER_UI='$JUPYTER_UI'" ;;
  esac
  JUPYTER_HUB=0
  if is_hub_start; then JUPYTER_HUB=1; fi
  jupyter_options
  readonly JUPYTER_HUB JUPYTER_PORT_IN JUPYTER_BASE_URL JUPYTER_PUBLIC JUPYTER_ARGS
  if [[ $JUPYTER_HUB == 1 ]]; then
    setup_hub "/$landing"
    return 0
  fi
  [[ -z ${JUPYTER_TOKEN_FILE:-} ]] || source=JUPYTER_TOKEN_FILE
  token=$(secret_from_env JUPYTER_TOKEN "an empty token would disable authentication (unset it for a random one)")
  [[ -n $token ]] || token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  # Only the offending characters are shown, never the token.
  [[ $token =~ ^[A-Za-z0-9._~-]+$ ]] ||
    fatal "$source: the Jupyter token may contain only letters, digits and . _ ~ - (it goes into URLs); found: $(shown_chars "${token//[A-Za-z0-9._~-]/}")"
  # .env.example's placeholder is public: uncommented as it is, anyone could log in.
  [[ $token != change-me-to-a-long-random-string ]] ||
    fatal "$source is .env.example's placeholder, which anyone can read: set a token of your own (e.g. the output of \`openssl rand -hex 24\`), or leave it unset for a random one"
  ((${#token} >= 8)) || warn "the Jupyter token is shorter than 8 characters"
  local log_token=${JUPYTER_LOG_TOKEN:-}
  if [[ -z $log_token ]]; then
    if [[ $source == JUPYTER_TOKEN_FILE ]]; then log_token=0; else log_token=1; fi
  fi
  [[ $log_token =~ ^[01]$ ]] ||
    fatal "JUPYTER_LOG_TOKEN must be 1 (print the URL with the token) or 0 (print it without; unset: 0 with JUPYTER_TOKEN_FILE, else 1). Received: JUPYTER_LOG_TOKEN='$JUPYTER_LOG_TOKEN'"
  write_token "$token"
  # LabApp.default_url is relative to the base URL.
  readonly JUPYTER_LANDING=/$landing
  local health="\"token_file\": \"$TOKEN_FILE\", \"port\": $JUPYTER_PORT_IN, \"base_url\": \"$JUPYTER_BASE_URL\"" url
  # The healthcheck then asks over https and checks that this certificate is the one served.
  [[ -z $JUPYTER_TLS_PIN ]] || health+=", \"certfile\": \"$JUPYTER_TLS_PIN\""
  service jupyter JupyterLab "{$health}" start_jupyter
  url="$JUPYTER_PUBLIC$JUPYTER_BASE_URL$landing"
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
  "${HELPER_CMD[@]}" sh -c 'umask 077 && mkdir -p "$1"; test -d "$1" -a -w "$1"' sh "$HOME_TOKEN_DIR" 2>/dev/null ||
    fatal "$HOME_TOKEN_DIR is not a folder UID $NB_UID can write (a link to a folder of root's?): JupyterLab keeps its settings there; remove it (the next start makes a new one) or make it a folder of the user's"
  printf '%s\n' "$1" | "${HELPER_CMD[@]}" sh -c 'umask 077 && cat >"$1" && chmod 600 "$1"' sh "$HOME_TOKEN_FILE" 2>/dev/null || {
    is_root || fatal "could not write the Jupyter token to $HOME_TOKEN_FILE"
    warn "could not write the user's copy of the Jupyter token to $HOME_TOKEN_FILE (as UID $NB_UID); the server's is $TOKEN_FILE"
  }
}

# One server for both interfaces; LabApp.default_url is where it sends `/`.  The server's
# own settings (address, port, token file, TLS, TensorBoard's proxy URL) come through
# TFMP_* variables to /etc/jupyter/jupyter_server_config.py.
start_jupyter() {
  local env=(TFMP_JUPYTER_BASE_URL="$JUPYTER_BASE_URL" TFMP_JUPYTER_PORT="$JUPYTER_PORT_IN")
  if [[ -n $JUPYTER_TLS_CERT && $JUPYTER_HUB == 0 ]]; then
    env+=(TFMP_JUPYTER_CERTFILE="$JUPYTER_TLS_CERT" TFMP_JUPYTER_KEYFILE="$JUPYTER_TLS_KEY")
  fi
  [[ -z ${NB_UMASK:-} ]] || umask "$NB_UMASK"
  if [[ $JUPYTER_HUB == 1 ]]; then
    # The spawner's default_url (JUPYTERHUB_DEFAULT_URL), if it set one, wins over JUPYTER_UI.
    local landing=()
    [[ -n ${JUPYTERHUB_DEFAULT_URL:-} ]] || landing=(--ServerApp.default_url="$JUPYTER_LANDING")
    exec "${USER_CMD[@]}" PATH="$(user_path)" TFMP_JUPYTER_MODE=jupyterhub "${env[@]}" jupyterhub-singleuser \
      "${landing[@]}" "${JUPYTER_ARGS[@]}"
  fi
  # The identity provider on the command line, which outranks every config file: a config
  # of the user's that empties the token cannot turn authentication off (tfmp_token_auth).
  exec "${USER_CMD[@]}" PATH="$(user_path)" TFMP_JUPYTER_TOKEN_PATH="$TOKEN_FILE" "${env[@]}" jupyter lab --no-browser \
    --LabApp.default_url="$JUPYTER_LANDING" "${JUPYTER_ARGS[@]}" \
    --ServerApp.identity_provider_class=tfmp_token_auth.TokenFileIdentityProvider
}

setup_jupyter
