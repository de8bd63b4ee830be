#!/usr/bin/env python3
"""Alternates two `kernel_table` builds and prints, per shape, each one's least time
and the median and range of the per-round ratios (B/A).

    python3 tools/ab_kernels.py OLD_KERNEL_TABLE NEW_KERNEL_TABLE [FILTER] [--rounds 5] [--runs 10] [--cold]

Build each side with `cargo build --release -p hmct-benches --bin kernel_table` and copy
`target/release/kernel_table` aside. Rounds alternate the order (A B, B A, ...) so that
a host's drift weighs on both sides; read ratios, not times.
"""
import argparse
import statistics
import subprocess


def times(exe, filt, runs, cold):
    cmd = [exe, filt, "--runs", str(runs)] + (["--cold"] if cold else [])
    out = subprocess.run(cmd, capture_output=True, text=True,
                         check=True).stdout
    got = {}
    for line in out.splitlines():
        f = line.split()
        # shape, ms, GFLOP/s, % of peak; or pool, ms, GB/s
        if len(f) == 4 and f[3].endswith("%"):
            got[f[0]] = float(f[1])
        elif len(f) == 3 and f[0] != "pool":
            got[f[0]] = float(f[1])
    return got


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("filter", nargs="?", default="")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--cold", action="store_true", help="pass --cold to kernel_table")
    args = p.parse_args()
    res = {args.a: {}, args.b: {}}
    for r in range(args.rounds):
        for exe in ([args.a, args.b] if r % 2 == 0 else [args.b, args.a]):
            for shape, ms in times(exe, args.filter, args.runs, args.cold).items():
                res[exe].setdefault(shape, []).append(ms)
    for shape, ta in res[args.a].items():
        tb = res[args.b].get(shape, [])
        ratios = sorted(y / x for x, y in zip(ta, tb))
        if not ratios:
            continue
        print(f"{shape:34s} A {min(ta):8.3f} B {min(tb):8.3f} ms  B/A median "
              f"{statistics.median(ratios):.3f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]  "
              f"least {min(tb) / min(ta):.3f}")


if __name__ == "__main__":
    main()
