#!/bin/bash
# Where a run's CPU time goes, by function: `perf record -e cpu-clock` shares of the
# top symbols for one or more hmct-debugger binaries on the same model (float, one
# thread). On a noisy shared host, shares compare two builds better than wall times
# (docs/performance.md, session 21). Needs Debian's linux-perf.
#
# Usage: tools/perf_shares.sh MODEL DATA [TOP] -- BIN [BIN ...]
set -euo pipefail
model=$1 data=$2; shift 2
top=12
if [ "$1" != "--" ]; then top=$1; shift; fi
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for bin in "$@"; do
  perf record -q -e cpu-clock -o "$out" "$bin" run "$model" "$data" --float --threads 1 --repeat 3 >/dev/null 2>&1
  echo "== $bin"
  perf report -i "$out" --no-children --stdio 2>/dev/null | grep '%' | grep -v '^#' | head -"$top" | awk '{print $1, $5}'
done
