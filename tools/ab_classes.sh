#!/bin/sh
# Alternates two hmct-debugger builds on a zoo model's float form under `run --profile`
# and prints, per class of conv (tools/conv_classes.py), each one's least time per run
# over the rounds and the ratio (B/A): what a kernel change did inside the model, where
# whole-model times drift more than the change.
#
#   sh tools/ab_classes.sh ROUNDS OLD_BINARY NEW_BINARY MODEL [PYTHON]
#
# MODEL names a directory of target/zoo (`cargo xtask zoo`); PYTHON has onnx
# (default target/ort-venv/bin/python).
set -eu
rounds=$1; a=$2; b=$3; model=$4
here=$(dirname "$0")
py=${5:-$here/../target/ort-venv/bin/python}
dir=$here/../target/zoo/$model
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=0
while [ $i -lt "$rounds" ]; do
    for side in A B; do
        if [ $side = A ]; then bin=$a; else bin=$b; fi
        "$bin" run "$dir/model.onnx" "$dir/calibration_data" --float --threads 1 --repeat 20 \
            --profile --slowest 1000 > "$out/profile" 2>&1
        "$py" "$here/conv_classes.py" "$dir/model.onnx" "$out/profile" |
            awk -v s=$side 'NR > 1 && $1 != "total" {print s "\t" $0}' >> "$out/classes"
        awk -v s=$side '/median time per run/ {print s "\tTOTAL " $5}' "$out/profile" >> "$out/classes"
    done
    i=$((i + 1))
done
python3 - "$out/classes" <<'PY'
import collections, sys
least = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    side, rest = line.rstrip("\n").split("\t")
    name, ms = rest.rsplit(None, 1)
    least[name.strip()][side] = min(least[name.strip()].get(side, float("inf")), float(ms))
for name, t in sorted(least.items(), key=lambda kv: -kv[1].get("A", 0)):
    if "A" in t and "B" in t and t["A"] >= 0.05:
        print(f"{name:26s} A {t['A']:8.3f} B {t['B']:8.3f} ms  B/A {t['B'] / t['A']:.3f}")
PY
