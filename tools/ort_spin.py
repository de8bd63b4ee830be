#!/usr/bin/env python3
"""How long onnxruntime's worker threads keep a core busy after a run: the process's
CPU time at 1, 2, 5, ... 100 ms after each of a few runs, with the main thread
asleep. With two threads the worker spins about 45 ms after every run (onnxruntime
1.32, `intra_op.allow_spinning` at its default), which is why `cargo xtask bench-ort`
pauses before each single run and each block of warm runs: an engine started within
that time shares the cores with the spin.

Pinned: onnxruntime==1.32.0, numpy (tools/requirements.txt). Usage:
    python tools/ort_spin.py MODEL DATA [--threads 2] [--runs 4]
"""
import argparse
import resource
import time

import numpy as np
import onnxruntime as ort

from ort_profile import sample_path


def cpu_ms():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.load(sample_path(args.data, i.name)) for i in sess.get_inputs()}
    sess.run(None, feeds)
    marks = [1, 2, 5, 10, 20, 50, 100]
    print("CPU ms used this long after a run (getrusage ticks are 4 ms on many kernels):")
    print("after ms " + " ".join(f"{m:>6}" for m in marks))
    for _ in range(args.runs):
        time.sleep(0.5)
        sess.run(None, feeds)
        start, cpu0 = time.perf_counter(), cpu_ms()
        used = []
        for m in marks:
            while time.perf_counter() - start < m / 1e3:
                time.sleep(0.0002)
            used.append(cpu_ms() - cpu0)
        print("cpu ms   " + " ".join(f"{u:>6.1f}" for u in used))


if __name__ == "__main__":
    main()
