//! Shared helpers for the criterion benchmarks in `benches/`: the standard conv and
//! MatMul shapes of issue 21 (ResNet-50, mobile and YOLO-style CNNs, BERT-base), the
//! kernels that run them as a plan would (weights as plan constants), the calling
//! thread's CPU time and the measured f32 FMA peak.

use hmct_proto::onnx::AttributeProto;
use hmct_proto::onnx::attribute_proto::AttributeType;
use hmct_quant::ops::{Attrs, Kernel, NodeSpec, build_kernel, on_calling_thread};
use hmct_tensor::Tensor;

/// A 2-D conv on one image: input channels, output channels, groups, square kernel,
/// stride, dilation, pads on every side, input height and width.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    pub name: &'static str,
    pub c: usize,
    pub m: usize,
    pub group: usize,
    pub k: usize,
    pub s: usize,
    pub d: usize,
    pub p: usize,
    pub hw: [usize; 2],
}

impl ConvShape {
    pub fn out(&self) -> [usize; 2] {
        self.hw
            .map(|i| (i + 2 * self.p - (self.k - 1) * self.d - 1) / self.s + 1)
    }

    /// Floating-point operations of one run: 2 per multiply-add whose tap reads data
    /// (taps on the padding add `w·0`, which a kernel may skip; DeepLab's dilated
    /// convs read data with a quarter to a half of their taps).
    pub fn flops(&self) -> f64 {
        let [oh, ow] = self.out();
        // Per axis, the (output, tap) pairs that read data.
        let reading = |len: usize, outs: usize| -> usize {
            (0..outs)
                .map(|o| {
                    (0..self.k)
                        .filter(|t| {
                            let at = (o * self.s + t * self.d) as isize - self.p as isize;
                            (0..len as isize).contains(&at)
                        })
                        .count()
                })
                .sum()
        };
        let taps = reading(self.hw[0], oh) * reading(self.hw[1], ow);
        2.0 * (self.m * self.c / self.group * taps) as f64
    }
}

#[allow(clippy::too_many_arguments)]
const fn conv(
    name: &'static str,
    c: usize,
    m: usize,
    group: usize,
    k: usize,
    s: usize,
    p: usize,
    hw: usize,
) -> ConvShape {
    ConvShape {
        name,
        c,
        m,
        group,
        k,
        s,
        d: 1,
        p,
        hw: [hw, hw],
    }
}

