#!/bin/sh
# Alternates two hmct-debugger builds on whole zoo models and prints, per model, each
# one's median of the per-round medians and the ratios (B/A) of their minima and medians.
#
#   sh tools/ab_models.sh ROUNDS OLD_BINARY NEW_BINARY MODEL...
#
# MODEL names a directory of target/zoo (`cargo xtask zoo`). Each round runs
# `run target/zoo/MODEL/model.onnx target/zoo/MODEL/calibration_data --float --threads 1
# --repeat 5` with A, then B; set CALIBRATED=1 to run calibrated_model.onnx as written,
# CALIBRATED=off to run it with every calibration node OFF (a sensitivity probe's base);
# THREADS=2 runs at two threads.
set -eu
rounds=$1; a=$2; b=$3; shift 3
zoo=$(dirname "$0")/../target/zoo
case "${CALIBRATED:-0}" in
    1) file=calibrated_model.onnx; mode=--calibrated ;;
    off) file=calibrated_model.onnx; mode=--float ;;
    *) file=model.onnx; mode=--float ;;
esac
median_ms() {
    "$1" run "$zoo/$2/$file" "$zoo/$2/calibration_data" $mode --threads "${THREADS:-1}" --repeat 5 2>&1 |
        awk '/median time per run/ {print $5}'
}
for m in "$@"; do
    ta=""; tb=""
    i=0
    while [ $i -lt "$rounds" ]; do
        ta="$ta $(median_ms "$a" "$m")"
        tb="$tb $(median_ms "$b" "$m")"
        i=$((i + 1))
    done
    python3 - "$m" "$ta" "$tb" <<'PY'
import statistics as s, sys
m, a, b = sys.argv[1], [float(v) for v in sys.argv[2].split()], [float(v) for v in sys.argv[3].split()]
print(f"{m:28s} A {s.median(a):8.2f} B {s.median(b):8.2f} ms  minima {min(b) / min(a):.3f}  medians {s.median(b) / s.median(a):.3f}")
PY
done
