#!/usr/bin/env bash
# Build-time helper: `pip install` with the image's constraints and the
# optional build options for networks behind a TLS-intercepting proxy or a
# private mirror.  Used only by the Dockerfile; nothing it touches stays in
# the image.
#
#   PIP_INDEX_URL        build-arg: a mirror to use instead of the default index
#   PIP_EXTRA_INDEX_URL  build-arg: an additional index
#   PIP_TRUSTED_HOST     build-arg: a plain-HTTP mirror host
#   /run/secrets/pip_ca  BuildKit secret (id=pip_ca): extra CA certificate(s),
#                        PEM.  Appended to the system bundle in a temporary
#                        file that is deleted before the layer is committed.
#   TFMP_PIP_VERSION     if set: first install exactly this pip (with the same
#                        index, CA and constraints), then the packages with it
set -euo pipefail

log() { printf '[pip-install] %s\n' "$*" >&2; }

# Build-args arrive as (possibly empty) environment variables; an empty one
# must mean "not set", not "an index at ''".
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
  if [[ -z "${!var:-}" ]]; then unset "$var"; fi
done

ca_secret=/run/secrets/pip_ca
tmp_ca=""
cleanup() { if [[ -n "$tmp_ca" ]]; then rm -f "$tmp_ca"; fi; }
trap cleanup EXIT

if [[ -s "$ca_secret" ]]; then
  tmp_ca=$(mktemp /tmp/pip-ca.XXXXXX.pem)
  system_bundle=/etc/ssl/certs/ca-certificates.crt
  if [[ -r "$system_bundle" ]]; then cat "$system_bundle" >"$tmp_ca"; fi
  cat "$ca_secret" >>"$tmp_ca"
  export PIP_CERT="$tmp_ca"
  log "using the extra CA certificate from the pip_ca build secret"
fi
if [[ -n "${PIP_INDEX_URL:-}" ]]; then log "using the index given by the PIP_INDEX_URL build-arg"; fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ -n "${TFMP_PIP_VERSION:-}" ]]; then
  log "pip $(python3 -m pip --version | awk '{print $2}') -> ${TFMP_PIP_VERSION}"
  python3 -m pip install --no-cache-dir --progress-bar off "pip==${TFMP_PIP_VERSION}"
fi
python3 -m pip install --no-cache-dir --progress-bar off "$@"
