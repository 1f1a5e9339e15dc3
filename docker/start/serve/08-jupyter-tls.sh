# shellcheck shell=bash
# Part of entrypoint.sh (sourced in serve mode only): JupyterLab over TLS, off by default.
# Runs before 10-jupyter.sh, which serves and announces what this part decides.
#
# Environment:
#   JUPYTER_TLS            self-signed: a certificate made on the first start and kept
#                          in $TLS_KEEP_DIR (a volume), made again only when
#                          JUPYTER_TLS_HOSTNAMES changes or it is about to expire;
#                          off or unset (default): none made (plain HTTP, unless the
#                          two variables below give a certificate)
#   GEN_CERT               yes or 1: the same as JUPYTER_TLS=self-signed (docker-stacks' name)
#   JUPYTER_TLS_HOSTNAMES  names and IP addresses the self-signed certificate is for,
#                          separated by commas or spaces (e.g. gpu-box.example.org,203.0.113.7);
#                          localhost and 127.0.0.1 are always in it
#   JUPYTER_CERTFILE       your own certificate (PEM; the full chain if there is one) and
#   JUPYTER_KEYFILE        its unencrypted private key (PEM): mounted files, both or neither
#   BIND_ADDRESS           the host address compose publishes the ports on (compose passes
#                          it in): anything but loopback with TLS off gets one WARN line
#
# The server reads copies in $TLS_RUN_DIR (the key: mode 600, owned by the user), so a
# mounted key may stay root-only on the host.  Any bad setting stops the start with one
# FATAL line naming the variable.
#
# Sets (read-only) for later parts:
#   JUPYTER_SCHEME      http | https
#   JUPYTER_TLS_CERT    the certificate the server serves ("" without TLS)
#   JUPYTER_TLS_KEY     its key ("" without TLS)
#   JUPYTER_TLS_NOTE    the fingerprint line to announce beside the URL ("" without TLS)
#   JUPYTER_TLS_PIN     the certificate the healthcheck pins (root's copy when root; "" without TLS)

readonly TLS_KEEP_DIR=/etc/tfmp/tls
readonly TLS_RUN_DIR=/run/tfmp/tls
# A kept certificate this close to its end is made again (seconds), and a new one lasts
# 825 days: the longest macOS and iOS accept for a certificate a user trusts by hand.
readonly TLS_RENEW_BEFORE=$((7 * 86400)) TLS_DAYS=825

JUPYTER_SCHEME=http JUPYTER_TLS_CERT="" JUPYTER_TLS_KEY="" JUPYTER_TLS_NOTE="" JUPYTER_TLS_PIN=""
# The pair chosen (the user's, or the kept self-signed one) and the setting named when
# the server's own check of it fails.
TLS_SOURCE_CERT="" TLS_SOURCE_KEY="" TLS_ORIGIN=""

is_loopback() {
  [[ $1 == localhost || $1 == 127.* || $1 == ::1 || $1 == '[::1]' ]]
}

# The names of JUPYTER_TLS_HOSTNAMES plus localhost and 127.0.0.1, as sorted unique
# subjectAltName entries (DNS:name, IP:address) written the way `openssl x509 -ext`
# prints them, so a kept certificate's names compare as text.  A bad name: its one
# line on stdout, status 1.
tls_wanted_names() {
  tfmp-tls names "${JUPYTER_TLS_HOSTNAMES:-}"
}

# A certificate's subjectAltName entries, one a line, sorted, as tls_wanted_names writes them.
tls_cert_names() {
  openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null | tail -n +2 |
    tr ',' '\n' | sed -e 's/^ *//' -e 's/^IP Address:/IP:/' | grep . | sort -u
}

tls_pair_matches() { # $1 = certificate, $2 = key
  local cert_pub key_pub
  cert_pub=$(openssl x509 -in "$1" -noout -pubkey 2>/dev/null) || return 1
  key_pub=$(openssl pkey -in "$2" -pubout -passin pass: 2>/dev/null) || return 1
  [[ -n $cert_pub && $cert_pub == "$key_pub" ]]
}