/// ResNet-50's 1x1 and 3x3 convs and its stem, a YOLO-style stride-2 3x3, depthwise
/// (MobileNet, ConvNeXt), grouped (RegNet), dilated (DeepLab) convs.
pub const CONV_SHAPES: &[ConvShape] = &[
    conv("r50_1x1_64to256_56", 64, 256, 1, 1, 1, 0, 56),
    conv("r50_1x1_256to64_56", 256, 64, 1, 1, 1, 0, 56),
    conv("r50_1x1_512to128_28", 512, 128, 1, 1, 1, 0, 28),
    conv("r50_1x1_1024to256_14", 1024, 256, 1, 1, 1, 0, 14),
    conv("r50_1x1_2048to512_7", 2048, 512, 1, 1, 1, 0, 7),
    conv("r50_1x1s2_256to512_56", 256, 512, 1, 1, 2, 0, 56),
    // MobileNetV3-large's expansions and projections and its stem.
    conv("mbv3_1x1_16to64_112", 16, 64, 1, 1, 1, 0, 112),
    conv("mbv3_1x1_40to240_28", 40, 240, 1, 1, 1, 0, 28),
    conv("mbv3_1x1_112to672_14", 112, 672, 1, 1, 1, 0, 14),
    conv("mbv3_1x1_672to112_14", 672, 112, 1, 1, 1, 0, 14),
    conv("mbv3_1x1_160to960_7", 160, 960, 1, 1, 1, 0, 7),
    conv("mbv3_3x3s2_stem_3to16_224", 3, 16, 1, 3, 2, 1, 224),
    // MobileNetV2's expansions and projections on 28x28, 14x14 and 7x7 maps (few
    // input or output channels).
    conv("mbv2_1x1_32to192_28", 32, 192, 1, 1, 1, 0, 28),
    conv("mbv2_1x1_192to32_28", 192, 32, 1, 1, 1, 0, 28),
    conv("mbv2_1x1_64to384_14", 64, 384, 1, 1, 1, 0, 14),
    conv("mbv2_1x1_384to64_14", 384, 64, 1, 1, 1, 0, 14),
    conv("mbv2_1x1_96to576_14", 96, 576, 1, 1, 1, 0, 14),
    conv("mbv2_1x1_576to96_14", 576, 96, 1, 1, 1, 0, 14),
    conv("mbv2_1x1_960to160_7", 960, 160, 1, 1, 1, 0, 7),
    conv("mbv2_1x1_320to1280_7", 320, 1280, 1, 1, 1, 0, 7),
    // Its squeeze-excitation convs: 1x1 on one position, matrix-vector products.
    conv("mbv3_se_960to240_1", 960, 240, 1, 1, 1, 0, 1),
    conv("mbv3_se_240to960_1", 240, 960, 1, 1, 1, 0, 1),
    conv("r50_3x3_64_56", 64, 64, 1, 3, 1, 1, 56),
    conv("r50_3x3_128_28", 128, 128, 1, 3, 1, 1, 28),
    conv("r50_3x3_256_14", 256, 256, 1, 3, 1, 1, 14),
    conv("r50_3x3_512_7", 512, 512, 1, 3, 1, 1, 7),
    // Inception-v3's 3x3 at 147x147 and 5x5 at 35x35, DenseNet-121's 3x3 of 32 outputs:
    // convs whose kernel choice session 41 moved (Winograd or AMX -> FMA).
    conv("inc_3x3_32to64_147", 32, 64, 1, 3, 1, 1, 147),
    conv("inc_5x5_48to64_35", 48, 64, 1, 5, 1, 2, 35),
    // DenseNet-121's bottleneck 1x1 convs to 128 channels, from the growing concat.
    conv("dn_1x1_96to128_56", 96, 128, 1, 1, 1, 0, 56),
    conv("dn_1x1_128to128_56", 128, 128, 1, 1, 1, 0, 56),
    conv("dn_1x1_224to128_56", 224, 128, 1, 1, 1, 0, 56),
    conv("dn_1x1_256to128_28", 256, 128, 1, 1, 1, 0, 28),
    conv("dn_3x3_128to32_56", 128, 32, 1, 3, 1, 1, 56),
    conv("dn_3x3_128to32_28", 128, 32, 1, 3, 1, 1, 28),
    conv("r50_3x3s2_128_56", 128, 128, 1, 3, 2, 1, 56),
    conv("r50_3x3s2_256_28", 256, 256, 1, 3, 2, 1, 28),
    conv("r50_7x7s2_stem_3to64_224", 3, 64, 1, 7, 2, 3, 224),
    conv("yolo_3x3s2_16to32_160", 16, 32, 1, 3, 2, 1, 160),
    conv("yolo_3x3s2_64to128_40", 64, 128, 1, 3, 2, 1, 40),
    conv("yolo_3x3_32to32_80", 32, 32, 1, 3, 1, 1, 80),
    // YOLOv8n at 640: the second conv and the class head's 80-channel convs.
    conv("yolo_3x3s2_16to32_320", 16, 32, 1, 3, 2, 1, 320),
    conv("yolo_3x3_64to80_80", 64, 80, 1, 3, 1, 1, 80),
    conv("yolo_3x3_80to80_80", 80, 80, 1, 3, 1, 1, 80),
    conv("yolo_3x3_80to80_40", 80, 80, 1, 3, 1, 1, 40),
    // YOLOv8n at 640: C2f pointwise convs on 160x160 and 80x80 planes (few channels,
    // planes a multiple of 4 KiB apart).
    conv("yolo_1x1_32to32_160", 32, 32, 1, 1, 1, 0, 160),
    conv("yolo_1x1_48to32_160", 48, 32, 1, 1, 1, 0, 160),
    // The same 32->32 on 112x112 planes, whose channels spread over four cache sets.
    conv("sets_1x1_32to32_112", 32, 32, 1, 1, 1, 0, 112),
    conv("yolo_1x1_96to64_80", 96, 64, 1, 1, 1, 0, 80),
    conv("yolo_1x1_48to48_80", 48, 48, 1, 1, 1, 0, 80),
    conv("effnet_3x3s2_stem_3to32_224", 3, 32, 1, 3, 2, 1, 224),
    // SqueezeNet 1.1's stem: no padding, so a 111x111 output; and the same with the
    // padding of the other stems (112x112), to tell the two apart.
    conv("sq_3x3s2_stem_3to64_224", 3, 64, 1, 3, 2, 0, 224),
    conv("sq_3x3s2_stem_3to64_224p1", 3, 64, 1, 3, 2, 1, 224),
    conv("mbv2_dw3x3_144_56", 144, 144, 144, 3, 1, 1, 56),
    conv("mbv2_dw3x3s2_96_112", 96, 96, 96, 3, 2, 1, 112),
    conv("mbv2_dw3x3_960_7", 960, 960, 960, 3, 1, 1, 7),
    conv("mbv2_dw3x3s2_144_56", 144, 144, 144, 3, 2, 1, 56),
    conv("mbv2_dw3x3_192_28", 192, 192, 192, 3, 1, 1, 28),
    conv("mbv2_dw3x3s2_192_28", 192, 192, 192, 3, 2, 1, 28),
    conv("mbv2_dw3x3s2_576_14", 576, 576, 576, 3, 2, 1, 14),
    conv("mbv3_dw3x3_672_14", 672, 672, 672, 3, 1, 1, 14),
    conv("mbv3_dw5x5_960_7", 960, 960, 960, 5, 1, 2, 7),
    // SSDlite's first class head: 546 output channels over a 20x20 map.
    conv("ssd_1x1_672to546_20", 672, 546, 1, 1, 1, 0, 20),
    conv("mbv3_dw5x5s2_672_14", 672, 672, 672, 5, 2, 2, 14),
    // SSDlite320's MobileNetV3 at 20x20, its widest depthwise convs.
    conv("ssd_dw3x3_672_20", 672, 672, 672, 3, 1, 1, 20),
    conv("ssd_dw3x3_480_20", 480, 480, 480, 3, 1, 1, 20),
    conv("mbv3_dw3x3s2_240_28", 240, 240, 240, 3, 2, 1, 28),
    conv("mbv3_dw5x5s2_72_56", 72, 72, 72, 5, 2, 2, 56),
    conv("mbv3_dw3x3s2_64_112", 64, 64, 64, 3, 2, 1, 112),
    // SSDlite320's first depthwise convs, on 160x160 inputs (wider planes than any
    // 224x224 net's).
    conv("ssd_dw3x3_16_160", 16, 16, 16, 3, 1, 1, 160),
    conv("ssd_dw3x3s2_64_160", 64, 64, 64, 3, 2, 1, 160),
    conv("ssd_dw5x5_120_40", 120, 120, 120, 5, 1, 2, 40),
    conv("effnet_dw5x5_240_28", 240, 240, 240, 5, 1, 2, 28),
    // MnasNet 0.5's inverted residuals: channel counts of 48 and 72 on large planes.
    conv("mnas_1x1_16to48_56", 16, 48, 1, 1, 1, 0, 56),
    conv("mnas_dw3x3_48_56", 48, 48, 48, 3, 1, 1, 56),
    conv("mnas_1x1_48to16_56", 48, 16, 1, 1, 1, 0, 56),
    conv("mnas_dw5x5_72_28", 72, 72, 72, 5, 1, 2, 28),
    conv("mnas_dw5x5_576_7", 576, 576, 576, 5, 1, 2, 7),
    // Kernels as large as their stride (patch embeddings, ConvNeXt's downsampling).
    conv("vit_16x16s16_3to384_224", 3, 384, 1, 16, 16, 0, 224),
    conv("convnext_4x4s4_3to96_224", 3, 96, 1, 4, 4, 0, 224),
    conv("convnext_2x2s2_384to768_14", 384, 768, 1, 2, 2, 0, 14),
    conv("convnext_2x2s2_96to192_56", 96, 192, 1, 2, 2, 0, 56),
    conv("effnet_dw5x5_672_14", 672, 672, 672, 5, 1, 2, 14),
    conv("convnext_dw7x7_96_56", 96, 96, 96, 7, 1, 3, 56),
    conv("regnet_g8_3x3_64_56", 64, 64, 8, 3, 1, 1, 56),
    conv("regnet_g16_3x3_256_28", 256, 256, 16, 3, 1, 1, 28),
    conv("regnet_g64_3x3_512_14", 512, 512, 8, 3, 1, 1, 14),
    // RegNet-Y-800MF's: 16 channels per group, stride 2 from each stage's first block.
    conv("regnety_g16_3x3s2_64_112", 64, 64, 4, 3, 2, 1, 112),
    conv("regnety_g16_3x3s2_144_56", 144, 144, 9, 3, 2, 1, 56),
    conv("regnety_g16_3x3_144_28", 144, 144, 9, 3, 1, 1, 28),
    conv("regnety_g16_3x3_320_14", 320, 320, 20, 3, 1, 1, 14),
    conv("regnety_g16_3x3s2_784_14", 784, 784, 49, 3, 2, 1, 14),
    // Its pointwise convs, a third of its time: each stage's width in and out.
    conv("regnety_1x1_32to64_112", 32, 64, 1, 1, 1, 0, 112),
    conv("regnety_1x1_144to144_28", 144, 144, 1, 1, 1, 0, 28),
    conv("regnety_1x1_320to320_14", 320, 320, 1, 1, 1, 0, 14),
    conv("regnety_1x1_784to784_7", 784, 784, 1, 1, 1, 0, 7),
    // 16 output channels (per group), where the channel-lanes kernel's tiles of 16
    // channels and the direct conv's of 12 trade places with the plane's size.
    conv("yolo_3x3_16to16_160", 16, 16, 1, 3, 1, 1, 160),
    // Where Winograd convs start to pay (`conv_winograd::fits`).
    conv("edge_3x3_32to64_80", 32, 64, 1, 3, 1, 1, 80),
    conv("edge_3x3_48to48_80", 48, 48, 1, 3, 1, 1, 80),
    conv("edge_3x3_32to32_40", 32, 32, 1, 3, 1, 1, 40),
    conv("edge_3x3_64to64_40", 64, 64, 1, 3, 1, 1, 40),
    conv("onet_3x3_32to64_23", 32, 64, 1, 3, 1, 0, 23),
    conv("edge_3x3_64to64_14", 64, 64, 1, 3, 1, 1, 14),
    conv("edge_3x3_64to64_28", 64, 64, 1, 3, 1, 1, 28),
    conv("edge_3x3_128to128_14", 128, 128, 1, 3, 1, 1, 14),
    // The PP-OCRv4 detector's head: 96 channels at 160x160.
    conv("ppocr_3x3_96to96_160", 96, 96, 1, 3, 1, 1, 160),
    conv("edge_3x3_16to16_80", 16, 16, 1, 3, 1, 1, 80),
    conv("edge_3x3_16to16_56", 16, 16, 1, 3, 1, 1, 56),
    conv("edge_3x3s2_16to16_160", 16, 16, 1, 3, 2, 1, 160),
    conv("edge_g4_3x3_128to64_28", 128, 64, 4, 3, 1, 1, 28),
    conv("probe_g8_3x3s2_64_56", 64, 64, 8, 3, 2, 1, 56),
    ConvShape {
        d: 2,
        p: 2,
        ..conv("deeplab_3x3d2_256_28", 256, 256, 1, 3, 1, 2, 28)
    },
    // DeepLabV3-MobileNetV3's ASPP on its 33x33 map: dilated 3x3 convs whose taps
    // mostly read padding, and its 1x1 convs.
    ConvShape {
        d: 12,
        p: 12,
        ..conv("deeplab_3x3d12_960to256_33", 960, 256, 1, 3, 1, 12, 33)
    },
    ConvShape {
        d: 24,
        p: 24,
        ..conv("deeplab_3x3d24_960to256_33", 960, 256, 1, 3, 1, 24, 33)
    },
    conv("deeplab_1x1_960to256_33", 960, 256, 1, 1, 1, 0, 33),
    // Its backbone's last stage: depthwise 5x5 convs of dilation 2 (on a 32x32 map in
    // the zoo).
    ConvShape {
        d: 2,
        p: 4,
        ..conv("deeplab_dw5x5d2_960_32", 960, 960, 960, 5, 1, 4, 32)
    },
    conv("deeplab_3x3_256_33", 256, 256, 1, 3, 1, 1, 33),
];

