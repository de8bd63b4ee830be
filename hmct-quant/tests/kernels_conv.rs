//! Conv kernels against a naive reference on random shapes (dense, grouped, depthwise,
//! pointwise; strides, dilations, pads), and bit-identical results for 1 and 3 threads.

mod common;

use common::kernel::{f32_bits, int, ints, on_threads, run_kernel};
use hmct_tensor::Tensor;
use proptest::prelude::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Case {
    n: usize,
    cg: usize,
    group: usize,
    mg: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    p: [usize; 4],
}

/// One draw of the dense strategies: batch, input channels per group, groups, output
/// channels per group, height, width, then kernel, stride, dilation and pads.
type Draw = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    (usize, usize),
    (usize, usize),
    (usize, usize),
    (usize, usize, usize, usize),
);

impl Case {
    fn from_draw((n, cg, group, mg, h, w, k, s, d, p): Draw) -> Case {
        Case {
            n,
            cg,
            group,
            mg,
            h,
            w,
            k: [k.0, k.1],
            s: [s.0, s.1],
            d: [d.0, d.1],
            p: [p.0, p.1, p.2, p.3],
        }
    }
}

/// Direct 2-D convolution in f64.
fn reference(c: &Case, x: &[f32], wt: &[f32], b: &[f32]) -> (Vec<f32>, Vec<usize>) {
    let (ci, m) = (c.cg * c.group, c.mg * c.group);
    let oh = (c.h + c.p[0] + c.p[2] - ((c.k[0] - 1) * c.d[0] + 1)) / c.s[0] + 1;
    let ow = (c.w + c.p[1] + c.p[3] - ((c.k[1] - 1) * c.d[1] + 1)) / c.s[1] + 1;
    let mut y = vec![0f32; c.n * m * oh * ow];
    for n in 0..c.n {
        for mo in 0..m {
            let g = mo / c.mg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = b[mo] as f64;
                    for cc in 0..c.cg {
                        let ch = g * c.cg + cc;
                        for a in 0..c.k[0] {
                            for bb in 0..c.k[1] {
                                let yy = (i * c.s[0] + a * c.d[0]) as isize - c.p[0] as isize;
                                let xx = (j * c.s[1] + bb * c.d[1]) as isize - c.p[1] as isize;
                                if yy < 0 || xx < 0 || yy >= c.h as isize || xx >= c.w as isize {
                                    continue;
                                }
                                let xv = x[((n * ci + ch) * c.h + yy as usize) * c.w + xx as usize];
                                let wv = wt[((mo * c.cg + cc) * c.k[0] + a) * c.k[1] + bb];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    y[((n * m + mo) * oh + i) * ow + j] = acc as f32;
                }
            }
        }
    }
    (y, vec![c.n, m, oh, ow])
}

fn run_conv(c: &Case, x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    let attrs = vec![
        ints("strides", &[c.s[0] as i64, c.s[1] as i64]),
        ints("dilations", &[c.d[0] as i64, c.d[1] as i64]),
        ints("pads", &c.p.map(|v| v as i64)),
        int("group", c.group as i64),
    ];
    run_kernel("Conv", 13, &attrs, &[x, w, b])
}

/// Runs `c` on data drawn from `seed`, `seed + 1`, `seed + 2` (input, weight, bias)
/// and compares with the f64 reference.
fn matches_reference(c: &Case, seed: u64) -> Result<(), String> {
    let (ci, m) = (c.cg * c.group, c.mg * c.group);
    let xv = values(c.n * ci * c.h * c.w, seed);
    let wv = values(m * c.cg * c.k[0] * c.k[1], seed + 1);
    let bv = values(m, seed + 2);
    let x = Tensor::from_f32(&[c.n, ci, c.h, c.w], xv.clone()).unwrap();
    let w = Tensor::from_f32(&[m, c.cg, c.k[0], c.k[1]], wv.clone()).unwrap();
    let b = Tensor::from_f32(&[m], bv.clone()).unwrap();
    let got = run_conv(c, &x, &w, &b);
    let (want, shape) = reference(c, &xv, &wv, &bv);
    if got.shape() != shape.as_slice() {
        return Err(format!("shape {:?}, want {shape:?} in {c:?}", got.shape()));
    }
    for (g, r) in got.as_f32().unwrap().iter().zip(&want) {
        if (g - r).abs() > 1e-4 * (1.0 + r.abs()) {
            return Err(format!("{g} vs {r} in {c:?}"));
        }
    }
    Ok(())
}

/// The dilated window fits in the padded input on both axes.
fn window_fits(c: &Case) -> bool {
    c.h + c.p[0] + c.p[2] > (c.k[0] - 1) * c.d[0] && c.w + c.p[1] + c.p[3] > (c.k[1] - 1) * c.d[1]
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        prop_oneof![Just(1usize), 1usize..6],
        1usize..4,
        1usize..4,
        3usize..20,
        3usize..20,
        (1usize..4, 1usize..4),
        (1usize..3, 1usize..3),
        (1usize..3, 1usize..3),
        (0usize..3, 0usize..3, 0usize..3, 0usize..3),
    )
        .prop_map(Case::from_draw)
        .prop_filter("window fits", window_fits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]
    #[test]
    fn conv_matches_reference(c in case()) {
        matches_reference(&c, 1).map_err(TestCaseError::fail)?;
    }
}

