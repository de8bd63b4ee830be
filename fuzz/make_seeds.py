"""Writes the seed corpora of the fuzz targets (run once with the repository's Python
venv: onnx, numpy). Seeds are small on purpose: libFuzzer caps mutated inputs at the
size of the largest seed, and small inputs run faster.

  onnx_loader: the stem of examples/tiny_cnn/calibrated_model.onnx (two HzCalibration
               nodes, a Conv, a Relu), and a few ONNX conformance models.
  npy_reader:  a slice of an example sample in every layout the reader accepts.
  list_arg:    the list forms of the seeds (DEBUGGER.md section 9) and near misses.
"""

import os
import sys

import numpy as np
import onnx
from onnx import helper

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(ROOT)
NODE_TESTS = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/onnx-node-tests/node"


def out(target, name, data):
    with open(os.path.join(ROOT, "corpus", target, name), "wb") as f:
        f.write(data)


# onnx_loader
m = onnx.load(os.path.join(REPO, "examples/tiny_cnn/calibrated_model.onnx"))
keep = m.graph.node[:4]  # input cal, weight cal, stem_conv, stem_relu
used = {i for n in keep for i in n.input}
inits = [t for t in m.graph.initializer if t.name in used]
out_vi = helper.make_tensor_value_info(keep[-1].output[0], onnx.TensorProto.FLOAT, None)
g = helper.make_graph(keep, "stem", list(m.graph.input), [out_vi], inits)
stem = helper.make_model(g, opset_imports=list(m.opset_import))
stem.ir_version = m.ir_version
out("onnx_loader", "tiny_cnn_stem.onnx", stem.SerializeToString())
for case in ["test_add", "test_conv_with_strides_padding", "test_gemm_default_no_bias",
             "test_softmax_axis_1", "test_reshape_reduced_dims", "test_concat_2d_axis_0",
             "test_if", "test_loop11", "test_constant", "test_cast_FLOAT_to_FLOAT16",
             "test_maxpool_2d_pads", "test_transpose_default", "test_slice",
             "test_gather_0", "test_resize_upsample_scales_nearest"]:
    path = os.path.join(NODE_TESTS, case, "model.onnx")
    if os.path.exists(path):
        out("onnx_loader", case + ".onnx", open(path, "rb").read())

# npy_reader
sample = np.load(os.path.join(REPO, "examples/tiny_cnn/calibration_data/input/0.npy"))
small = sample[:, :, :2, :3]


def npy(array):
    from io import BytesIO
    b = BytesIO()
    np.save(b, array)
    return b.getvalue()


out("npy_reader", "sample_slice_f4.npy", npy(np.ascontiguousarray(small)))
out("npy_reader", "sample_slice_fortran.npy", npy(np.asfortranarray(small)))
out("npy_reader", "sample_slice_big_endian.npy", npy(small.astype(">f4")))
out("npy_reader", "sample_slice_f2.npy", npy(small.astype(np.float16)))
out("npy_reader", "sample_slice_f8.npy", npy(small.astype(np.float64)))
out("npy_reader", "i64_1d.npy", npy(np.arange(5, dtype=np.int64)))
out("npy_reader", "u8_2d.npy", npy(np.arange(6, dtype=np.uint8).reshape(2, 3)))
out("npy_reader", "bool.npy", npy(np.array([True, False])))
out("npy_reader", "scalar.npy", npy(np.float32(1.5)))
out("npy_reader", "empty.npy", npy(np.zeros((0, 3), np.float32)))
out("npy_reader", "structured.npy", npy(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")])))

# list_arg
for i, text in enumerate([
    "['Conv_2','Conv_90']", '["a", "b"]', "[Conv_2,Conv_90]",
    "[['Conv_2'],['Conv_2','Conv_90']]", "[a,[b,c]]", "Conv_2", "'Conv_2'", "[]",
    "[a,b,]", "/encoder/_blocks.0/Mul", "['it\\'s','a\\\\b']", "[ a , [ b ] ]",
    "[a,[b", "[[[a]]]", "['a", "a]", "[,]", "[a b]", "[[]]", "['']",
]):
    out("list_arg", f"seed_{i:02}.txt", text.encode())
