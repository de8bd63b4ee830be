#!/usr/bin/env python3
"""Exports torchvision architectures outside the zoo (random weights, opset 13, two
random samples each) to check that speed holds on shapes nobody tuned for:
docs/performance.md, session 31 (`cargo xtask bench-ort OUT/*/model.onnx --threads 1`).

Pinned packages: tools/zoo/requirements.txt (the zoo's venv, target/zoo-venv). Usage:
    python tools/zoo/unseen.py OUT [NAME ...]
"""
import os
import sys

import numpy as np
import torch
import torchvision

tv = torchvision.models
MODELS = {
    "resnext50_32x4d": (tv.resnext50_32x4d, 224),
    "densenet121": (tv.densenet121, 224),
    "inception_v3": (lambda: tv.inception_v3(aux_logits=True, init_weights=True), 299),
    "squeezenet1_1": (tv.squeezenet1_1, 224),
    "mnasnet1_0": (tv.mnasnet1_0, 224),
    "googlenet": (lambda: tv.googlenet(aux_logits=False, init_weights=True), 224),
    "regnet_x_1_6gf": (tv.regnet_x_1_6gf, 224),
    "efficientnet_v2_s": (tv.efficientnet_v2_s, 224),
    # Added in session 51, after the zoo's kernels had moved for twenty sessions.
    "mobilenet_v3_small": (tv.mobilenet_v3_small, 224),
    "resnet18": (tv.resnet18, 224),
    "wide_resnet50_2": (tv.wide_resnet50_2, 224),
    "efficientnet_b3": (tv.efficientnet_b3, 300),
    "regnet_y_3_2gf": (tv.regnet_y_3_2gf, 224),
    "shufflenet_v2_x2_0": (tv.shufflenet_v2_x2_0, 224),
    "mnasnet0_5": (tv.mnasnet0_5, 224),
    "vgg11_bn": (tv.vgg11_bn, 224),
}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, wanted = sys.argv[1], sys.argv[2:]
    unknown = set(wanted) - set(MODELS)
    if unknown:
        sys.exit(f"error: unknown model(s) {sorted(unknown)}")
    torch.manual_seed(0)
    for name, (build, size) in MODELS.items():
        if wanted and name not in wanted:
            continue
        model = build().eval()
        x = torch.randn(1, 3, size, size)
        data = os.path.join(out, name, "calibration_data", "input")
        os.makedirs(data, exist_ok=True)
        torch.onnx.export(model, x, os.path.join(out, name, "model.onnx"),
                          input_names=["input"], output_names=["output"],
                          opset_version=13, dynamo=False)
        for i in range(2):
            np.save(os.path.join(data, f"{i}.npy"), torch.randn(1, 3, size, size).numpy())
        print("exported", name, flush=True)


if __name__ == "__main__":
    main()