/// A batched MatMul `[batch, m, k] x [k, n]` (shared right operand, `batch_b = 1`) or
/// `[batch, m, k] x [batch, k, n]`.
#[derive(Clone, Copy, Debug)]
pub struct MatMulShape {
    pub name: &'static str,
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub shared_b: bool,
}

impl MatMulShape {
    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.k * self.n) as f64
    }
}

/// BERT-base at sequence 128: the projections, the feed-forward layers and the
/// attention products of 12 heads; ViT-S/16's projections and MLP (197 tokens), and
/// ConvNeXt-T's pointwise layers at its first and last stage.
pub const MATMUL_SHAPES: &[MatMulShape] = &[
    MatMulShape {
        name: "bert_qkv_128x768x768",
        batch: 1,
        m: 128,
        k: 768,
        n: 768,
        shared_b: true,
    },
    MatMulShape {
        name: "bert_ff1_128x768x3072",
        batch: 1,
        m: 128,
        k: 768,
        n: 3072,
        shared_b: true,
    },
    MatMulShape {
        name: "bert_ff2_128x3072x768",
        batch: 1,
        m: 128,
        k: 3072,
        n: 768,
        shared_b: true,
    },
    MatMulShape {
        name: "vit_qkv_197x384x1152",
        batch: 1,
        m: 197,
        k: 384,
        n: 1152,
        shared_b: true,
    },
    MatMulShape {
        name: "vit_mlp1_197x384x1536",
        batch: 1,
        m: 197,
        k: 384,
        n: 1536,
        shared_b: true,
    },
    MatMulShape {
        name: "vit_mlp2_197x1536x384",
        batch: 1,
        m: 197,
        k: 1536,
        n: 384,
        shared_b: true,
    },
    MatMulShape {
        name: "convnext_pw1_3136x96x384",
        batch: 1,
        m: 3136,
        k: 96,
        n: 384,
        shared_b: true,
    },
    MatMulShape {
        name: "convnext_pw2_3136x384x96",
        batch: 1,
        m: 3136,
        k: 384,
        n: 96,
        shared_b: true,
    },
    MatMulShape {
        name: "convnext_pw1_49x768x3072",
        batch: 1,
        m: 49,
        k: 768,
        n: 3072,
        shared_b: true,
    },
    MatMulShape {
        name: "bert_scores_12x128x64x128",
        batch: 12,
        m: 128,
        k: 64,
        n: 128,
        shared_b: false,
    },
    MatMulShape {
        name: "bert_context_12x128x128x64",
        batch: 12,
        m: 128,
        k: 128,
        n: 64,
        shared_b: false,
    },
];

