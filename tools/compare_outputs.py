#!/usr/bin/env python3
"""How far two `hmct-debugger run ... -o DIR` output folders are apart: per output file
present in both, the largest absolute difference and the largest absolute value, and
whether the bits are the same. For saying how much a changed summation order moved a
model's outputs.

Pinned: numpy (tools/requirements.txt). Usage:
    python tools/compare_outputs.py DIR_A DIR_B
"""
import pathlib
import sys

import numpy as np


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a_dir, b_dir = map(pathlib.Path, sys.argv[1:])
    files = sorted(p.relative_to(a_dir) for p in a_dir.rglob("*.npy"))
    if not files:
        sys.exit(f"no .npy files under {a_dir}")
    worst = 0.0
    for rel in files:
        other = b_dir / rel
        if not other.exists():
            print(f"{rel}: missing in {b_dir}")
            continue
        a, b = np.load(a_dir / rel), np.load(other)
        if a.shape != b.shape:
            print(f"{rel}: shapes {a.shape} and {b.shape}")
            continue
        same = a.tobytes() == b.tobytes()
        diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
        worst = max(worst, diff)
        print(f"{rel}: {'same bits' if same else 'differ'}, max abs diff {diff:.3g}, "
              f"max abs value {float(np.abs(a).max()) if a.size else 0.0:.3g}")
    print(f"largest difference: {worst:.3g}")


if __name__ == "__main__":
    main()
