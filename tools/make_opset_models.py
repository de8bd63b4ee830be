#!/usr/bin/env python3
"""Writes small float models at default-domain opsets 9, 11, 12, 13 and 17, each using
the operators whose signature changed between opsets (attributes that became inputs,
changed defaults, deprecated ops), with calibration data, for the export-qdq test
(hmct-cli/tests/export_qdq.rs): calibrate, export (which raises the opset to what
the standard QuantizeLinear needs and converts those nodes), then onnxruntime.

  opset9_nhwc   NHWC ResNet-style block (Transpose, Conv, BatchNormalization, MaxPool,
                residual Add), Clip/Pad/Slice/Squeeze/Unsqueeze/ReduceMean/Dropout
                with attributes, Upsample, a classifier, and Softmax on a
                4-D tensor (axis 1: the old 2-D coercion) and on the logits
  opset11       Resize-11, Clip with inputs, Split/Squeeze/ReduceSum with attributes,
                Softmax on a 4-D tensor
  opset12       Dropout-12, Unsqueeze/ReduceSum attributes, LogSoftmax axis 1 on 4-D
  opset13       Split-13 without sizes, ReduceMean attribute (changes at 18)
  opset17       ReduceMax attribute, Split, Resize-13

Each model is MODEL_DIR/<name>/model.onnx with MODEL_DIR/<name>/data/input/<i>.npy
(3 samples). Deterministic (fixed seed). Pinned: tools/requirements.txt (onnx
1.23.2, onnxruntime 1.32.0, numpy); the checker and onnxruntime accept each model.
Usage: python tools/make_opset_models.py OUT_DIR
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SAMPLES = 3


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = 0

    def name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, base, array):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def op(self, op_type, inputs, n_out=1, out=None, **attrs):
        outs = [out] if out else [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x, c_in, c_out, k=3, bn=True):
        w = self.const("w", (self.rng.standard_normal((c_out, c_in, k, k)) /
                             np.sqrt(c_in * k * k)).astype(np.float32))
        b = self.const("b", (0.1 * self.rng.standard_normal(c_out)).astype(np.float32))
        y = self.op("Conv", [x, w, b], pads=[k // 2] * 4)
        if bn:
            scale = self.const("scale", (1 + 0.2 * self.rng.standard_normal(c_out)).astype(np.float32))
            bias = self.const("bias", (0.1 * self.rng.standard_normal(c_out)).astype(np.float32))
            mean = self.const("mean", (0.1 * self.rng.standard_normal(c_out)).astype(np.float32))
            var = self.const("var", (1 + 0.1 * self.rng.random(c_out)).astype(np.float32))
            y = self.op("BatchNormalization", [y, scale, bias, mean, var])
        return y

    def model(self, opset, inputs, outputs):
        graph = helper.make_graph(self.nodes, f"opset{opset}", inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="make_opset_models.py")
        m.ir_version = {9: 4, 11: 6, 12: 7, 13: 7, 17: 8}[opset]
        onnx.checker.check_model(m)
        return m


def tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def opset9_nhwc():
    b = Builder(9)
    x = b.op("Transpose", ["input"], perm=[0, 3, 1, 2])
    x = b.op("Relu", [b.conv(x, 3, 8)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    skip = x
    y = b.op("Relu", [b.conv(x, 8, 8)])
    y = b.conv(y, 8, 8)
    x = b.op("Relu", [b.op("Add", [y, skip])])
    x = b.op("Clip", [x], min=0.0, max=6.0)
    x = b.op("Upsample", [x, b.const("scales", np.array([1, 1, 2, 2], np.float32))],
             mode="nearest")
    x = b.op("Pad", [x], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="constant", value=0.5)
    x = b.op("Relu", [b.conv(x, 8, 8)])
    x = b.op("Slice", [x], starts=[1, 1], ends=[9, 9], axes=[2, 3])
    x = b.op("Dropout", [x], ratio=0.3)
    spatial = b.op("Softmax", [x])  # axis 1 over C*H*W, the pre-13 meaning
    pooled = b.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    flat = b.op("Squeeze", [pooled], axes=[2, 3])
    w = b.const("fc", (b.rng.standard_normal((10, 8)) / 3).astype(np.float32))
    bias = b.const("fc_bias", np.zeros(10, np.float32))
    logits = b.op("Gemm", [flat, w, bias], transB=1)
    logits = b.op("Unsqueeze", [logits], axes=[1])
    b.op("Softmax", [logits], axis=2, out="prob")
    b.op("Transpose", [spatial], perm=[0, 2, 3, 1], out="spatial_nhwc")
    return b.model(9, [tensor("input", [1, 16, 16, 3])],
                   [tensor("prob", [1, 1, 10]), tensor("spatial_nhwc", [1, 8, 8, 8])]), [1, 16, 16, 3]


def opset11():
    b = Builder(11)
    x = b.op("Relu", [b.conv("input", 3, 8)])
    x = b.op("Clip", [x, b.const("lo", np.array(0, np.float32)), b.const("hi", np.array(4, np.float32))])
    roi = b.const("roi", np.array([], np.float32))
    x = b.op("Resize", [x, roi, b.const("scales", np.array([1, 1, 2, 2], np.float32))],
             mode="linear", coordinate_transformation_mode="half_pixel")
    a, c = b.op("Split", [x], n_out=2, axis=1, split=[3, 5])
    a = b.op("Relu", [b.conv(a, 3, 5, bn=False)])
    x = b.op("Add", [a, c])
    b.op("Softmax", [x], out="soft")
    s = b.op("ReduceSum", [x], axes=[2, 3], keepdims=0)
    s = b.op("Unsqueeze", [s], axes=[2])
    b.op("Squeeze", [s], axes=[2], out="pooled")
    return b.model(11, [tensor("input", [1, 3, 8, 8])],
                   [tensor("pooled", [1, 5]), tensor("soft", [1, 5, 16, 16])]), [1, 3, 8, 8]


def opset12():
    b = Builder(12)
    x = b.op("Relu", [b.conv("input", 3, 6)])
    x = b.op("Dropout", [x, b.const("ratio", np.array(0.2, np.float32))])
    x = b.op("Relu", [b.conv(x, 6, 6)])
    b.op("LogSoftmax", [x], axis=1, out="logsoft")
    s = b.op("ReduceSum", [x], axes=[1], keepdims=1)
    b.op("Mul", [s, b.const("k", np.array(0.5, np.float32))], out="sum")
    return b.model(12, [tensor("input", [1, 3, 8, 8])],
                   [tensor("sum", [1, 1, 8, 8]), tensor("logsoft", [1, 6, 8, 8])]), [1, 3, 8, 8]


def opset13():
    b = Builder(13)
    x = b.op("Relu", [b.conv("input", 3, 8)])
    a, c = b.op("Split", [x], n_out=2, axis=1)
    x = b.op("Mul", [a, c])
    x = b.op("Relu", [b.conv(x, 4, 4)])
    m = b.op("ReduceMean", [x], axes=[3], keepdims=1)
    b.op("Add", [x, m], out="out")
    return b.model(13, [tensor("input", [1, 3, 8, 8])], [tensor("out", [1, 4, 8, 8])]), [1, 3, 8, 8]


def opset17():
    b = Builder(17)
    x = b.op("Relu", [b.conv("input", 3, 6)])
    a, c, d = b.op("Split", [x], n_out=3, axis=1)
    x = b.op("Concat", [b.op("Add", [a, c]), d], axis=1)
    x = b.op("Resize", [x, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))],
             mode="nearest")
    x = b.op("Relu", [b.conv(x, 4, 4)])
    m = b.op("ReduceMax", [x], axes=[2, 3], keepdims=1)
    b.op("Sub", [x, m], out="out")
    return b.model(17, [tensor("input", [1, 3, 8, 8])], [tensor("out", [1, 4, 16, 16])]), [1, 3, 8, 8]


MODELS = {"opset9_nhwc": opset9_nhwc, "opset11": opset11, "opset12": opset12,
          "opset13": opset13, "opset17": opset17}


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    for name, make in MODELS.items():
        model, shape = make()
        folder = os.path.join(out, name)
        os.makedirs(os.path.join(folder, "data", "input"), exist_ok=True)
        path = os.path.join(folder, "model.onnx")
        onnx.save(model, path)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for i in range(SAMPLES):
            x = rng.standard_normal(shape).astype(np.float32)
            session.run(None, {"input": x})
            np.save(os.path.join(folder, "data", "input", f"{i}.npy"), x)
        print(f"{name}: {len(model.graph.node)} nodes")


if __name__ == "__main__":
    main()
