#!/usr/bin/env python3
"""Runs an ONNX model as it is (e.g. one written by `hmct-debugger export-qdq`) in
onnxruntime on a calibration-data folder and compares its outputs with the outputs our
interpreter wrote with `hmct-debugger run --calibrated -o OURS` (OURS/<output>/<i>.npy)
for the calibrated model it came from. onnx's checker must accept the model.

Same tolerance as check_calibrated.py: per output, the max abs difference below
`--rtol` times the largest |value| (except a fraction `--max-mismatch` of elements) and
cosine similarity above 0.99999. Prints one line per output; exit status 1 if any fails.

Pinned: onnx==1.23.2, onnxruntime==1.32.0, numpy. Usage:
    python tools/run_ort.py MODEL DATA OURS [--rtol 1e-3] [--max-mismatch 0]
"""
import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_calibrated import compare_with_ours  # noqa: E402
from ort_sensitivity import load_samples  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("ours", help="folder written by `hmct-debugger run --calibrated -o`")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--max-mismatch", type=float, default=0.0)
    args = p.parse_args()

    model = onnx.load(args.model)
    onnx.checker.check_model(model)
    ops = sorted({(n.domain or "ai.onnx", n.op_type) for n in model.graph.node
                  if n.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast", "HzCalibration")})
    print(f"onnx checker: ok ({len(model.graph.node)} nodes; {ops})")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in sess.get_inputs()]
    samples = load_samples(args.data, inputs, None)

    failed = compare_with_ours(sess, samples, args.ours, args.rtol, args.max_mismatch)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