/// Depthwise convs with rows wide enough to fill the kernel's register blocks (and a
/// tail), strides up to 3 and padding up to the window.
fn depthwise_case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        1usize..3,
        2usize..12,
        20usize..110,
        (1usize..6, 1usize..6),
        (1usize..4, 1usize..4),
        (1usize..3, 1usize..3),
        (0usize..4, 0usize..4, 0usize..4, 0usize..4),
    )
        .prop_map(|(group, mg, h, w, k, s, d, p)| {
            Case::from_draw((1, 1, group, mg, h, w, k, s, d, p))
        })
        .prop_filter("window fits", window_fits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    #[test]
    fn wide_depthwise_matches_reference(c in depthwise_case()) {
        matches_reference(&c, 7).map_err(TestCaseError::fail)?;
    }
}

/// Dense convs big enough for the direct kernel's full tiles: output channels across
/// several 6-channel blocks and a partial one, rows of 16 positions and more with a
/// tail, single-line (1×1) layouts, strides and dilations that split rows into phases.
fn dense_case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        2usize..10,
        1usize..3,
        1usize..20,
        1usize..24,
        16usize..60,
        (1usize..4, 1usize..4),
        (1usize..4, 1usize..4),
        (1usize..3, 1usize..3),
        (0usize..3, 0usize..3, 0usize..3, 0usize..3),
    )
        .prop_map(Case::from_draw)
        .prop_filter("window fits", window_fits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(80))]
    #[test]
    fn dense_matches_reference(c in dense_case()) {
        matches_reference(&c, 13).map_err(TestCaseError::fail)?;
    }
}