/// An INTS attribute (also what `cargo xtask example` builds its model with).
pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// An INT attribute.
pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

pub fn tensor(shape: &[usize], seed: u32) -> Tensor {
    Tensor::from_f32(shape, data(shape.iter().product(), seed)).expect("shape fits data")
}

/// A product of one row by a constant `k × n` weight (a classifier), for `samples`
/// samples together as a probe runs them (`Kernel::run_rows`: one pass over the
/// weight for every four rows), or for one.
#[derive(Clone, Copy, Debug)]
pub struct RowsShape {
    pub name: &'static str,
    pub k: usize,
    pub n: usize,
    pub samples: usize,
}

impl RowsShape {
    pub fn flops(&self) -> f64 {
        2.0 * (self.samples * self.k * self.n) as f64
    }
}

/// A weight that stays in L2 (1 MB) and MobileNetV3's 1280 -> 1000 classifier (5 MB):
/// one row, four rows (one pass) and eight (two passes).
pub const ROWS_SHAPES: &[RowsShape] = &[
    RowsShape {
        name: "rows_256x1000_x1",
        k: 256,
        n: 1000,
        samples: 1,
    },
    RowsShape {
        name: "rows_256x1000_x4",
        k: 256,
        n: 1000,
        samples: 4,
    },
    RowsShape {
        name: "rows_1280x1000_x1",
        k: 1280,
        n: 1000,
        samples: 1,
    },
    RowsShape {
        name: "rows_1280x1000_x4",
        k: 1280,
        n: 1000,
        samples: 4,
    },
    RowsShape {
        name: "rows_1280x1000_x8",
        k: 1280,
        n: 1000,
        samples: 8,
    },
];

