#!/usr/bin/env python3
"""Writes the QDQ fixtures of hmct-ir/tests/fixtures/qdq/: the bundled float model
(examples/tiny_cnn/float_model.onnx) quantized by onnxruntime's `quantize_static` in
QDQ format, calibrated on examples/tiny_cnn/calibration_data, in two variants, plus
onnxruntime's outputs of each on the first samples of that data:

  u8s8_per_channel.onnx  uint8 activations (asymmetric, zero points), int8 weights
                         per output channel
  s8s8_per_tensor.onnx   int8 activations, int8 weights per tensor
  u8u8_per_channel.onnx  uint8 activations, uint8 weights per output channel (zero
                         point 128 per channel)
  <variant>/<output>/<i>.npy   onnxruntime's outputs (CPU, basic optimizations only
                         so the QDQ pairs are run as written, not fused into QLinear ops)
  float/<output>/<i>.npy onnxruntime's outputs of the float model
  data/input/<i>.npy     the samples these outputs are of, so the fixtures do not
                         depend on the example staying as it was

The Rust tests load each model (the loader turns the pairs into HzCalibration nodes)
and compare our interpreter's outputs with these. Deterministic: MinMax calibration,
no randomness. Pinned: tools/requirements.txt (onnx 1.23.2, onnxruntime 1.32.0).
Usage: python tools/make_qdq_fixture.py [OUT_DIR [EXAMPLE_DIR]]
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                      QuantType, quantize_static)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "examples", "tiny_cnn")
SAMPLES = 2  # outputs stored per variant: enough to compare, small enough to commit


def samples():
    folder = os.path.join(EXAMPLE, "calibration_data", "input")
    names = sorted(os.listdir(folder), key=lambda f: int(f.split(".")[0]))
    return [np.load(os.path.join(folder, n)) for n in names]


class Reader(CalibrationDataReader):
    def __init__(self, data):
        self.it = iter([{"input": x} for x in data])

    def get_next(self):
        return next(self.it, None)


VARIANTS = {
    "u8s8_per_channel": dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                             per_channel=True),
    "s8s8_per_tensor": dict(activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            per_channel=False),
    "u8u8_per_channel": dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8,
                             per_channel=True),
}


def run(path, data, out):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    for i, x in enumerate(data[:SAMPLES]):
        for o, y in zip(outputs, session.run(outputs, {"input": x})):
            folder = os.path.join(out, o)
            os.makedirs(folder, exist_ok=True)
            np.save(os.path.join(folder, f"{i}.npy"), y)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        REPO, "hmct-ir", "tests", "fixtures", "qdq")
    os.makedirs(out, exist_ok=True)
    data = samples()
    for i, x in enumerate(data[:SAMPLES]):
        os.makedirs(os.path.join(out, "data", "input"), exist_ok=True)
        np.save(os.path.join(out, "data", "input", f"{i}.npy"), x)
    run(os.path.join(EXAMPLE, "float_model.onnx"), data, os.path.join(out, "float"))
    for name, kw in VARIANTS.items():
        path = os.path.join(out, name + ".onnx")
        quantize_static(os.path.join(EXAMPLE, "float_model.onnx"), path, Reader(data),
                        quant_format=QuantFormat.QDQ, calibrate_method=CalibrationMethod.MinMax,
                        **kw)
        model = onnx.load(path)
        onnx.checker.check_model(model)
        run(path, data, os.path.join(out, name))
        ops = {}
        for n in model.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        print(f"{path}: {ops}")


if __name__ == "__main__":
    main()
