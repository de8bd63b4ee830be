#!/usr/bin/env python3
"""Time per run by class of conv (depthwise, pointwise, other kernels; with the output
map's size), from `hmct-debugger run MODEL DATA --profile --slowest 1000` and,
optionally, `tools/ort_profile.py MODEL DATA --slowest 1000` on the same float model:
where a model's time goes, and where it goes against onnxruntime's.

onnxruntime names a fused Conv+activation node by its output (`..._nchwc` in NCHWc);
such a node, and an activation it runs apart (`.../QuickGeluFusion/`, its SiLU), is
traced back to its Conv through first inputs, as ours runs them fused into the conv.

Pinned: onnx (tools/requirements.txt). Usage:
    python tools/conv_classes.py MODEL OURS_PROFILE.txt [ORT_PROFILE.txt] [--nodes REGEX]

`--nodes REGEX` lists the nodes of the classes REGEX matches one by one, with their
input channels, instead of the class table.
"""
import argparse
import collections
import re
import signal

import onnx
from onnx import shape_inference


def conv_class(node, shapes, inits):
    if node.op_type != "Conv":
        return node.op_type
    w = inits.get(node.input[1])
    if w is None:
        return "Conv (weight not constant)"
    attrs = {a.name: a for a in node.attribute}
    group = attrs["group"].i if "group" in attrs else 1
    stride = list(attrs["strides"].ints) if "strides" in attrs else [1]
    out = shapes.get(node.output[0], [])
    where = "x".join(str(d) for d in out[2:]) or "?"
    kernel = "x".join(str(d) for d in w[2:])
    s = f"s{stride[0]}" if stride[0] > 1 else ""
    if group > 1 and group == w[0]:
        kind = f"dw{kernel}{s}"
    elif group > 1:
        kind = f"group {kernel}{s}"
    else:
        kind = f"{kernel}{s}"
    return f"{kind} @{where}"


def main():
    # Piped into `head`, stop quietly when the reader goes away.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ours")
    ap.add_argument("ort", nargs="?")
    ap.add_argument("--nodes", help="list the nodes of the classes this regex matches")
    args = ap.parse_args()
    m = shape_inference.infer_shapes(onnx.load(args.model))
    g = m.graph
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(g.value_info) + list(g.output) + list(g.input)
    }
    inits = {i.name: list(i.dims) for i in g.initializer}
    by_name = {n.name: n for n in g.node}
    producer = {o: n for n in g.node for o in n.output}

    products = ("Conv", "Gemm", "MatMul")
    activations = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Mul", "Tanh")

    def conv_of(output):
        """The conv whose output `output` is, through activations; None if none."""
        n = producer.get(output)
        while n is not None and n.op_type in activations:
            n = producer.get(n.input[0])
        return n if n is not None and n.op_type in products else None

    ours = collections.defaultdict(float)
    ours_node = collections.defaultdict(float)
    ort_node = collections.defaultdict(float)
    for line in open(args.ours):
        f = line.split()
        if len(f) >= 4 and f[-1].endswith("%") and f[0] in by_name:
            ours[conv_class(by_name[f[0]], shapes, inits)] += float(f[-2])
            ours_node[f[0]] += float(f[-2])
    ort = collections.defaultdict(float)
    if args.ort:
        in_nodes = False
        for line in open(args.ort):
            if line.startswith("slowest nodes"):
                in_nodes = True
                continue
            f = line.split()
            if in_nodes and len(f) >= 4 and f[-1].endswith("%"):
                name = re.sub(r"(_nchwc|/QuickGeluFusion/)$", "", f[0])
                n = by_name.get(name) or producer.get(name)
                # A fused node, or an activation onnxruntime runs apart (its SiLU,
                # QuickGelu), counts with its conv, as ours runs them fused.
                if name != f[0] and n is not None and n.op_type not in products:
                    n = conv_of(n.output[0]) or n
                if n is not None:
                    ort[conv_class(n, shapes, inits)] += float(f[-2])
                    ort_node[n.name] += float(f[-2])
    if args.nodes:
        pattern = re.compile(args.nodes)
        print(f"{'node':60s} {'class':18s} {'in ch':>6s} {'ours ms':>8s} {'ort ms':>8s}")
        for n in g.node:
            k = conv_class(n, shapes, inits)
            if not pattern.search(k) or n.name not in ours_node:
                continue
            channels = (shapes.get(n.input[0]) or [0, 0])[1]
            print(f"{n.name[-60:]:60s} {k:18s} {channels:6d} {ours_node[n.name]:8.3f}"
                  f" {ort_node.get(n.name, 0.0):8.3f}")
        return
    keys = sorted(set(ours) | set(ort), key=lambda k: -(ours[k] - ort[k] if args.ort else ours[k]))
    print(f"{'class':26s} {'ours ms':>8s}" + (f" {'ort ms':>8s} {'diff':>8s}" if args.ort else ""))
    for k in keys:
        row = f"{k:26s} {ours[k]:8.3f}"
        if args.ort:
            row += f" {ort[k]:8.3f} {ours[k] - ort[k]:+8.3f}"
        print(row)
    total = f"{'total':26s} {sum(ours.values()):8.3f}"
    if args.ort:
        total += f" {sum(ort.values()):8.3f}"
    print(total)


if __name__ == "__main__":
    main()
