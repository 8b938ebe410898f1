#!/usr/bin/env bash
# User-space instructions per request of shedgate and of nginx `proxy_pass`, counted by
# valgrind's callgrind: unlike CPU time, the count repeats from run to run whatever else the
# machine does (a VM's steal time made the harness's CPU figures vary threefold), so it
# measures a hot-path change where seconds cannot. Kernel work (the loopback sockets) is
# not counted: it is the same syscalls for both (docs/benchmark-history.md).
#
# Both proxies run in front of the harness's fast upstream (nginx `return 204` on 18080),
# one at a time under callgrind; oha sends the harness's 312-byte vehicle.position POST on 8
# keep-alive connections: 1,000 to warm up, then the counters are zeroed and N more are
# counted. Loopback only; bounded in count.
#
# Usage (from the project root, after `cargo build --release`, and `cargo build --release
# --example floor` for the floor):
#   scripts/instructions.sh [--requests N] [--never | --no] [--no-nginx] [--bin PATH]
# --bin counts another shedgate binary (a build to compare with; default
# target/release/shedgate), or the floor (target/release/examples/floor, docs/benchmark-history.md).
# Each line and profile is named after the binary's file name.
# --never counts the `never` path (the stream classified never: streamed, unread).
# --no counts the no: the pressure pinned at 0.8 and the body moved to Munich (the default
# rank, as ../shared/bench/no.lua), so every answer is a 503 (body read, ranked, shed with
# Retry-After and the problem document); the floor gets FLOOR_MIMIC=1 (body read, a canned
# 503). nginx, unchanged, still counts its `proxy_pass` of the same body.
# Needs valgrind, nginx (`apt-get install valgrind nginx-light`) and oha (`cargo install oha`).
# Writes the callgrind profiles under $TMPDIR/shedgate-instructions (`callgrind_annotate`
# reads them).
set -euo pipefail
cd "$(dirname "$0")/.."

N=4000
NEVER=0
NO=0
NGINX=1
BIN=target/release/shedgate
OUT=${TMPDIR:-/tmp}/shedgate-instructions
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) N=$2; shift 2 ;;
    --never) NEVER=1; shift ;;
    --no) NO=1; shift ;;
    --no-nginx) NGINX=0; shift ;;
    --bin) BIN=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$NEVER" = 1 ] && [ "$NO" = 1 ] && { echo "--never and --no count different paths: pick one" >&2; exit 2; }
BENCH=../shared/bench
for t in valgrind callgrind_control nginx oha curl; do
  command -v $t >/dev/null || { echo "missing $t" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
# Requests to another server on these ports would be counted as nothing: refuse to start.
for port in 18080 18083 19083 18181; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is in use: stop what listens there first" >&2
    exit 1
  fi
done
rm -rf "$OUT"
mkdir -p "$OUT/upstream/logs" "$OUT/upstream/tmp" "$OUT/proxy/logs" "$OUT/proxy/tmp"

POL="$OUT/policies"
scripts/bench-policies.sh "$POL" $([ "$NEVER" = 1 ] && echo --never)
# Berlin is in policies/areas.toml's rank-5 area; Munich is in none (default_rank, 50).
if [ "$NO" = 1 ]; then
  POSITION='"lat":48.137200,"lon":11.575600'
  PIN=0.8
  export FLOOR_MIMIC=1
else
  POSITION='"lat":52.520008,"lon":13.404954'
  PIN=0
fi
BODY='{"device_id":"veh-0042","fleet_id":"fleet-berlin-07",'"$POSITION"',"occurred_at":"2026-11-29T12:00:00Z","speed_kmh":41.5,"heading_deg":187.0,"odometer_km":128734.2,"battery_pct":76,"ignition":true,"driver_id":"drv-1187","trip_id":"trip-20261129-0042-03","seq":981234,"source":"telematics-gw-3"}'

# The floor (examples/floor.rs) reads the body whole unless the `never` path is counted.
export FLOOR_COLLECT=$([ "$NEVER" = 1 ] && echo 0 || echo 1)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

nginx -p "$OUT/upstream/" -e "$OUT/upstream/logs/error.log" -c "$(realpath $BENCH/conf/upstream-nginx.conf)" &
pids+=($!)

send() {
  oha -n "$1" -c 8 --no-tui -m POST -H 'content-type: application/json' \
    -H 'x-stream: vehicle.position' -d "$BODY" "http://127.0.0.1:$2/ingest" >"$OUT/oha-$2.txt"
  grep -q 'Success rate:.*100' "$OUT/oha-$2.txt" || { echo "requests to $2 failed" >&2; exit 1; }
}

# count NAME PORT CMD...: runs CMD under callgrind, warms up, counts N requests.
count() {
  local name=$1 port=$2
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.callgrind" "$@" \
    >"$OUT/$name.log" 2>&1 &
  local vg=$!
  pids+=($vg)
  for _ in $(seq 300); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$port/ingest" && break
    sleep 0.2
  done
  # The pressure pinned (shedgate's admin API; nginx has none): at 0 nothing is shed; at 0.8
  # (--no) the default rank is.
  if [ "$port" = 18083 ]; then
    curl -s -o /dev/null -X PUT -H 'content-type: application/json' -d "{\"pin\":$PIN}" \
      http://127.0.0.1:19083/pressure
  fi
  send 1000 "$port"
  callgrind_control -z "$vg" >/dev/null 2>&1
  send "$N" "$port"
  # --no: every counted answer a 503 (a device's first events may be admitted in the warm-up).
  if [ "$NO" = 1 ] && [ "$port" = 18083 ]; then
    grep -q "\[503\] $N responses" "$OUT/oha-$port.txt" ||
      { echo "not every answer from $port was a 503: $OUT/oha-$port.txt" >&2; exit 1; }
  fi
  callgrind_control -d "$vg" >/dev/null 2>&1
  sleep 1
  kill "$vg" 2>/dev/null || true
  wait "$vg" 2>/dev/null || true
  local f
  f=$(ls -t "$OUT/$name.callgrind".* | head -1)
  local ir
  ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
  echo "$name: $((ir / N)) instructions per request ($N requests; profile $f)"
}

count "$(basename "$BIN")" 18083 "$BIN" serve --listen 127.0.0.1:18083 \
  --admin-listen 127.0.0.1:19083 --upstream http://127.0.0.1:18080 --policies "$POL" \
  --max-inflight 4096
if [ "$NGINX" = 1 ]; then
  # The harness's proxy config on its own ports, one process (callgrind follows no fork).
  sed 's/127\.0\.0\.1:18081/127.0.0.1:18181/; s/127\.0\.0\.1:18091/127.0.0.1:18191/; s/127\.0\.0\.1:18092/127.0.0.1:18192/; s/^daemon off;/daemon off;\nmaster_process off;/' \
    "$BENCH/conf/proxy-nginx.conf" >"$OUT/proxy-nginx.conf"
  count nginx 18181 nginx -p "$OUT/proxy/" -e "$OUT/proxy/logs/error.log" -c "$OUT/proxy-nginx.conf"
fi