tls_fingerprint() {
  openssl x509 -in "$1" -noout -fingerprint -sha256 | cut -d= -f2
}

tls_end_date() {
  openssl x509 -in "$1" -noout -enddate | cut -d= -f2
}

# One variable holding a path to a PEM file the user mounted: it must be there and readable.
tls_check_file() { # $1 = variable name, $2 = what the file holds
  local var=$1 path=${!1}
  refuse_user_path "$var"
  [[ -e $path ]] || fatal "$var='$path' does not exist in the container; mount the $2 (e.g. -v /host/certs:/certs:ro) and give its path there"
  [[ -f $path ]] || fatal "$var='$path' is not a file; give the path of the $2 (PEM)"
  [[ -r $path ]] || fatal "$var='$path' is not readable by UID $(id -u) (started with --user?); make it readable for that user"
}

tls_user_pair() {
  local cert=$JUPYTER_CERTFILE key=$JUPYTER_KEYFILE
  tls_check_file JUPYTER_CERTFILE "certificate"
  tls_check_file JUPYTER_KEYFILE "private key"
  openssl x509 -in "$cert" -noout 2>/dev/null ||
    fatal "JUPYTER_CERTFILE='$cert' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
  # -passin pass: fails on a passphrase instead of waiting for one at the terminal.
  openssl pkey -in "$key" -noout -passin pass: 2>/dev/null ||
    fatal "JUPYTER_KEYFILE='$key' holds no unencrypted PEM private key (a key with a passphrase cannot be used: nobody is there to type it)"
  tls_pair_matches "$cert" "$key" ||
    fatal "JUPYTER_KEYFILE='$key' is not the private key of JUPYTER_CERTFILE='$cert' (their public keys differ)"
  if ! openssl x509 -in "$cert" -noout -checkend 0 >/dev/null; then
    warn "JUPYTER_CERTFILE='$cert' expired on $(tls_end_date "$cert"): browsers will refuse it; renew it"
  fi
}

# Makes $TLS_KEEP_DIR/jupyter.{crt,key} for the names given, one per line.  The key is
# written first and the certificate renamed into place last: a start interrupted in
# between leaves a pair that does not match, which the next start makes again.
tls_make_self_signed() {
  local names=$1 conf crt key
  conf=$(mktemp)
  {
    printf '%s\n' "[req]" "distinguished_name = dn" "prompt = no" "x509_extensions = ext"
    printf '%s\n' "[dn]" "CN = tfmp JupyterLab (self-signed)"
    # An end-entity certificate, not a CA: Firefox refuses a CA certificate as a server's.
    printf '%s\n' "[ext]" "basicConstraints = critical,CA:FALSE" \
      "keyUsage = critical,digitalSignature" "extendedKeyUsage = serverAuth" \
      "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid" \
      "subjectAltName = $(paste -sd, <<<"$names")"
  } >"$conf"
  crt=$(mktemp "$TLS_KEEP_DIR/.jupyter.crt.XXXXXX")
  key=$(mktemp "$TLS_KEEP_DIR/.jupyter.key.XXXXXX")
  # P-256: made in milliseconds, accepted by every browser.
  (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -days "$TLS_DAYS" -config "$conf" -keyout "$key" -out "$crt" 2>/dev/null) ||
    fatal "JUPYTER_TLS=self-signed: openssl could not make the certificate (names: $(paste -sd' ' <<<"$names"))"
  rm -f "$conf"
  chmod 600 "$key"
  chmod 644 "$crt"
  mv -f "$key" "$TLS_KEEP_DIR/jupyter.key"
  mv -f "$crt" "$TLS_KEEP_DIR/jupyter.crt"
}

