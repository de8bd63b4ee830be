#!/usr/bin/env python3
"""Node sensitivity on onnxruntime, computed the way Horizon's hmct-debugger does it:
one model and one onnxruntime session per candidate.

This is the reference `hmct-debugger get-sensitivity-of-nodes` is checked and timed
against (hmct-cli/tests/sensitivity_ort.rs, `cargo xtask sensitivity-bench`). For
each candidate, every HzCalibration node of the calibrated model is rewritten: the
candidate's calibration nodes become QuantizeLinear -> DequantizeLinear (per-axis for
per-channel nodes; Cast to float16 and back for float16), every other one becomes
Identity. The float model is the one with every calibration node as Identity. Each
variant is serialized, loaded into a new InferenceSession and run on every sample;
the compared values (model outputs, or the outputs of --output-node nodes) are
compared with the float model's. Metrics and aggregation as DEBUGGER.md §1-3.

QDQ nodes use onnxruntime's com.microsoft QuantizeLinear/DequantizeLinear, which take
an axis and int16 at any opset (the models here declare opset 11/12, where the
standard ops have neither).

Pinned: onnx==1.23.2, onnxruntime==1.32.0, numpy. Usage:
    python tools/ort_sensitivity.py MODEL DATA [-m cosine-similarity mse] [-n node]
        [-o NODE ...] [-d N] [-i '[["a"],["b","c"]]'] [--threads N] [--json OUT]
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PINNED = {"onnx": "1.23.2", "onnxruntime": "1.32.0"}
SKIPPABLE = {"MaxPool", "GlobalMaxPool", "Relu", "Clip", "Reshape", "Transpose",
             "ReduceMax", "Split", "Slice", "Gather", "ScatterND"}
METRICS = ["cosine-similarity", "mse", "mre", "sqnr", "chebyshev"]
WORSE_IS_LOWER = {"cosine-similarity", "sqnr"}
INT_TYPES = {  # qtype -> (onnx type, numpy type, qmin, qmax)
    "int8": (TensorProto.INT8, np.int8, -128, 127),
    "uint8": (TensorProto.UINT8, np.uint8, 0, 255),
    "int16": (TensorProto.INT16, np.int16, -32768, 32767),
    "uint16": (TensorProto.UINT16, np.uint16, 0, 65535),
}


def is_calibration(node):
    return node.op_type == "HzCalibration" and node.domain == "horizon"


class Calibration:
    """What one HzCalibration node does when ON (HZCALIBRATION.md §2-3)."""

    def __init__(self, node, constants):
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        dec = lambda v: v.decode() if isinstance(v, bytes) else v
        self.name, self.input, self.output = node.name, node.input[0], node.output[0]
        if "qtype" in a:
            self.qtype = dec(a["qtype"]).strip().lower()
        elif "bits" in a:
            self.qtype = f"int{a['bits']}"
        else:
            self.qtype = "int8"
        thresholds = [np.float32(t) for t in a.get("thresholds", [])]
        stored = [np.float32(s) for s in a.get("scales", [])]
        n_params = len(thresholds) or len(stored)
        self.per_channel = "axis" in a and n_params > 1
        self.axis = a.get("axis", 1) if self.per_channel else None
        unsigned = self.qtype.startswith("uint")
        if thresholds:
            self.asymmetric = not self.per_channel and unsigned and len(thresholds) == 2
        else:
            self.asymmetric = not self.per_channel and any(z != 0 for z in a.get("zero_point", []))
        self.zero_points = None
        if self.qtype in INT_TYPES:
            _, _, qmin, qmax = INT_TYPES[self.qtype]
            if a.get("constant", 0) == 2 or not thresholds:
                scales = stored
            elif self.asymmetric:
                fmin, fmax = thresholds
                scales = [np.float32((fmax - fmin) / np.float32(qmax - qmin))]
            else:
                scales = [np.float32(t / np.float32(qmax)) for t in thresholds]
            if not self.per_channel:
                scales = scales[:1]
            if "zero_point" in a:
                zps = list(a["zero_point"])[: len(scales)]
            elif self.asymmetric:
                zps = [qmax - int(np.round(np.float32(thresholds[1] / scales[0])))]
            else:
                zps = [0] * len(scales)
            self.scales, self.zero_points = scales, zps
        elif self.qtype not in ("float16", "float32"):
            raise SystemExit(f"{self.name}: qtype {self.qtype} is not supported here")
        self.switch_on = dec(a.get("switch", "ON")).strip().upper() != "OFF"
        tensor_type = None
        if "tensor_type" in a:
            tensor_type = dec(a["tensor_type"]).strip().lower()
        if tensor_type not in ("feature", "weight"):
            tokens = [t for s in a.get("info_strings", []) for t in re.split(r"[^0-9A-Za-z]+", dec(s))]
            tensor_type = next((t.lower() for t in tokens if t.lower() in ("feature", "weight")), None)
        if tensor_type is None:
            tensor_type = "weight" if self.input in constants else "feature"
        self.tensor_type = tensor_type

    def replacement(self, on):
        """Nodes and initializers that stand for this calibration node."""
        if not on or self.qtype == "float32":
            return [helper.make_node("Identity", [self.input], [self.output], name=self.name)], []
        if self.qtype == "float16":
            half = self.name + "_f16"
            return [helper.make_node("Cast", [self.input], [half], to=TensorProto.FLOAT16, name=self.name + "_to16"),
                    helper.make_node("Cast", [half], [self.output], to=TensorProto.FLOAT, name=self.name)], []
        onnx_type, np_type, _, _ = INT_TYPES[self.qtype]
        shape = [len(self.scales)] if self.per_channel else []
        s_name, z_name, q_name = self.name + "_scale", self.name + "_zero_point", self.name + "_q"
        inits = [numpy_helper.from_array(np.array(self.scales, np.float32).reshape(shape), s_name),
                 numpy_helper.from_array(np.array(self.zero_points, np_type).reshape(shape), z_name)]
        attrs = {"axis": self.axis} if self.per_channel else {}
        nodes = [helper.make_node("QuantizeLinear", [self.input, s_name, z_name], [q_name],
                                  domain="com.microsoft", name=self.name + "_quant", **attrs),
                 helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [self.output],
                                  domain="com.microsoft", name=self.name, **attrs)]
        return nodes, inits


class CalibratedModel:
    def __init__(self, path):
        self.model = onnx.load(path)
        g = self.model.graph
        constants = {i.name for i in g.initializer}
        constants |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.nodes = {n.name: n for n in g.node}
        self.calibrations = {n.name: Calibration(n, constants) for n in g.node if is_calibration(n)}
        self.order = [n.name for n in g.node]

    def find_input_calibration(self, value):
        while value:
            p = self.producer.get(value)
            if p is None:
                return None
            if is_calibration(p):
                return p.name
            if p.op_type not in SKIPPABLE or not p.input:
                return None
            value = p.input[0]
        return None

    def input_calibrations(self, name):
        found = []
        for v in self.nodes[name].input:
            c = self.find_input_calibration(v)
            if c is not None and c not in found:
                found.append(c)
        return found

    def variant(self, on, extra_outputs):
        """The model with calibration nodes in `on` quantizing and the rest Identity."""
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        del m.graph.node[:]
        for n in self.model.graph.node:
            if is_calibration(n):
                nodes, inits = self.calibrations[n.name].replacement(n.name in on)
                m.graph.node.extend(nodes)
                m.graph.initializer.extend(inits)
            else:
                m.graph.node.append(n)
        present = {o.name for o in m.graph.output}
        for v in extra_outputs:
            if v not in present:
                m.graph.output.append(onnx.ValueInfoProto(name=v))
        opsets = [o for o in m.opset_import if o.domain not in ("horizon", "com.microsoft")]
        del m.opset_import[:]
        m.opset_import.extend(opsets + [helper.make_opsetid("com.microsoft", 1)])
        return m.SerializeToString()


def load_samples(data, inputs, n):
    samples = []
    dirs = []
    for name in inputs:
        d = os.path.join(data, name)
        if not os.path.isdir(d):
            d = os.path.join(data, name.replace("/", "_").replace(":", "_").replace("\\", "_"))
        if not os.path.isdir(d) and len(inputs) == 1:
            d = data
        files = [f for f in os.listdir(d) if f.endswith(".npy")]
        key = lambda f: (int("".join(c for c in f[:-4] if c.isdigit()) or -1), f[:-4])
        dirs.append([os.path.join(d, f) for f in sorted(files, key=key)])
    count = len(dirs[0]) if n is None else n
    if count > len(dirs[0]):
        raise SystemExit(f"data_num is {count} but the data has {len(dirs[0])} sample(s)")
    for i in range(count):
        samples.append({name: np.load(files[i]) for name, files in zip(inputs, dirs)})
    return samples


def metric_values(x, y, metrics):
    x = np.asarray(x, np.float64).ravel()
    y = np.asarray(y, np.float64).ravel()
    if x.size == 0:
        return [float("nan")] * len(metrics)
    d = x - y
    nx, ny = np.sqrt(np.dot(x, x)), np.sqrt(np.dot(y, y))
    noise = np.sqrt(np.dot(d, d))
    out = []
    for m in metrics:
        if m == "cosine-similarity":
            out.append(float(np.dot(x, y) / (max(nx, 1e-8) * max(ny, 1e-8))))
        elif m == "mse":
            out.append(float(np.mean(d * d)))
        elif m == "mre":
            out.append(float(np.mean(np.abs(d))))
        elif m == "sqnr":
            out.append(float("inf") if noise == 0 else float(10 * np.log10(nx / noise)))
        else:
            out.append(float(np.max(np.abs(d))))
    return out


def aggregate(per_output):
    """per_output[o][s]: mean over samples skipping NaN, then mean over outputs."""
    means = []
    for samples in per_output:
        valid = [v for v in samples if not np.isnan(v)]
        means.append(sum(valid) / len(valid) if valid else float("nan"))
    return sum(means) / len(means) if means else float("nan")


def sort_key(metric):
    def key(entry):
        v = entry["values"][metric]
        if np.isnan(v):
            return (1, 0.0)
        return (0, v if metric in WORSE_IS_LOWER else -v)
    return key


def json_number(v):
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("-m", "--metrics", nargs="+", default=["cosine-similarity"], choices=METRICS)
    p.add_argument("-n", "--node-type", default="node", choices=["node", "weight", "activation"])
    p.add_argument("-o", "--output-node", nargs="+", default=[])
    p.add_argument("-d", "--data-num", type=int)
    p.add_argument("-i", "--interested-nodes", help="JSON list of groups, e.g. '[[\"a\"],[\"b\",\"c\"]]'")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--opt-level", default="all", choices=["disable", "basic", "extended", "all"])
    p.add_argument("--json", help="write the result here (default: stdout)")
    args = p.parse_args()
    for pkg, mod in (("onnx", onnx), ("onnxruntime", ort)):
        if mod.__version__ != PINNED[pkg]:
            print(f"warning: {pkg} {mod.__version__}, pinned {PINNED[pkg]}", file=sys.stderr)

    t_start = time.perf_counter()
    cm = CalibratedModel(args.model)
    if not cm.calibrations:
        raise SystemExit("the model has no calibration (HzCalibration) nodes")
    g = cm.model.graph
    init_names = {i.name for i in g.initializer}
    inputs = [i.name for i in g.input if i.name not in init_names]
    samples = load_samples(args.data, inputs, args.data_num)

    if args.output_node:
        compared = []
        for name in args.output_node:
            if name not in cm.nodes or name in cm.calibrations or not cm.input_calibrations(name):
                raise SystemExit(f"output node {name} must be a quantized regular node")
            compared += [o for o in cm.nodes[name].output if o and o not in compared]
    else:
        compared = [o.name for o in g.output]

    if args.interested_nodes:
        candidates = []
        for group in json.loads(args.interested_nodes):
            cals = []
            for name in group:
                for c in ([name] if name in cm.calibrations else cm.input_calibrations(name)):
                    if c not in cals:
                        cals.append(c)
            candidates.append(("+".join(group), cals))
    elif args.node_type == "node":
        candidates = [(n, cm.input_calibrations(n)) for n in cm.order if n not in cm.calibrations]
        candidates = [(n, c) for n, c in candidates if c]
    else:
        want = "weight" if args.node_type == "weight" else "feature"
        candidates = [(n, [n]) for n in cm.order if n in cm.calibrations and cm.calibrations[n].tensor_type == want]

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[args.opt_level]

    timings = {"load": time.perf_counter() - t_start, "build": 0.0, "session": 0.0, "run": 0.0, "metrics": 0.0}

    def run_variant(on):
        t0 = time.perf_counter()
        blob = cm.variant(on, compared)
        t1 = time.perf_counter()
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        t2 = time.perf_counter()
        outs = [sess.run(compared, s) for s in samples]
        t3 = time.perf_counter()
        timings["build"] += t1 - t0
        timings["session"] += t2 - t1
        timings["run"] += t3 - t2
        return outs

    t_float = time.perf_counter()
    float_outs = run_variant(set())
    timings["float"] = time.perf_counter() - t_float

    entries = []
    for name, cals in candidates:
        outs = run_variant(set(cals))
        t0 = time.perf_counter()
        per_metric = [[[] for _ in compared] for _ in args.metrics]
        for s, (ref, got) in enumerate(zip(float_outs, outs)):
            for o, (x, y) in enumerate(zip(ref, got)):
                for mi, v in enumerate(metric_values(x, y, args.metrics)):
                    per_metric[mi][o].append(v)
        values = {m: aggregate(per_metric[mi]) for mi, m in enumerate(args.metrics)}
        timings["metrics"] += time.perf_counter() - t0
        entries.append({"name": name, "calibrations": cals, "values": values})
    entries.sort(key=sort_key(args.metrics[0]))
    timings["total"] = time.perf_counter() - t_start

    result = {
        "node_type": args.node_type,
        "metrics": args.metrics,
        "data_num": len(samples),
        "compared": compared,
        "entries": [dict(e, values={m: json_number(v) for m, v in e["values"].items()}) for e in entries],
        "probes": len(candidates) + 1,
        "threads": args.threads,
        "timings": timings,
    }
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
