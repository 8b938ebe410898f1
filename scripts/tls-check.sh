#!/usr/bin/env bash
# shedgate over TLS with real tools (scripts/tls-check.py has the details): testssl.sh with a
# test CA; TLS 1.0/1.1 and weak suites refused (openssl s_client); curl (HTTP/1.1 and
# --http2), Python requests, h2load, the CloudEvents and Standard Webhooks client libraries,
# each decided and shed as over plain HTTP; certificates rotated every second for a minute
# under load (acknowledged => delivered; a broken pair changes nothing). About 2-3 minutes.
#
# Installs what is missing: Debian testssl.sh, nghttp2-client, openssl, curl (apt, as root);
# requests, cloudevents, standardwebhooks from PyPI into a venv under target/. Exits 77 with a
# WARNING when one cannot be installed (.ci/run then skips loudly), 1 when a check fails.
#
# Usage: scripts/tls-check.sh path/to/shedgate      (ROTATE_S=60 seconds of rotation)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:?usage: tls-check.sh path/to/shedgate}")

skip() {
  echo "################################################################" >&2
  echo "WARNING: $1: the TLS check (testssl, real clients, rotation) did NOT run" >&2
  echo "################################################################" >&2
  exit 77
}

missing=()
command -v testssl >/dev/null 2>&1 || missing+=(testssl.sh)
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 || true
  for tool in testssl h2load openssl curl; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool could not be installed (Debian: ${missing[*]})"
  done
fi

venv=target/tls-check
if ! "$venv/bin/python" -c 'import requests, cloudevents.core, standardwebhooks' >/dev/null 2>&1; then
  # Debian's python3 makes venvs only with its python3-venv package (ensurepip).
  if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null 2>&1 || true
    python3 -m venv --clear "$venv" || skip "the venv $venv could not be made (Debian: python3-venv)"
  fi
  "$venv/bin/pip" install --quiet 'requests==2.34.2' 'cloudevents==2.2.0' 'standardwebhooks==1.3.0' ||
    skip "requests, cloudevents or standardwebhooks could not be installed from PyPI"
fi

exec "$venv/bin/python" scripts/tls-check.py "$bin"