tls_self_signed() {
  local names have reason="" cert=$TLS_KEEP_DIR/jupyter.crt key=$TLS_KEEP_DIR/jupyter.key
  names=$(tls_wanted_names) || fatal "$names"
  if [[ ! -s $cert || ! -s $key ]]; then
    reason="none kept in $TLS_KEEP_DIR yet"
  elif ! tls_pair_matches "$cert" "$key"; then
    reason="the kept key does not match the kept certificate"
  elif ! openssl x509 -in "$cert" -noout -checkend "$TLS_RENEW_BEFORE" >/dev/null; then
    reason="the kept one expires on $(tls_end_date "$cert")"
  else
    have=$(tls_cert_names "$cert")
    [[ $have == "$names" ]] ||
      reason="JUPYTER_TLS_HOSTNAMES changed: the kept one is for $(paste -sd' ' <<<"$have")"
  fi
  if [[ -n $reason ]]; then
    if [[ ! -w $TLS_KEEP_DIR ]]; then
      fatal "JUPYTER_TLS=self-signed: $TLS_KEEP_DIR is not writable by UID $(id -u) (started with --user?); mount a volume that user may write there, or give JUPYTER_CERTFILE and JUPYTER_KEYFILE"
    fi
    tls_make_self_signed "$names"
    info "TLS: made a new self-signed certificate for $(paste -sd' ' <<<"$names") ($reason), valid until $(tls_end_date "$cert")"
  else
    info "TLS: reusing the self-signed certificate in $TLS_KEEP_DIR (valid until $(tls_end_date "$cert"))"
  fi
  TLS_SOURCE_CERT=$cert TLS_SOURCE_KEY=$key
}

# Copies the pair for the server: the key readable by the user only.  As root, the
# folder stays root's until both files are in, and is handed over last: the user can
# put nothing in it while root writes (docs/image.md, "Security").  The healthcheck
# pins a root-owned copy of the certificate ($JUPYTER_TLS_PIN): root never reads a
# file the user could swap.
tls_install_for_server() {
  rm -rf "$TLS_RUN_DIR"
  install -d -m 700 "$TLS_RUN_DIR"
  install -m 644 "$TLS_SOURCE_CERT" "$TLS_RUN_DIR/jupyter.crt"
  install -m 600 "$TLS_SOURCE_KEY" "$TLS_RUN_DIR/jupyter.key"
  JUPYTER_TLS_CERT=$TLS_RUN_DIR/jupyter.crt JUPYTER_TLS_KEY=$TLS_RUN_DIR/jupyter.key
  JUPYTER_TLS_PIN=$JUPYTER_TLS_CERT
  if is_root; then
    JUPYTER_TLS_PIN=$STATE_DIR/jupyter-pin.crt
    install -m 644 "$TLS_SOURCE_CERT" "$JUPYTER_TLS_PIN"
    chown -h "$NB_UID:$NB_GID" "$JUPYTER_TLS_CERT" "$JUPYTER_TLS_KEY"
    chown -h "$NB_UID:$NB_GID" "$TLS_RUN_DIR"
  fi
  # What the server will do with them (tornado loads them with Python's ssl), as the user:
  # catches what openssl's checks let through, such as a key too weak for this OpenSSL.
  local err
  err=$("${HELPER_CMD[@]}" tfmp-tls check "$JUPYTER_TLS_CERT" "$JUPYTER_TLS_KEY" 2>&1) ||
    fatal "$TLS_ORIGIN: Python's ssl refuses the certificate and key: $(tail -n 1 <<<"$err")"
}