/// A 2-D MaxPool or AveragePool on one image: channels, square window, stride, pads
/// on every side, input height and width (AveragePool counts the padding, as the
/// zoo's do); with a window of 0, GlobalMaxPool or GlobalAveragePool.
#[derive(Clone, Copy, Debug)]
pub struct PoolShape {
    pub name: &'static str,
    pub max: bool,
    pub c: usize,
    pub k: usize,
    pub s: usize,
    pub p: usize,
    pub hw: [usize; 2],
}

impl PoolShape {
    /// Bytes of the input, which a pool reads once: pools do little arithmetic, so
    /// the table gives GB/s of input for them.
    pub fn input_bytes(&self) -> f64 {
        (4 * self.c * self.hw[0] * self.hw[1]) as f64
    }
}

const fn pool(
    name: &'static str,
    max: bool,
    c: usize,
    k: usize,
    s: usize,
    p: usize,
    hw: usize,
) -> PoolShape {
    PoolShape {
        name,
        max,
        c,
        k,
        s,
        p,
        hw: [hw, hw],
    }
}

/// A GlobalMaxPool or GlobalAveragePool: [`pool`] with a window of 0, which
/// [`Case::pool`] reads as global.
const fn global_pool(name: &'static str, max: bool, c: usize, hw: usize) -> PoolShape {
    pool(name, max, c, 0, 1, 0, hw)
}

