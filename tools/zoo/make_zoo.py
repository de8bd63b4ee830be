#!/usr/bin/env python3
"""Builds the benchmark zoo: standard architectures nobody tuned our kernels for,
exported to ONNX with random (seeded) weights at their usual input sizes, each with 8
calibration samples in our data-folder layout.

    OUT/<name>/model.onnx
    OUT/<name>/calibration_data/<input>/<i>.npy
    OUT/zoo.json            one entry per model: input shapes, opset, layout, or the
                            error that stopped its export

Weights are random because speed does not depend on them; BatchNorm statistics are
set by a few forward passes in training mode on the same kind of data as the
samples, so activations keep realistic ranges through deep nets (the calibration
thresholds then look like a trained model's). The TorchScript exporter is used (it
folds BatchNorm into Conv, as deployment exports do, and writes old opsets).
`cargo xtask zoo` runs this in target/zoo-venv (tools/zoo/requirements.txt) and then
calibrates every model with our `hmct-debugger calibrate`.

Usage: python tools/zoo/make_zoo.py OUT [--only NAME,NAME] [--samples 8] [--list]
"""
import argparse
import json
import os
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

SEED = 21
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


# ----------------------------------------------------------------------------------
# Architectures written here (no permissively licensed package ships them as torch
# modules without extra dependencies).