setup_jupyter_tls() {
  local tls=${JUPYTER_TLS:-off} var
  if [[ -n ${GEN_CERT:-} ]]; then
    [[ $GEN_CERT =~ ^(yes|1)$ ]] ||
      fatal "GEN_CERT must be yes or 1 (the same as JUPYTER_TLS=self-signed), or unset. Received: GEN_CERT='$GEN_CERT'"
    [[ ${JUPYTER_TLS:-self-signed} == self-signed ]] ||
      fatal "GEN_CERT=$GEN_CERT asks for JUPYTER_TLS=self-signed, but JUPYTER_TLS='$JUPYTER_TLS' is set: use one of them"
    tls=self-signed
  fi
  [[ $tls == off || $tls == self-signed ]] ||
    fatal "JUPYTER_TLS must be self-signed or off (unset: off; your own certificate goes in JUPYTER_CERTFILE and JUPYTER_KEYFILE). Received: JUPYTER_TLS='$tls'"
  for var in JUPYTER_CERTFILE JUPYTER_KEYFILE; do
    if [[ ${!var+set} == set && -z ${!var} ]]; then
      fatal "$var is set but empty; give the path of a mounted PEM file, or unset it"
    fi
  done
  if [[ -n ${JUPYTER_CERTFILE:-} && -z ${JUPYTER_KEYFILE:-} ]]; then
    fatal "JUPYTER_CERTFILE is set without JUPYTER_KEYFILE: give both the certificate and its private key, or neither"
  elif [[ -z ${JUPYTER_CERTFILE:-} && -n ${JUPYTER_KEYFILE:-} ]]; then
    fatal "JUPYTER_KEYFILE is set without JUPYTER_CERTFILE: give both the certificate and its private key, or neither"
  fi
  if [[ -n ${JUPYTER_CERTFILE:-} && $tls == self-signed ]]; then
    fatal "JUPYTER_TLS=self-signed and JUPYTER_CERTFILE/JUPYTER_KEYFILE are both set: use one of them"
  fi

  if [[ -n ${JUPYTER_CERTFILE:-} ]]; then
    TLS_ORIGIN="JUPYTER_CERTFILE/JUPYTER_KEYFILE"
    tls_user_pair
    TLS_SOURCE_CERT=$JUPYTER_CERTFILE TLS_SOURCE_KEY=$JUPYTER_KEYFILE
  elif [[ $tls == self-signed ]]; then
    TLS_ORIGIN="JUPYTER_TLS=self-signed"
    tls_self_signed
  else
    [[ -z ${JUPYTER_TLS_HOSTNAMES:-} ]] ||
      warn "JUPYTER_TLS_HOSTNAMES is set but TLS is off: it is read only with JUPYTER_TLS=self-signed"
    if [[ -n ${BIND_ADDRESS:-} ]] && ! is_loopback "$BIND_ADDRESS"; then
      warn "BIND_ADDRESS=$BIND_ADDRESS publishes JupyterLab beyond this machine over plain HTTP: the token travels in clear text." \
        "Use an SSH tunnel (docs/image.md, \"Exposing Jupyter\"), or turn TLS on: JUPYTER_TLS=self-signed" \
        "(with JUPYTER_TLS_HOSTNAMES), or your own certificate in JUPYTER_CERTFILE and JUPYTER_KEYFILE"
    fi
    return 0
  fi
  tls_install_for_server
  JUPYTER_SCHEME=https
  if [[ $tls == self-signed ]]; then
    JUPYTER_TLS_NOTE="TLS certificate SHA-256 fingerprint: $(tls_fingerprint "$JUPYTER_TLS_CERT")   (self-signed, $TLS_KEEP_DIR/jupyter.crt: compare it with what your browser shows, or trust that file)"
  else
    JUPYTER_TLS_NOTE="TLS certificate SHA-256 fingerprint: $(tls_fingerprint "$JUPYTER_TLS_CERT")   (JUPYTER_CERTFILE='$JUPYTER_CERTFILE')"
  fi
}

setup_jupyter_tls
# shellcheck disable=SC2034  # read by 10-jupyter.sh and 40-tensorboard.sh
readonly JUPYTER_SCHEME JUPYTER_TLS_CERT JUPYTER_TLS_KEY JUPYTER_TLS_NOTE JUPYTER_TLS_PIN
