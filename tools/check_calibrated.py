#!/usr/bin/env python3
"""Checks a calibrated model written by `hmct-debugger calibrate` with onnx and
onnxruntime, independently of our interpreter:

1. onnx's checker accepts the model (the `horizon` domain is custom, so its nodes are
   checked for structure only);
2. the model with every HzCalibration node replaced the standard way (ON: QuantizeLinear
   -> DequantizeLinear, per-axis where per-channel; OFF: Identity; see
   ort_sensitivity.py) runs in onnxruntime, and its outputs match the outputs our
   interpreter wrote with `hmct-debugger run --calibrated -o OURS`
   (OURS/<output>/<i>.npy).

The two sides differ only by float rounding in the float ops, and a rounding
difference that moves a value across a quantization boundary moves it by a whole
quantization step, so the comparison is not bit-exact: per output, the max abs
difference must stay below `--rtol` times the output's largest |value| (except for a
fraction `--max-mismatch` of the elements, 0 by default) and the cosine similarity over
all samples above 0.99999. A wrong scale, rounding rule or axis is far outside that.
Deep int8 models whose output saturates (a sigmoid map) amplify single flips into
whole pixels: there, `--max-mismatch` says how many may differ. A flip early in a
network reaches every element of its sample downstream, which in a small output (ten
landmark values per sample) is more than any fraction allows: `--flip-samples` says in
how many samples the elements beyond the tolerance may lie instead (MTCNN's O-Net,
calibrated by percentiles: one conv output of one sample at 3.4999998 quantization steps
in onnxruntime and 3.5000036 in ours moved 7 of that sample's 10 landmarks). Prints one
line per output; exit status 1 if any fails.

Pinned: onnx==1.23.2, onnxruntime==1.32.0, numpy. Usage:
    python tools/check_calibrated.py MODEL DATA OURS [--rtol 1e-3] [--max-mismatch 0]
        [--flip-samples 0]
"""
import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_sensitivity import CalibratedModel, load_samples  # noqa: E402


def compare_with_ours(sess, samples, ours_dir, rtol, max_mismatch, flip_samples=0):
    """Runs `sess` on every sample and compares each output with our
    OURS/<output>/<i>.npy; prints one line per output, returns True if any fails.
    Elements beyond the tolerance pass when they are at most a fraction `max_mismatch`
    of the output's, or lie in at most `flip_samples` samples."""
    outputs = [o.name for o in sess.get_outputs()]
    failed = False
    for o in outputs:
        refs, mine = [], []
        for i, s in enumerate(samples):
            ref = sess.run([o], s)[0]
            path = os.path.join(ours_dir, o.replace("/", "_").replace(":", "_"), f"{i}.npy")
            ours = np.load(path)
            if ours.shape != ref.shape or ours.dtype != ref.dtype:
                print(f"{o}: sample {i}: ours {ours.dtype}{ours.shape} vs onnxruntime {ref.dtype}{ref.shape}")
                failed = True
                break
            refs.append(np.asarray(ref, np.float64).ravel())
            mine.append(np.asarray(ours, np.float64).ravel())
        else:
            a, b = np.concatenate(refs), np.concatenate(mine)
            if a.size == 0:
                print(f"{o}: empty")
                continue
            diff = np.abs(a - b)
            limit = rtol * float(np.max(np.abs(a)))
            mismatch = float(np.mean(diff > limit))
            off = sum(bool(np.any(np.abs(r - m) > limit)) for r, m in zip(refs, mine))
            denom = np.linalg.norm(a) * np.linalg.norm(b)
            cosine = float(np.dot(a, b) / denom) if denom > 0 else 1.0
            ok = (mismatch <= max_mismatch or off <= flip_samples) and cosine >= 0.99999
            failed |= not ok
            print(f"{o}: max abs diff {diff.max():.3g}, {mismatch:.4%} of elements beyond {limit:.3g} "
                  f"in {off} sample(s), cosine {cosine:.8f} over {len(samples)} sample(s): "
                  f"{'ok' if ok else 'MISMATCH'}")
    return failed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("ours", help="folder written by `hmct-debugger run --calibrated -o`")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--max-mismatch", type=float, default=0.0)
    p.add_argument("--flip-samples", type=int, default=0,
                   help="samples whose elements may all be off (one boundary flip early in "
                        "a network reaches every element of its sample downstream)")
    args = p.parse_args()

    model = onnx.load(args.model)
    onnx.checker.check_model(model)
    print(f"onnx checker: ok ({len(model.graph.node)} nodes)")

    cm = CalibratedModel(args.model)
    on = {name for name, c in cm.calibrations.items() if c.switch_on}
    qdq = cm.variant(on, [])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(qdq, so, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in sess.get_inputs()]
    samples = load_samples(args.data, inputs, None)

    failed = compare_with_ours(sess, samples, args.ours, args.rtol, args.max_mismatch,
                               args.flip_samples)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