class ConvBnAct(nn.Module):
    """YOLOv8's Conv: conv, BatchNorm, SiLU."""

    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=None)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        super().__init__()
        self.cv1 = ConvBnAct(c, c, 3)
        self.cv2 = ConvBnAct(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP bottleneck with two convolutions (YOLOv8): split, n bottlenecks, concat."""

    def __init__(self, c1, c2, n=1, shortcut=False):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = ConvBnAct(c1, 2 * self.c, 1)
        self.cv2 = ConvBnAct((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = ConvBnAct(c1, c_, 1)
        self.cv2 = ConvBnAct(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class YoloC2f(nn.Module):
    """A YOLOv8-style detector (CSP/C2f backbone, SPPF, PAN neck, decoupled head,
    boxes as 4 x 16 DFL bins), written from the published architecture. Width and
    depth multiples 0.25 / 0.33 give the 'n' size."""

    def __init__(self, nc=80, w=0.25, d=0.33, reg_max=16):
        super().__init__()

        def ch(c):
            return max(16, int(c * w))

        def n(k):
            return max(1, round(k * d))

        c = [ch(64), ch(128), ch(256), ch(512), ch(1024)]
        self.b0 = ConvBnAct(3, c[0], 3, 2)
        self.b1 = ConvBnAct(c[0], c[1], 3, 2)
        self.b2 = C2f(c[1], c[1], n(3), True)
        self.b3 = ConvBnAct(c[1], c[2], 3, 2)
        self.b4 = C2f(c[2], c[2], n(6), True)
        self.b5 = ConvBnAct(c[2], c[3], 3, 2)
        self.b6 = C2f(c[3], c[3], n(6), True)
        self.b7 = ConvBnAct(c[3], c[4], 3, 2)
        self.b8 = C2f(c[4], c[4], n(3), True)
        self.b9 = SPPF(c[4], c[4])
        self.h12 = C2f(c[4] + c[3], c[3], n(3))
        self.h15 = C2f(c[3] + c[2], c[2], n(3))
        self.h16 = ConvBnAct(c[2], c[2], 3, 2)
        self.h18 = C2f(c[2] + c[3], c[3], n(3))
        self.h19 = ConvBnAct(c[3], c[3], 3, 2)
        self.h21 = C2f(c[3] + c[4], c[4], n(3))
        c2, c3 = max(16, c[2] // 4, reg_max * 4), max(c[2], min(nc, 100))
        self.box = nn.ModuleList(
            nn.Sequential(ConvBnAct(x, c2, 3), ConvBnAct(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1))
            for x in (c[2], c[3], c[4]))
        self.cls = nn.ModuleList(
            nn.Sequential(ConvBnAct(x, c3, 3), ConvBnAct(c3, c3, 3), nn.Conv2d(c3, nc, 1))
            for x in (c[2], c[3], c[4]))

    def forward(self, x):
        x = self.b2(self.b1(self.b0(x)))
        p3 = self.b4(self.b3(x))
        p4 = self.b6(self.b5(p3))
        p5 = self.b9(self.b8(self.b7(p4)))
        up = F.interpolate(p5, scale_factor=2.0, mode="nearest")
        h12 = self.h12(torch.cat((up, p4), 1))
        up = F.interpolate(h12, scale_factor=2.0, mode="nearest")
        h15 = self.h15(torch.cat((up, p3), 1))
        h18 = self.h18(torch.cat((self.h16(h15), h12), 1))
        h21 = self.h21(torch.cat((self.h19(h18), p5), 1))
        outs = []
        for i, f in enumerate((h15, h18, h21)):
            o = torch.cat((self.box[i](f), torch.sigmoid(self.cls[i](f))), 1)
            outs.append(o.flatten(2))
        return torch.cat(outs, 2)


class BertEncoder(nn.Module):
    """BERT-base: word, position and token-type embeddings, LayerNorm, 12 post-norm
    encoder layers (768 wide, 12 heads, GELU feed-forward of 3072), written out so the
    export is plain MatMul/Softmax/LayerNorm rather than a fused attention op."""

    def __init__(self, vocab=30522, hidden=768, layers=12, heads=12, ff=3072, max_pos=512):
        super().__init__()
        self.heads = heads
        self.word = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_pos, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ff) for _ in range(layers))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        pos = torch.arange(seq, device=input_ids.device).unsqueeze(0)
        x = self.word(input_ids) + self.pos(pos) + self.token_type(torch.zeros_like(input_ids))
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x)
        return x


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, ff):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, ff)
        self.ff2 = nn.Linear(ff, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).split(h, dim=2)
        q = q.reshape(b, s, self.heads, d).transpose(1, 2)
        k = k.reshape(b, s, self.heads, d).permute(0, 2, 3, 1)
        v = v.reshape(b, s, self.heads, d).transpose(1, 2)
        a = torch.softmax(torch.matmul(q, k) / (d ** 0.5), dim=-1)
        a = torch.matmul(a, v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(a))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class SsdLiteRaw(nn.Module):
    """SSDlite320-MobileNetV3: backbone, extra layers and heads; the raw class scores
    and box regressions (the box decoding and NMS after them are not a network)."""

    def __init__(self):
        super().__init__()
        self.m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
            weights=None, weights_backbone=None)

    def forward(self, x):
        feats = list(self.m.backbone(x).values())
        out = self.m.head(feats)
        return out["bbox_regression"], out["cls_logits"]


class SegOut(nn.Module):
    """torchvision segmentation models return a dict; export its main output."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


class Nhwc(nn.Module):
    """Takes NHWC input, as TensorFlow-born deployments do: a Transpose at the start."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x.permute(0, 3, 1, 2))


def vit_s16():
    """ViT-S/16 (the DeiT-S shape: 384 wide, 6 heads, 12 layers)."""
    return torchvision.models.VisionTransformer(
        image_size=224, patch_size=16, num_layers=12, num_heads=6, hidden_dim=384,
        mlp_dim=1536)


# ----------------------------------------------------------------------------------
# The zoo. Each: (name, builder, input kind, input shape (NCHW for images),
# opset, NHWC input).

tv = torchvision.models
ZOO = [
    ("resnet50", lambda: tv.resnet50(), "image", (1, 3, 224, 224), 17, False),
    ("resnet50_nhwc_op9", lambda: tv.resnet50(), "image", (1, 3, 224, 224), 9, True),
    ("mobilenet_v2", lambda: tv.mobilenet_v2(), "image", (1, 3, 224, 224), 17, False),
    ("mobilenet_v2_op11", lambda: tv.mobilenet_v2(), "image", (1, 3, 224, 224), 11, False),
    ("mobilenet_v3_large", lambda: tv.mobilenet_v3_large(), "image", (1, 3, 224, 224), 17, False),
    ("efficientnet_b0", lambda: tv.efficientnet_b0(), "image", (1, 3, 224, 224), 17, False),
    ("regnet_y_800mf", lambda: tv.regnet_y_800mf(), "image", (1, 3, 224, 224), 17, False),
    ("convnext_tiny", lambda: tv.convnext_tiny(), "image", (1, 3, 224, 224), 17, False),
    ("shufflenet_v2_x1_0", lambda: tv.shufflenet_v2_x1_0(), "image", (1, 3, 224, 224), 17, False),
    ("vit_s16", vit_s16, "image", (1, 3, 224, 224), 17, False),
    ("swin_t", lambda: tv.swin_t(), "image", (1, 3, 224, 224), 17, False),
    ("deeplabv3_mobilenet_v3", lambda: SegOut(tv.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=False)), "image", (1, 3, 512, 512), 17, False),
    ("ssdlite320_mobilenet_v3", SsdLiteRaw, "image", (1, 3, 320, 320), 17, False),
    ("yolov8n_c2f", YoloC2f, "image", (1, 3, 640, 640), 17, False),
    ("yolov8n_c2f_nhwc_op11", YoloC2f, "image", (1, 3, 640, 640), 11, True),
    ("bert_base_s128", BertEncoder, "tokens", (1, 128), 17, False),
    # Added in session 31 after a run over architectures the kernels were never tuned
    # on: Inception-v3's 3x3 average pools ran 37x slower than onnxruntime's.
    ("inception_v3", lambda: tv.inception_v3(init_weights=True), "image", (1, 3, 299, 299), 17, False),
    ("densenet121", lambda: tv.densenet121(), "image", (1, 3, 224, 224), 17, False),
]


def images(rng, shape, n):
    """n image-like samples: smooth random fields in [0, 1] (noise at 1/8 resolution,
    upsampled) plus fine noise, normalized with ImageNet's mean and std, as an
    exported classifier's preprocessing would give."""
    _, c, h, w = shape
    out = []
    for _ in range(n):
        coarse = torch.from_numpy(rng.random((1, c, max(2, h // 8), max(2, w // 8)), dtype=np.float32))
        img = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
        img = img + torch.from_numpy(rng.normal(0, 0.05, (1, c, h, w)).astype(np.float32))
        img = img.clamp(0, 1).numpy()
        img = (img - IMAGENET_MEAN[:c, None, None]) / IMAGENET_STD[:c, None, None]
        out.append(img.astype(np.float32))
    return out


def tokens(rng, shape, n):
    """n token sequences: [CLS], ids from the ordinary-word range, [SEP]."""
    out = []
    for _ in range(n):
        ids = rng.integers(1000, 30000, size=shape, dtype=np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        out.append(ids)
    return out


def settle_batchnorm(model, batch):
    """Sets BatchNorm running statistics to those of `batch` (cumulative average over
    two passes in training mode), so eval-mode activations keep a sane scale."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(batch)
    model.eval()


def export(name, build, kind, shape, opset, nhwc, out_dir, samples):
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    model = build()
    # Some heads start at zero (torchvision's ViT): a constant output says nothing
    # about accuracy and gives degenerate calibration ranges.
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)) and not m.weight.any():
            nn.init.normal_(m.weight, std=0.02)
    model.eval()
    data = images(rng, shape, samples) if kind == "image" else tokens(rng, shape, samples)
    if kind == "image":
        settle_batchnorm(model, torch.from_numpy(np.concatenate(data[:4])))
    if nhwc:
        model = Nhwc(model).eval()
        data = [np.ascontiguousarray(d.transpose(0, 2, 3, 1)) for d in data]
    input_name = "input_ids" if kind == "tokens" else "images"
    example = torch.from_numpy(data[0])
    d = os.path.join(out_dir, name)
    os.makedirs(os.path.join(d, "calibration_data", input_name), exist_ok=True)
    # Written next to the target and renamed, so a failed export leaves no model.
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=d)
    os.close(fd)
    try:
        with torch.no_grad():
            torch.onnx.export(model, (example,), tmp, input_names=[input_name],
                              opset_version=opset, do_constant_folding=True, dynamo=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(d, "model.onnx"))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    for i, x in enumerate(data):
        np.save(os.path.join(d, "calibration_data", input_name, f"{i}.npy"), x)
    return {"input": input_name, "shape": list(data[0].shape), "opset": opset,
            "layout": "NHWC" if nhwc else ("NCHW" if kind == "image" else "tokens")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--list", action="store_true", help="print the model names and exit")
    args = ap.parse_args()
    if args.list:
        print("\n".join(z[0] for z in ZOO))
        return
    only = set(args.only.split(",")) if args.only else None
    if only and only - {z[0] for z in ZOO}:
        sys.exit(f"error: unknown model(s) {sorted(only - {z[0] for z in ZOO})}")
    torch.set_num_threads(2)
    # nn.MultiheadAttention's fused fast path has no ONNX export.
    torch.backends.mha.set_fastpath_enabled(False)
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "zoo.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    for name, build, kind, shape, opset, nhwc in ZOO:
        if only and name not in only:
            continue
        print(f"exporting {name}", flush=True)
        try:
            manifest[name] = export(name, build, kind, shape, opset, nhwc, args.out, args.samples)
        except Exception as e:  # noqa: BLE001 - reported per model, the others go on
            traceback.print_exc()
            manifest[name] = {"export_error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        with open(manifest_path + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(manifest_path + ".tmp", manifest_path)
    failed = [n for n, v in manifest.items() if "export_error" in v]
    if failed:
        print(f"export failed: {', '.join(failed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
