#!/usr/bin/env python3
"""What running several samples as one batch buys a well-tuned engine: onnxruntime's
time per sample at batch 1 and at batch B on MODEL with its first axis made free.

docs/performance.md (session 20) uses it to decide whether to run a probe's samples
through its cone together. Exported graphs often fix the batch in their shapes (a
Reshape to [1, ...]); onnxruntime then fails at batch B, and so would batching there.

Pinned: onnx==1.23.2, onnxruntime==1.32.0, numpy (tools/requirements.txt). Usage:
    python tools/ort_batch.py MODEL [--batch 8] [--threads 1] [--runs 10]
"""
import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()

    m = onnx.load(args.model)
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    del m.graph.value_info[:]
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    rng = np.random.default_rng(0)
    for b in (1, args.batch):
        x = rng.standard_normal([b, *shape[1:]]).astype(np.float32)
        try:
            for _ in range(3):
                s.run(None, {inp.name: x})
        except Exception as e:  # a graph that fixes its batch
            print(f"batch {b}: fails ({str(e).splitlines()[0][:160]})")
            continue
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            s.run(None, {inp.name: x})
            times.append(time.perf_counter() - t)
        print(f"batch {b}: {np.median(times) * 1e3 / b:.2f} ms per sample")


if __name__ == "__main__":
    main()
