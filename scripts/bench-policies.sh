#!/usr/bin/env bash
# Writes the benchmark policy to DIR: a copy of policies/ whose `stale_after` admits the
# harness body's fixed time (2026-11-29), so nothing is shed as stale; with --never, the
# body's stream (vehicle.position) is classified never (streamed, unread). Used by
# scripts/profile.sh and scripts/instructions.sh.
#
# Usage (from the project root): scripts/bench-policies.sh DIR [--never]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$1
rm -rf "$DIR"
cp -r policies "$DIR"
sed -i 's/stale_after = "[^"]*"/stale_after = "3650d"/' "$DIR/streams.toml"
if [ "${2:-}" = --never ]; then
  python3 - "$DIR/streams.toml" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
s = re.sub(r'(\[streams\."vehicle\.position"\][^\[]*?supersession = )"[^"]*"', r'\1"never"', s, flags=re.S)
open(p, 'w').write(s)
PY
fi