/// Pointwise convs that run on the packed GEMM on CPUs with AVX-512 (24 or more output
/// channels per group, 16 or more input channels, 128 or more positions): row tiles of
/// 12 with tails, positions across panels of 32 and blocks of 384, input channels
/// across blocks of 256, groups and batches.
fn packed_case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        prop_oneof![16usize..40, 250usize..300],
        1usize..3,
        24usize..64,
        8usize..24,
        16usize..44,
    )
        .prop_map(|(n, cg, group, mg, h, w)| {
            Case::from_draw((n, cg, group, mg, h, w, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn packed_matches_reference(c in packed_case()) {
        matches_reference(&c, 19).map_err(TestCaseError::fail)?;
    }
}

/// Shapes at the direct kernel's edges: one output channel past a 6-channel block,
/// rows of exactly 16 and 32 positions, a 1×1 conv over a plane of 16k+1 positions,
/// a conv with so few positions that it splits output channels into chunks, and
/// convs whose sums run over several blocks of input channels, and unpadded convs on
/// narrow rows that run as one line at the input's row width (split into several
/// tasks, several channel blocks or channel chunks, dilated, batched and grouped).
#[test]
fn dense_tile_edges() {
    let base = Case {
        n: 1,
        cg: 3,
        group: 1,
        mg: 7,
        h: 5,
        w: 16,
        k: [3, 3],
        s: [1, 1],
        d: [1, 1],
        p: [1, 1, 1, 1],
    };
    let cases = [
        base.clone(),
        Case {
            w: 32,
            mg: 13,
            ..base.clone()
        },
        Case {
            h: 7,
            w: 7,
            k: [1, 1],
            p: [0; 4],
            mg: 12,
            ..base.clone()
        },
        Case {
            h: 1,
            w: 33,
            k: [1, 1],
            p: [0; 4],
            ..base.clone()
        },
        Case {
            h: 4,
            w: 4,
            cg: 20,
            mg: 100,
            ..base.clone()
        },
        Case {
            h: 9,
            w: 40,
            s: [2, 2],
            k: [3, 3],
            ..base.clone()
        },
        // more input channels × taps than one pass sums: later passes add to the output
        Case {
            h: 6,
            w: 21,
            cg: 40,
            mg: 8,
            ..base.clone()
        },
        Case {
            h: 3,
            w: 7,
            cg: 300,
            k: [1, 1],
            p: [0; 4],
            ..base.clone()
        },
        // one line at the input's row width
        Case {
            h: 23,
            w: 23,
            cg: 32,
            mg: 64,
            p: [0; 4],
            ..base.clone()
        },
        Case {
            h: 4,
            w: 4,
            cg: 80,
            mg: 100,
            k: [2, 2],
            p: [0; 4],
            ..base.clone()
        },
        Case {
            h: 12,
            w: 12,
            d: [2, 2],
            p: [0; 4],
            ..base.clone()
        },
        Case {
            n: 2,
            group: 2,
            h: 10,
            w: 11,
            p: [0; 4],
            ..base.clone()
        },
        // so many output channels that the wide buffer bounds the task's positions
        Case {
            h: 12,
            w: 12,
            cg: 2,
            mg: 600,
            p: [0; 4],
            ..base.clone()
        },
    ];
    for c in cases {
        matches_reference(&c, 17).unwrap();
    }
}

/// 1x1 convs on a single position (squeeze-excitation blocks), grouped and batched,
/// with channel counts on and off the eight running sums, and a 1x1 input that pads
/// or a 3x3 kernel keep off that path.
#[test]
fn single_position_convs() {
    let base = Case {
        n: 1,
        cg: 200,
        group: 1,
        mg: 50,
        h: 1,
        w: 1,
        k: [1, 1],
        s: [1, 1],
        d: [1, 1],
        p: [0; 4],
    };
    let cases = [
        base.clone(),
        Case {
            cg: 13,
            mg: 7,
            n: 3,
            group: 2,
            ..base.clone()
        },
        Case {
            cg: 8,
            mg: 3,
            ..base.clone()
        },
        Case {
            cg: 5,
            mg: 4,
            p: [0, 0, 1, 1],
            ..base.clone()
        },
        Case {
            cg: 9,
            mg: 2,
            k: [3, 3],
            p: [1; 4],
            ..base.clone()
        },
    ];
    for c in cases {
        matches_reference(&c, 23).unwrap();
    }
}

/// Depthwise rows that end exactly on a register block, with windows that need no
/// padding beyond the last output's own column.
#[test]
fn depthwise_rows_ending_on_a_block() {
    for (w, k, s, p) in [
        (63, 1, 2, 0),
        (94, 1, 3, 0),
        (64, 1, 1, 0),
        (66, 3, 2, 1),
        (40, 2, 2, 0),
    ] {
        let c = Case {
            n: 1,
            cg: 1,
            group: 3,
            mg: 1,
            h: 3,
            w,
            k: [1, k],
            s: [1, s],
            d: [1, 1],
            p: [0, p, 0, p],
        };
        matches_reference(&c, 10).unwrap();
    }
}

#[test]
fn conv_is_thread_count_independent() {
    let shapes = [
        // dense 3x3, pointwise with many channels, depthwise stride 2
        Case {
            n: 1,
            cg: 32,
            group: 1,
            mg: 48,
            h: 70,
            w: 90,
            k: [3, 3],
            s: [1, 1],
            d: [1, 1],
            p: [1, 1, 1, 1],
        },
        Case {
            n: 1,
            cg: 200,
            group: 1,
            mg: 300,
            h: 20,
            w: 20,
            k: [1, 1],
            s: [1, 1],
            d: [1, 1],
            p: [0, 0, 0, 0],
        },
        Case {
            n: 2,
            cg: 1,
            group: 64,
            mg: 1,
            h: 80,
            w: 80,
            k: [5, 5],
            s: [2, 2],
            d: [1, 1],
            p: [2, 2, 2, 2],
        },
    ];
    for c in shapes {
        let (ci, m) = (c.cg * c.group, c.mg * c.group);
        let x = Tensor::from_f32(&[c.n, ci, c.h, c.w], values(c.n * ci * c.h * c.w, 4)).unwrap();
        let w = Tensor::from_f32(
            &[m, c.cg, c.k[0], c.k[1]],
            values(m * c.cg * c.k[0] * c.k[1], 5),
        )
        .unwrap();
        let b = Tensor::from_f32(&[m], values(m, 6)).unwrap();
        let run = |threads| on_threads(threads, || run_conv(&c, &x, &w, &b));
        let (one, three) = (run(1), run(3));
        assert_eq!(f32_bits(&one), f32_bits(&three), "{c:?}");
    }
}

/// Kernel rows and columns that read only padding are dropped before the conv runs:
/// a dilation past the map (DeepLab's ASPP, where a 3x3 kernel of dilation 36 on a
/// 32x32 map is a 1x1 conv), a one-row input under a 3x3 kernel, and a right pad
/// that only the last kernel column reads; dense and depthwise, with strides.
#[test]
fn taps_in_padding_only() {
    let base = Case {
        n: 1,
        cg: 20,
        group: 1,
        mg: 30,
        h: 12,
        w: 12,
        k: [3, 3],
        s: [1, 1],
        d: [14, 14],
        p: [14; 4],
    };
    let cases = [
        base.clone(),
        Case {
            d: [6, 14],
            p: [6, 6, 6, 14],
            ..base.clone()
        },
        Case {
            h: 1,
            w: 40,
            d: [1, 1],
            p: [1; 4],
            ..base.clone()
        },
        Case {
            w: 4,
            d: [1, 3],
            p: [1, 0, 1, 3],
            ..base.clone()
        },
        Case {
            cg: 1,
            group: 24,
            mg: 1,
            ..base.clone()
        },
        Case {
            cg: 1,
            group: 16,
            mg: 1,
            h: 1,
            w: 33,
            s: [2, 2],
            d: [1, 1],
            p: [1; 4],
            ..base.clone()
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        assert!(window_fits(c), "case {i}");
        if let Err(e) = matches_reference(c, 40 + i as u64) {
            panic!("case {i}: {e}");
        }
    }
}

/// `bias + Σ_c Σ_taps w·x` in that order with fused multiply-adds, over the taps that
/// read data: the sum every conv kernel computes (a padding tap adds `w·0`, which
/// changes no nonzero sum), so a kernel's output has exactly these bits.
fn in_order_fma(c: &Case, x: &[f32], wt: &[f32], b: &[f32]) -> Vec<f32> {
    let (ci, m) = (c.cg * c.group, c.mg * c.group);
    let oh = (c.h + c.p[0] + c.p[2] - ((c.k[0] - 1) * c.d[0] + 1)) / c.s[0] + 1;
    let ow = (c.w + c.p[1] + c.p[3] - ((c.k[1] - 1) * c.d[1] + 1)) / c.s[1] + 1;
    let mut y = Vec::with_capacity(c.n * m * oh * ow);
    for n in 0..c.n {
        for mo in 0..m {
            let ch0 = mo / c.mg * c.cg;
            for (i, j) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
                let mut acc = b[mo];
                for cc in 0..c.cg {
                    for (a, bb) in (0..c.k[0]).flat_map(|a| (0..c.k[1]).map(move |bb| (a, bb))) {
                        let yy = (i * c.s[0] + a * c.d[0]) as isize - c.p[0] as isize;
                        let xx = (j * c.s[1] + bb * c.d[1]) as isize - c.p[1] as isize;
                        if yy < 0 || xx < 0 || yy >= c.h as isize || xx >= c.w as isize {
                            continue;
                        }
                        let xv = x[((n * ci + ch0 + cc) * c.h + yy as usize) * c.w + xx as usize];
                        acc = xv.mul_add(wt[((mo * c.cg + cc) * c.k[0] + a) * c.k[1] + bb], acc);
                    }
                }
                y.push(acc);
            }
        }
    }
    y
}

/// Dilated convs most of whose taps read padding (DeepLab's ASPP: dilations 12 and 24
/// on a 33x33 map) run band by band, each band with the taps that read data there:
/// with many output channels on the packed GEMM, its windows gathered from the input
/// in place; with few, or on bands of few positions, on a copy of the rectangle the
/// band reads. Every output has the bits of the in-order sum, at 1 and 3 threads.
#[test]
fn padding_heavy_convs_band_by_band() {
    let base = Case {
        n: 2,
        cg: 24,
        group: 1,
        mg: 48,
        h: 33,
        w: 33,
        k: [3, 3],
        s: [1, 1],
        d: [12, 12],
        p: [12; 4],
    };
    let cases = [
        base.clone(),
        Case {
            d: [24, 24],
            p: [24; 4],
            ..base.clone()
        },
        // Unequal axes and pads, two groups.
        Case {
            group: 2,
            h: 30,
            d: [10, 12],
            p: [10, 12, 9, 13],
            ..base.clone()
        },
        // Few output channels: the bands' copies.
        Case {
            mg: 8,
            ..base.clone()
        },
        // Bands of 16 positions and fewer.
        Case {
            h: 10,
            w: 10,
            d: [4, 4],
            p: [4; 4],
            ..base.clone()
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let (ci, m) = (c.cg * c.group, c.mg * c.group);
        let seed = 70 + 3 * i as u64;
        let (xv, wv, bv) = (
            values(c.n * ci * c.h * c.w, seed),
            values(m * c.cg * 9, seed + 1),
            values(m, seed + 2),
        );
        let x = Tensor::from_f32(&[c.n, ci, c.h, c.w], xv.clone()).unwrap();
        let w = Tensor::from_f32(&[m, c.cg, 3, 3], wv.clone()).unwrap();
        let b = Tensor::from_f32(&[m], bv.clone()).unwrap();
        let want: Vec<u32> = in_order_fma(c, &xv, &wv, &bv)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        for threads in [1, 3] {
            let got = on_threads(threads, || run_conv(c, &x, &w, &b));
            assert!(
                f32_bits(&got) == want,
                "case {i} at {threads} threads: {c:?}"
            );
        }
    }
}

/// Convs whose windows do not overlap (kernel no larger than the stride: patch
/// embeddings, ConvNeXt's 2x2 stride-2 downsampling, 1x1 with strides) run on a
/// gathered dense input: 2x2 stride 2 (the vectorized phase split) on odd and even
/// maps, 4x4 stride 4, a kernel smaller than its stride, unequal axes, a dilation,
/// groups, and a batch of two.
#[test]
fn non_overlapping_windows() {
    let base = Case {
        n: 1,
        cg: 12,
        group: 1,
        mg: 40,
        h: 14,
        w: 14,
        k: [2, 2],
        s: [2, 2],
        d: [1, 1],
        p: [0; 4],
    };
    let cases = [
        base.clone(),
        Case {
            h: 15,
            w: 17,
            ..base.clone()
        },
        Case {
            cg: 3,
            h: 32,
            w: 36,
            k: [4, 4],
            s: [4, 4],
            ..base.clone()
        },
        Case {
            k: [2, 3],
            s: [3, 3],
            ..base.clone()
        },
        Case {
            k: [1, 2],
            s: [2, 4],
            d: [1, 2],
            ..base.clone()
        },
        Case {
            group: 4,
            cg: 4,
            mg: 8,
            ..base.clone()
        },
        Case {
            n: 2,
            cg: 5,
            h: 9,
            w: 20,
            ..base.clone()
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        assert!(window_fits(c), "case {i}");
        if let Err(e) = matches_reference(c, 60 + i as u64) {
            panic!("case {i}: {e}");
        }
    }
}

/// Convs whose taps mostly read padding run as one unpadded conv per band of
/// outputs that read data with the same taps: DeepLab-like dilations on a small map
/// (the middle band reads with the centre tap only), unequal dilations and pads,
/// strides, groups, a batch of two, and pads so wide that some outputs read only
/// padding (their bias).
#[test]
fn mostly_padding_taps() {
    let base = Case {
        n: 1,
        cg: 16,
        group: 1,
        mg: 24,
        h: 11,
        w: 11,
        k: [3, 3],
        s: [1, 1],
        d: [8, 8],
        p: [8; 4],
    };
    let cases = [
        base.clone(),
        Case {
            d: [4, 8],
            p: [4, 8, 4, 8],
            ..base.clone()
        },
        Case {
            h: 13,
            w: 9,
            s: [2, 1],
            d: [6, 5],
            p: [6, 5, 6, 5],
            ..base.clone()
        },
        Case {
            group: 2,
            cg: 8,
            mg: 12,
            k: [3, 2],
            d: [7, 9],
            p: [7, 9, 3, 0],
            ..base.clone()
        },
        Case {
            n: 2,
            cg: 3,
            h: 5,
            w: 4,
            k: [1, 3],
            d: [1, 2],
            p: [6, 3, 2, 9],
            ..base.clone()
        },
        // More than 16 input channels: bands run on the channel-lanes kernel (with
        // AVX2 too), an odd number of outputs per band, a batch of two.
        Case {
            n: 2,
            cg: 40,
            mg: 36,
            h: 13,
            w: 12,
            d: [9, 7],
            p: [9, 7, 9, 7],
            ..base.clone()
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        assert!(window_fits(c), "case {i}");
        if let Err(e) = matches_reference(c, 80 + i as u64) {
            panic!("case {i}: {e}");
        }
    }
}

/// 3x3 convs that the Conv op runs by Winograd's F(4x4, 3x3) (64+ channels on planes
/// of 28x28 and more: whole tiles, edge tiles past the output, uneven pads, two images)
/// and by F(2x2, 3x3) (a 14x14 plane), against the f64 reference. Winograd's sums are
/// rounded differently (F(4x4)'s transforms multiply by up to 8·8), so each output is
/// held within 5e-5 of the sum of its products' magnitudes, not of its own value: a
/// wrong tap or transform is off by whole products.
#[test]
fn winograd_convs_match_reference() {
    for (n, c, m, h, w, p) in [
        (1, 64, 64, 28, 28, [1, 1, 1, 1]),
        (2, 64, 80, 30, 29, [0, 1, 2, 1]),
        (1, 96, 64, 33, 35, [1, 1, 1, 1]),
        (1, 64, 64, 14, 14, [1, 1, 1, 1]),
    ] {
        let case = Case {
            n,
            cg: c,
            group: 1,
            mg: m,
            h,
            w,
            k: [3, 3],
            s: [1, 1],
            d: [1, 1],
            p,
        };
        let (xv, wv, bv) = (
            values(n * c * h * w, 40),
            values(m * c * 9, 41),
            values(m, 42),
        );
        let x = Tensor::from_f32(&[n, c, h, w], xv.clone()).unwrap();
        let wt = Tensor::from_f32(&[m, c, 3, 3], wv.clone()).unwrap();
        let b = Tensor::from_f32(&[m], bv.clone()).unwrap();
        let got = run_conv(&case, &x, &wt, &b);
        let (want, shape) = reference(&case, &xv, &wv, &bv);
        assert_eq!(got.shape(), shape.as_slice());
        let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<f32>>();
        let (magnitude, _) = reference(&case, &abs(&xv), &abs(&wv), &abs(&bv));
        for ((g, r), mag) in got.as_f32().unwrap().iter().zip(&want).zip(&magnitude) {
            assert!(
                (g - r).abs() <= 5e-5 * mag,
                "{g} vs {r} (magnitude {mag}) in {case:?}"
            );
        }
    }
}