/// The zoo's pools (`target/zoo`): ResNet-50's and DenseNet-121's stem MaxPool,
/// Inception-v3's unpadded stride-2 MaxPools and stride-1 AveragePools, YOLOv8n's
/// SPPF at 640x640, DenseNet-121's 2x2 transition AveragePools.
pub const POOL_SHAPES: &[PoolShape] = &[
    pool("max3x3s2_64_112", true, 64, 3, 2, 1, 112),
    pool("max3x3s2_24_112", true, 24, 3, 2, 1, 112),
    pool("max3x3s2_64_147_nopad", true, 64, 3, 2, 0, 147),
    pool("max3x3s2_192_71_nopad", true, 192, 3, 2, 0, 71),
    pool("max3x3s2_768_17_nopad", true, 768, 3, 2, 0, 17),
    pool("max5x5s1_128_20", true, 128, 5, 1, 2, 20),
    pool("avg3x3s1_192_35", false, 192, 3, 1, 1, 35),
    pool("avg3x3s1_768_17", false, 768, 3, 1, 1, 17),
    pool("avg2x2s2_128_56", false, 128, 2, 2, 0, 56),
    pool("avg2x2s2_256_28", false, 256, 2, 2, 0, 28),
    // EfficientNet-B0's squeeze-excitation pools.
    global_pool("gap_32_112", false, 32, 112),
    global_pool("gap_144_56", false, 144, 56),
    global_pool("gap_672_14", false, 672, 14),
    global_pool("gap_1152_7", false, 1152, 7),
];

/// A kernel with its inputs, built as a plan builds it (constant inputs known at
/// build time, so weights can be packed once).
pub struct Case {
    kernel: Box<dyn Kernel>,
    inputs: Vec<Tensor>,
    /// Samples run together on the same inputs (`Kernel::run_rows`) when above 1.
    samples: usize,
}

impl Case {
    fn new(op: &str, attrs: &[AttributeProto], inputs: Vec<Tensor>, constant: &[bool]) -> Case {
        let present = vec![true; inputs.len()];
        let consts: Vec<Option<&Tensor>> = inputs
            .iter()
            .zip(constant)
            .map(|(t, &c)| c.then_some(t))
            .collect();
        let spec = NodeSpec {
            name: op,
            op_type: op,
            domain: "",
            opset: 17,
            attrs: Attrs::new(attrs),
            num_inputs: inputs.len(),
            inputs_present: &present,
            num_outputs: 1,
            const_inputs: &consts,
            stable_inputs: &consts.iter().map(Option::is_some).collect::<Vec<_>>(),
        };
        let kernel = build_kernel(&spec).expect("kernel builds");
        Case {
            kernel,
            inputs,
            samples: 1,
        }
    }

    /// A Conv with constant weight and bias.
    pub fn conv(sh: &ConvShape, seed: u32) -> Case {
        let x = tensor(&[1, sh.c, sh.hw[0], sh.hw[1]], seed);
        let w = tensor(&[sh.m, sh.c / sh.group, sh.k, sh.k], seed + 1);
        let b = tensor(&[sh.m], seed + 2);
        let attrs = [
            ints("pads", &[sh.p as i64; 4]),
            ints("strides", &[sh.s as i64; 2]),
            ints("dilations", &[sh.d as i64; 2]),
            int("group", sh.group as i64),
        ];
        Case::new("Conv", &attrs, vec![x, w, b], &[false, true, true])
    }

