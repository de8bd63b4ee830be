#!/usr/bin/env python3
"""onnxruntime's side of `hmct-debugger run MODEL DATA --profile`: kernel time per op
type and the slowest nodes, from onnxruntime's own profiler
(`SessionOptions.enable_profiling`), on the first sample of a calibration-data folder.
Use the float model (onnxruntime cannot run HzCalibration nodes).

onnxruntime fuses and re-lays-out nodes (e.g. Conv+activation in NCHWc, with
ReorderInput/ReorderOutput nodes), so its op types and node names differ from ours.

Pinned: onnxruntime==1.32.0, numpy (tools/requirements.txt). Usage:
    python tools/ort_profile.py MODEL DATA [--threads 1] [--runs 5] [--slowest 10]
"""
import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort


def sample_path(data, name):
    """The first sample of input `name`: its folder is named after it, with `/` and `:`
    as `_` where the name has them (as `hmct-debugger` and extract_subgraph.py name
    it)."""
    raw = os.path.join(data, name, "0.npy")
    if os.path.exists(raw):
        return raw
    return os.path.join(data, name.replace("/", "_").replace(":", "_"), "0.npy")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("data", help="calibration-data folder: one sub-folder per input")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--slowest", type=int, default=10,
                    help="how many of the slowest nodes to list by name")
    args = ap.parse_args()

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_profiling = True
    # onnxruntime opens its profile file when the session is made, in the working
    # directory by default, and leaves it there (empty) if the model fails to load.
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort_profile")
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    feed = {i.name: np.load(sample_path(args.data, i.name)) for i in session.get_inputs()}
    for _ in range(args.runs):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    os.remove(f.name)

    by_op, by_node = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
            by_node[(e["name"][: -len("_kernel_time")], e["args"]["op_name"])] += e["dur"]
    total = sum(by_op.values())
    ms = lambda us: us / args.runs / 1e3  # noqa: E731
    print(f"time per run by op type ({ms(total):.3f} ms in kernels, {args.runs} runs):")
    for op, us in by_op.most_common():
        print(f"{op:<24} {ms(us):>10.3f} {100 * us / total:>6.1f}%")
    print("\nslowest nodes:")
    for (name, op), us in by_node.most_common(args.slowest):
        print(f"{name:<40} {op:<16} {ms(us):>10.3f} {100 * us / total:>6.1f}%")


if __name__ == "__main__":
    main()
