#!/usr/bin/env bash
# A CPU profile of shedgate under the shared harness's throughput load: the harness's fast
# upstream (nginx `return 204` on 18080), shedgate pinned to core 1 in front of it, wrk on
# core 0 with the harness's 312-byte vehicle.position body (2 threads, 64 connections), and
# `perf record -g` on shedgate meanwhile. Loopback only; bounded in time.
#
# Usage (from the project root, as root, after `cargo build --release`):
#   scripts/profile.sh [--seconds N] [--never] [--dwarf] [--out DIR]
# --never profiles the `never` path (the stream classified never: streamed, unread).
# --dwarf unwinds call stacks from DWARF debug info (299 samples a second, about 3.5 MB of
# perf.data a second) instead of frame pointers, which the release build omits: the
# frame-pointer stacks stop one or two frames up, so callers (who copies, who allocates)
# show only with --dwarf.
# Writes DIR/perf.data, DIR/report.txt (flat, top symbols) and, if inferno is installed
# (`cargo install inferno`), DIR/flamegraph.svg. Needs: perf (`apt-get install linux-perf`),
# wrk and nginx (`apt-get install wrk nginx-light`).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_=10
NEVER=0
CALLGRAPH=(-F 999 -g)
OUT=${TMPDIR:-/tmp}/shedgate-profile
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_=$2; shift 2 ;;
    --never) NEVER=1; shift ;;
    --dwarf) CALLGRAPH=(-F 299 --call-graph dwarf,16384); shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
BENCH=../shared/bench
for t in perf wrk nginx taskset; do
  command -v $t >/dev/null || { echo "missing $t" >&2; exit 1; }
done
[ -x target/release/shedgate ] || { echo "build first: cargo build --release" >&2; exit 1; }
mkdir -p "$OUT/nginx/logs" "$OUT/nginx/tmp"

# The policy of policies/ with a stale_after that admits the body's fixed time; with --never
# the body's stream is classified never.
POL="$OUT/policies"
scripts/bench-policies.sh "$POL" $([ "$NEVER" = 1 ] && echo --never)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

taskset -c 1 nginx -p "$OUT/nginx/" -e "$OUT/nginx/logs/error.log" -c "$(realpath $BENCH/conf/upstream-nginx.conf)" &
pids+=($!)
taskset -c 1 target/release/shedgate serve --listen 127.0.0.1:18083 --admin-listen 127.0.0.1:19083 \
  --upstream http://127.0.0.1:18080 --policies "$POL" --max-inflight 4096 2>"$OUT/shedgate.log" &
SG=$!
pids+=($SG)
for _ in $(seq 100); do
  curl -s -o /dev/null http://127.0.0.1:19083/healthz && break
  sleep 0.1
done

# Warm up, then record while wrk runs.
timeout 20 taskset -c 0 wrk -t2 -c64 -d3s -s "$BENCH/post.lua" http://127.0.0.1:18083/ingest >/dev/null
perf record "${CALLGRAPH[@]}" -p "$SG" -o "$OUT/perf.data" -- sleep "$SECONDS_" 2>"$OUT/perf.log" &
PERF=$!
timeout $((SECONDS_ + 10)) taskset -c 0 wrk -t2 -c64 -d"${SECONDS_}s" --latency -s "$BENCH/post.lua" \
  http://127.0.0.1:18083/ingest >"$OUT/wrk.txt"
wait "$PERF" || true
perf report -i "$OUT/perf.data" --no-children --stdio --percent-limit 0.7 2>/dev/null \
  | grep -v '^$' >"$OUT/report.txt" || true
if command -v inferno-collapse-perf >/dev/null; then
  perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph \
    >"$OUT/flamegraph.svg"
fi
grep -E "Requests/sec|99%" "$OUT/wrk.txt"
echo "profile: $OUT/report.txt${OUT:+ $([ -f "$OUT/flamegraph.svg" ] && echo "and $OUT/flamegraph.svg")}"
