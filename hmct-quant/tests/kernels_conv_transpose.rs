//! ConvTranspose against a naive reference on random 2-D shapes, covering both the
//! non-overlapping path (kernel = stride, as in DBNet heads) and the general col2im
//! path, and bit-identical results for 1 and 3 threads.

mod common;

use common::kernel::{int, ints, on_threads, run_kernel};
use hmct_tensor::Tensor;
use proptest::prelude::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
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
    bias: bool,
}

/// Scatter-add ConvTranspose in f64 (no padding, no dilation).
fn reference(c: &Case, x: &[f32], wt: &[f32], b: &[f32]) -> (Vec<f32>, Vec<usize>) {
    let (ci, m) = (c.cg * c.group, c.mg * c.group);
    let oh = c.s[0] * (c.h - 1) + c.k[0];
    let ow = c.s[1] * (c.w - 1) + c.k[1];
    let mut acc = vec![0f64; c.n * m * oh * ow];
    for n in 0..c.n {
        for ch in 0..ci {
            let g = ch / c.cg;
            for mo in 0..c.mg {
                let om = g * c.mg + mo;
                for i in 0..c.h {
                    for j in 0..c.w {
                        let xv = x[((n * ci + ch) * c.h + i) * c.w + j] as f64;
                        for a in 0..c.k[0] {
                            for bb in 0..c.k[1] {
                                let wv = wt[((ch * c.mg + mo) * c.k[0] + a) * c.k[1] + bb] as f64;
                                let (yy, xx) = (i * c.s[0] + a, j * c.s[1] + bb);
                                acc[((n * m + om) * oh + yy) * ow + xx] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    let y = acc
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (v + if c.bias {
                b[(i / (oh * ow)) % m] as f64
            } else {
                0.0
            }) as f32
        })
        .collect();
    (y, vec![c.n, m, oh, ow])
}

fn run(c: &Case, x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    let attrs = vec![
        ints("strides", &[c.s[0] as i64, c.s[1] as i64]),
        ints("kernel_shape", &[c.k[0] as i64, c.k[1] as i64]),
        int("group", c.group as i64),
    ];
    let n_in = if c.bias { 3 } else { 2 };
    run_kernel("ConvTranspose", 13, &attrs, &[x, w, b][..n_in])
}

fn tensors(c: &Case) -> (Tensor, Tensor, Tensor, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (ci, m) = (c.cg * c.group, c.mg * c.group);
    let xv = values(c.n * ci * c.h * c.w, 1);
    let wv = values(ci * c.mg * c.k[0] * c.k[1], 2);
    let bv = values(m, 3);
    (
        Tensor::from_f32(&[c.n, ci, c.h, c.w], xv.clone()).unwrap(),
        Tensor::from_f32(&[ci, c.mg, c.k[0], c.k[1]], wv.clone()).unwrap(),
        Tensor::from_f32(&[m], bv.clone()).unwrap(),
        xv,
        wv,
        bv,
    )
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        1usize..5,
        1usize..3,
        1usize..4,
        1usize..12,
        1usize..12,
        (1usize..4, 1usize..4),
        prop_oneof![Just(None), (1usize..4, 1usize..4).prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(|(n, cg, group, mg, h, w, k, s, bias)| Case {
            n,
            cg,
            group,
            mg,
            h,
            w,
            k: [k.0, k.1],
            // `None`: stride = kernel, the non-overlapping path.
            s: s.map_or([k.0, k.1], |s| [s.0, s.1]),
            bias,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]
    #[test]
    fn conv_transpose_matches_reference(c in case()) {
        let (x, w, b, xv, wv, bv) = tensors(&c);
        let got = run(&c, &x, &w, &b);
        let (want, shape) = reference(&c, &xv, &wv, &bv);
        prop_assert_eq!(got.shape(), shape.as_slice());
        for (g, r) in got.as_f32().unwrap().iter().zip(&want) {
            prop_assert!((g - r).abs() <= 1e-4 * (1.0 + r.abs()), "{} vs {}", g, r);
        }
    }
}

#[test]
fn conv_transpose_is_thread_count_independent() {
    // The DBNet head's first upsampling, at a reduced size, and a grouped one.
    let cases = [
        Case {
            n: 1,
            cg: 24,
            group: 1,
            mg: 24,
            h: 90,
            w: 70,
            k: [2, 2],
            s: [2, 2],
            bias: true,
        },
        Case {
            n: 2,
            cg: 8,
            group: 3,
            mg: 5,
            h: 60,
            w: 50,
            k: [3, 2],
            s: [3, 2],
            bias: false,
        },
    ];
    for c in cases {
        let (x, w, b, ..) = tensors(&c);
        let on = |threads: usize| on_threads(threads, || run(&c, &x, &w, &b));
        let (a, z) = (on(1), on(3));
        assert_eq!(
            a.as_f32().unwrap().as_slice().unwrap(),
            z.as_f32().unwrap().as_slice().unwrap()
        );
    }
}
