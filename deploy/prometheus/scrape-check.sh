#!/usr/bin/env bash
# A real scrape: starts shedgate (the given binary) and the Debian `prometheus` server on
# loopback, waits for one scrape, and checks through Prometheus's HTTP API that `up == 1`,
# that `shedgate_pressure` and a `shedgate_requests_total` series arrived, and that
# `promtool check metrics` finds no problem in a scraped page. Exits non-zero on any failure.
#
# Usage: deploy/prometheus/scrape-check.sh path/to/shedgate
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:?usage: scrape-check.sh path/to/shedgate}

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Free loopback ports, chosen by the kernel.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
proxy_port=$(free_port)
admin_port=$(free_port)
prom_port=$(free_port)
upstream_port=$(free_port) # nothing listens there: requests get 502, which is still counted

"$bin" serve --listen "127.0.0.1:$proxy_port" --admin-listen "127.0.0.1:$admin_port" \
  --upstream "http://127.0.0.1:$upstream_port" --policies policies \
  >"$work/shedgate.log" 2>&1 &
pids+=($!)

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: shedgate
    static_configs:
      - targets: ["127.0.0.1:$admin_port"]
EOF
prometheus --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/data" \
  --web.listen-address "127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)

wait_for() { # wait_for DESCRIPTION COMMAND...: up to 30 s
  local what=$1
  shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "scrape-check: timed out waiting for $what" >&2
  tail -20 "$work/shedgate.log" "$work/prometheus.log" >&2
  return 1
}

wait_for "shedgate's admin listener" curl -fsS "http://127.0.0.1:$admin_port/healthz"
# One request, so that a shedgate_requests_total series exists (a never-shed stream; the
# upstream is down, so it is counted as upstream_error).
curl -sS -o /dev/null -X POST -H 'X-Stream: geofence.transition' -d '{}' \
  "http://127.0.0.1:$proxy_port/ingest" || true

query() { # query PROMQL: prints the number of result series
  curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
    jq -e '.status == "success"' >/dev/null &&
    curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
    jq '.data.result | length'
}
has() { [ "$(query "$1")" -ge 1 ]; }

wait_for "Prometheus to scrape shedgate (up == 1)" has 'up{job="shedgate"} == 1'
wait_for "shedgate_pressure in Prometheus" has 'shedgate_pressure{job="shedgate"}'
wait_for "a shedgate_requests_total series in Prometheus" has 'shedgate_requests_total{job="shedgate"}'
echo "scrape-check: Prometheus scraped shedgate: up == 1, shedgate_pressure and shedgate_requests_total present"

curl -fsS "http://127.0.0.1:$admin_port/metrics" >"$work/metrics.txt"
if ! problems=$(promtool check metrics <"$work/metrics.txt" 2>&1); then
  echo "scrape-check: promtool check metrics failed:" >&2
  echo "$problems" >&2
  exit 1
fi
if [ -n "$problems" ]; then
  echo "scrape-check: promtool check metrics reports problems:" >&2
  echo "$problems" >&2
  exit 1
fi
echo "scrape-check: promtool check metrics: no problems"
