#!/usr/bin/env python3
"""A part of a model as a model of its own, with random inputs, to time its nodes in
isolation against the same nodes in the whole model (`hmct-debugger run OUT.onnx
OUT_data --float --threads 1 --repeat 200 --profile`).

`--node NAME` takes one node (with its initializers); `--inputs`/`--outputs` take the
sub-graph between tensors (onnx.utils.extract_model). The data folder gets four
samples of |N(0, 1)| (non-negative, like activations after Relu/Clip).

`--input-shape N,C,H,W` gives the (first) input its shape where shape inference
cannot (a model whose sizes are computed at run time, as YOLOv8n's after its
upsamples).

Pinned: onnx==1.23.2, numpy (tools/requirements.txt). Usage:
    python tools/extract_subgraph.py MODEL OUT (--node NAME | --inputs A,B --outputs C)
        [--input-shape N,C,H,W]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import helper, shape_inference


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", help="writes OUT.onnx and OUT_data/")
    ap.add_argument("--node")
    ap.add_argument("--inputs")
    ap.add_argument("--outputs")
    ap.add_argument("--input-shape", help="comma-separated dims of the first input")
    args = ap.parse_args()

    m = shape_inference.infer_shapes(onnx.load(args.model))
    g = m.graph
    if args.node:
        node = next((n for n in g.node if n.name == args.node), None)
        if node is None:
            raise SystemExit(f"no node named {args.node!r}")
        inits = [i for i in g.initializer if i.name in node.input]
        init_names = {i.name for i in inits}
        known = {v.name: v for v in list(g.value_info) + list(g.input)}
        inputs = [known[i] for i in node.input if i and i not in init_names]
        out = helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)
        sub = helper.make_model(
            helper.make_graph([node], "node", inputs, [out], inits),
            opset_imports=m.opset_import,
        )
        onnx.save(sub, args.out + ".onnx")
    else:
        tmp = args.out + "_inferred.onnx"
        onnx.save(m, tmp)
        onnx.utils.extract_model(
            tmp, args.out + ".onnx", args.inputs.split(","), args.outputs.split(",")
        )
        os.remove(tmp)
        sub = shape_inference.infer_shapes(onnx.load(args.out + ".onnx"))
    if args.input_shape:
        dims = [int(d) for d in args.input_shape.split(",")]
        first = sub.graph.input[0].type.tensor_type.shape
        del first.dim[:]
        for d in dims:
            first.dim.add().dim_value = d
        onnx.save(sub, args.out + ".onnx")
    rng = np.random.default_rng(0)
    for v in sub.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        d = os.path.join(args.out + "_data", v.name.replace("/", "_").replace(":", "_"))
        os.makedirs(d, exist_ok=True)
        for i in range(4):
            np.save(os.path.join(d, f"{i}.npy"), np.abs(rng.standard_normal(shape)).astype(np.float32))
    print(f"{args.out}.onnx: {len(sub.graph.node)} node(s), inputs "
          + ", ".join(f"{v.name} {[d.dim_value for d in v.type.tensor_type.shape.dim]}" for v in sub.graph.input))


if __name__ == "__main__":
    main()