    /// A MaxPool or AveragePool (`count_include_pad = 1`), or a global pool.
    pub fn pool(sh: &PoolShape, seed: u32) -> Case {
        let x = tensor(&[1, sh.c, sh.hw[0], sh.hw[1]], seed);
        if sh.k == 0 {
            let op = if sh.max {
                "GlobalMaxPool"
            } else {
                "GlobalAveragePool"
            };
            return Case::new(op, &[], vec![x], &[false]);
        }
        let mut attrs = vec![
            ints("kernel_shape", &[sh.k as i64; 2]),
            ints("pads", &[sh.p as i64; 4]),
            ints("strides", &[sh.s as i64; 2]),
        ];
        let op = match sh.max {
            true => "MaxPool",
            false => {
                attrs.push(int("count_include_pad", 1));
                "AveragePool"
            }
        };
        Case::new(op, &attrs, vec![x], &[false])
    }

    /// A MatMul; a shared right operand is a constant (a weight).
    pub fn matmul(sh: &MatMulShape, seed: u32) -> Case {
        let a = tensor(&[sh.batch, sh.m, sh.k], seed);
        let (b, constant) = if sh.shared_b {
            (tensor(&[sh.k, sh.n], seed + 1), true)
        } else {
            (tensor(&[sh.batch, sh.k, sh.n], seed + 1), false)
        };
        Case::new("MatMul", &[], vec![a, b], &[false, constant])
    }

    /// A one-row MatMul by a constant weight, for `sh.samples` samples together.
    pub fn rows(sh: &RowsShape, seed: u32) -> Case {
        let a = tensor(&[1, sh.k], seed);
        let b = tensor(&[sh.k, sh.n], seed + 1);
        Case {
            samples: sh.samples,
            ..Case::new("MatMul", &[], vec![a, b], &[false, true])
        }
    }

    /// Runs the kernel once on rayon's global pool, or on the calling thread (the
    /// first sample's outputs when several run together).
    pub fn run(&self, calling_thread: bool) -> Vec<Tensor> {
        let inputs: Vec<Option<&Tensor>> = self.inputs.iter().map(Some).collect();
        let run = || match self.samples {
            1 => self.kernel.run(&inputs).expect("kernel runs"),
            s => {
                let samples = vec![inputs.clone(); s];
                let mut outs = self
                    .kernel
                    .run_rows(&samples)
                    .expect("the samples run together")
                    .expect("kernel runs");
                outs.swap_remove(0)
            }
        };
        if calling_thread {
            on_calling_thread(run)
        } else {
            run()
        }
    }
}

/// CPU time of the calling thread in seconds: unlike wall time, not inflated while
/// other processes hold the core.
pub fn thread_cpu_seconds() -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        unsafe extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: clock_gettime writes one timespec to a valid pointer.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.sec as f64 + ts.nsec as f64 * 1e-9;
        }
    }
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// The least thread CPU time of `runs` calls of `f` (after one warm-up call).
pub fn min_time(runs: usize, f: impl FnMut()) -> f64 {
    min_time_after(runs, || {}, f)
}

/// As [`min_time`], with `before` run (untimed) ahead of every run of `f`.
pub fn min_time_after(runs: usize, mut before: impl FnMut(), mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            before();
            let t = thread_cpu_seconds();
            f();
            thread_cpu_seconds() - t
        })
        .fold(f64::INFINITY, f64::min)
}

/// The f32 multiply-add peak of one core in GFLOP/s: twelve independent chains of
/// fused multiply-adds on the widest vectors the CPU has (AVX-512 or AVX2), which
/// keeps every FMA pipe busy; the best of five runs of the calling thread.
pub fn fma_peak_gflops() -> f64 {
    const ITERS: u64 = 20_000_000;
    #[cfg(target_arch = "x86_64")]
    {
        let (lanes, run): (f64, fn(u64) -> f32) = if std::arch::is_x86_feature_detected!("avx512f")
        {
            // SAFETY: the CPU has AVX-512F.
            (16.0, |n| unsafe { fma_chains_avx512(n) })
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA.
            (8.0, |n| unsafe { fma_chains_avx2(n) })
        } else {
            return f64::NAN;
        };
        let secs = min_time(5, || {
            std::hint::black_box(run(std::hint::black_box(ITERS)));
        });
        ITERS as f64 * 12.0 * lanes * 2.0 / secs / 1e9
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ITERS;
        f64::NAN
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_chains_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); 12];
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
    _mm512_reduce_add_ps(sum)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_chains_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); 12];
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds eight f32 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes.iter().sum()
}
