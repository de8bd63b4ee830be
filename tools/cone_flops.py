#!/usr/bin/env python3
"""How much arithmetic node-sensitivity probes need at the least, whatever the engine.

A probe re-runs the cone downstream of its calibration nodes; the onnxruntime way
re-runs the whole model per candidate. This counts floating-point operations (Conv,
ConvTranspose, MatMul/Gemm as 2 x MACs, every other node as one per output element)
per full run and summed over the cones of each ranking of calibrated MODEL, so the
best possible ratio of the two ways, and the least time at a given FLOP rate, can be
read off. It is arithmetic, not a timing: docs/performance.md uses it.

Pinned: onnx==1.23.2 (tools/requirements.txt). Usage:
    python tools/cone_flops.py MODEL [--input-shape 1,3,640,640] [--samples 8]
        [--gflops-peak 157] [--series DIR/sensitivity_analysis/partial_quantization.json]
"""
import argparse
import collections
import json

import numpy as np
import onnx
from onnx import shape_inference


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--input-shape", default=None,
                    help="comma-separated shape for every dynamic model input")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--gflops-peak", type=float, default=None,
                    help="machine peak GFLOP/s, to print the least time")
    ap.add_argument("--series", default=None,
                    help="a sensitivity analysis' partial_quantization.json: count its "
                         "cumulative de-quantization probes too")
    args = ap.parse_args()

    m = onnx.load(args.model)
    g = m.graph
    # HzCalibration is opaque to onnx's shape inference: count it as an Identity.
    calibrations = set()
    for n in g.node:
        if n.op_type == "HzCalibration":
            calibrations.add(n.name)
            n.op_type, n.domain = "Identity", ""
            del n.attribute[:]
            del n.input[1:]
    if args.input_shape:
        dims = [int(d) for d in args.input_shape.split(",")]
        for i in g.input:
            for d, v in zip(i.type.tensor_type.shape.dim, dims):
                d.ClearField("dim_param")
                d.dim_value = v
    m = shape_inference.infer_shapes(m)
    g = m.graph
    shapes = {t.name: list(t.dims) for t in g.initializer}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    shapes[n.output[0]] = list(a.t.dims)
    producer = {o: n for n in g.node for o in n.output}

    def shape(value):
        # A weight behind its calibration node: the constant's shape.
        while value not in shapes and value in producer and producer[value].op_type == "Identity":
            value = producer[value].input[0]
        return shapes.get(value)

    def numel(value):
        s = shape(value)
        return int(np.prod(s)) if s else 0

    flops = {}
    for n in g.node:
        if n.name in calibrations:
            flops[n.name] = numel(n.output[0])
        elif n.op_type == "Conv":
            flops[n.name] = 2 * numel(n.output[0]) * int(np.prod(shape(n.input[1])[1:]))
        elif n.op_type == "ConvTranspose":
            flops[n.name] = 2 * numel(n.input[0]) * int(np.prod(shape(n.input[1])[1:]))
        elif n.op_type in ("MatMul", "Gemm"):
            a = shape(n.input[0]) or [0]
            flops[n.name] = 2 * numel(n.output[0]) * a[-1]
        else:
            flops[n.name] = numel(n.output[0]) if n.output else 0
    full = sum(flops.values())
    if not calibrations:
        raise SystemExit(f"{args.model}: no HzCalibration nodes (calibrate it first)")
    if full == 0:
        raise SystemExit(f"{args.model}: shapes unknown; give --input-shape")

    consumers = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)

    def cone(starts):
        seen, stack = set(), list(starts)
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            for o in n.output:
                stack.extend(consumers[o])
        return seen

    cal_nodes = [n for n in g.node if n.name in calibrations]
    by_output = {n.output[0]: n for n in cal_nodes}
    constants = set(shapes) - {vi.name for vi in list(g.value_info) + list(g.input) + list(g.output)}
    constants |= {n.output[0] for n in g.node if n.op_type == "Constant"}
    weight = [c for c in cal_nodes if c.input[0] in constants]
    activation = [c for c in cal_nodes if c.input[0] not in constants]
    node_sets = []
    for n in g.node:
        if n.name in calibrations:
            continue
        s = tuple(sorted({by_output[i].name for i in n.input if i in by_output}))
        if s and s not in node_sets:
            node_sets.append(s)
    by_name = {c.name: c for c in cal_nodes}

    def print_floor(per_sample):
        """The arithmetic over all samples and its time at the given peak, if any."""
        if args.gflops_peak:
            total = per_sample * args.samples / 1e9
            print(f"{'':16s}{args.samples} samples: {total:.0f} GFLOP, at least "
                  f"{total / args.gflops_peak:.0f} s at {args.gflops_peak:.0f} GFLOP/s")

    def work(cones):
        return sum(sum(flops[x] for x in c) for c in cones)

    rankings = {
        "weight": [cone([c]) for c in weight],
        "activation": [cone([c]) for c in activation],
        "node": [cone([by_name[x] for x in s]) for s in node_sets],
    }
    print(f"full run: {full / 1e9:.2f} GFLOP")
    for name, cones in rankings.items():
        w = work(cones)
        print(f"{name:10s} {len(cones):4d} probes: {w / 1e9:8.1f} GFLOP per sample, "
              f"mean cone {w / max(len(cones), 1) / full:.0%} of a full run, "
              f"best ratio to full runs {len(cones) * full / max(w, 1):.2f}x")
        if name == "node":
            # Which operators that arithmetic is spent in, and the nodes nearly
            # every probe re-runs.
            op_of = {n.name: ("HzCalibration" if n.name in calibrations else n.op_type)
                     for n in g.node}
            by_op = collections.Counter()
            reach = collections.Counter()
            for c in cones:
                for x in c:
                    by_op[op_of[x]] += flops[x]
                    reach[x] += 1
            shares = ", ".join(f"{op} {f / w:.0%}" for op, f in by_op.most_common(6))
            print(f"{'':16s}by operator: {shares}")
            # runall ranks activation nodes first; a regular node whose probe switches
            # one calibration node alone is measured there already.
            fresh = [cone([by_name[x] for x in s]) for s in node_sets if len(s) > 1]
            print(f"{'':16s}{len(fresh)} probes switch more than one calibration node: "
                  f"{work(fresh) / 1e9:.1f} GFLOP per sample")
            common = [x for x, k in reach.items() if k >= 0.8 * len(cones)]
            print(f"{'':16s}{len(common)} nodes are in at least 80% of the cones, "
                  f"{sum(flops[x] for x in common) / full:.0%} of a full run's arithmetic")
        print_floor(w)
    if args.series:
        # Step k switches the first k picked nodes: its cone is downstream of all of them.
        with open(args.series) as f:
            picked = json.load(f)["nodes"]
        switched, w = [], 0
        for node in picked:
            switched += [by_name[c] for c in node["calibrations"]]
            w += sum(flops[x] for x in cone(switched))
        print(f"cumulative {len(picked):4d} probes: {w / 1e9:8.1f} GFLOP per sample, "
              f"mean cone {w / max(len(picked), 1) / full:.0%} of a full run")
        print_floor(w)


if __name__ == "__main__":
    main()
