//! MaxPool without indices against a naive reference, bit for bit, on random 1-D to 3-D
//! windows (strides, dilations, pads, ceil mode) over data with ties, signed zeros and
//! NaN: each output is its window's first tap inside the data, replaced by any later
//! tap (in row-major order) greater than it.

mod common;

use common::kernel::{int, ints, run_kernel};
use hmct_tensor::Tensor;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    /// Spatial input shape (1 to 3 axes) after batch 1 and `channels`.
    input: Vec<usize>,
    channels: usize,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    dil: Vec<usize>,
    /// Begin pads then end pads, each below its axis' kernel extent.
    pads: Vec<usize>,
    ceil: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=3)
        .prop_flat_map(|rank| {
            (
                prop::collection::vec((1usize..=40, 1usize..=4, 1usize..=3, 1usize..=3), rank),
                prop::collection::vec((0usize..=3, 0usize..=3), rank),
                1usize..=3,
                any::<bool>(),
                any::<u64>(),
            )
        })
        .prop_filter_map(
            "window larger than the padded input",
            |(axes, pads, channels, ceil, seed)| {
                let rank = axes.len();
                let mut c = Case {
                    input: vec![],
                    channels,
                    kernel: vec![],
                    stride: vec![],
                    dil: vec![],
                    pads: vec![0; 2 * rank],
                    ceil,
                    seed,
                };
                for (a, (&(len, k, s, d), &(pb, pe))) in axes.iter().zip(&pads).enumerate() {
                    // Deeper axes stay short so cases stay small.
                    let len = if rank - a > 2 { len.min(6) } else { len };
                    let extent = (k - 1) * d + 1;
                    c.input.push(len);
                    c.kernel.push(k);
                    c.stride.push(s);
                    c.dil.push(d);
                    c.pads[a] = pb.min(extent - 1);
                    c.pads[rank + a] = pe.min(extent - 1);
                    if len + c.pads[a] + c.pads[rank + a] < extent {
                        return None;
                    }
                }
                Some(c)
            },
        )
}

/// Values with many ties, both zeros, and NaN at about one position in twelve.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match s % 12 {
                0 => f32::NAN,
                1 => 0.0,
                2 => -0.0,
                r => (r as f32 - 6.0) * 0.5,
            }
        })
        .collect()
}

fn out_len(c: &Case, a: usize) -> usize {
    let rank = c.input.len();
    let span = c.input[a] + c.pads[a] + c.pads[rank + a] - ((c.kernel[a] - 1) * c.dil[a] + 1);
    if c.ceil {
        let o = span.div_ceil(c.stride[a]) + 1;
        // The last window has to start inside the input or its begin padding.
        if (o - 1) * c.stride[a] >= c.input[a] + c.pads[a] {
            o - 1
        } else {
            o
        }
    } else {
        span / c.stride[a] + 1
    }
}

fn reference(c: &Case, x: &[f32]) -> Vec<f32> {
    let rank = c.input.len();
    let out: Vec<usize> = (0..rank).map(|a| out_len(c, a)).collect();
    let out_vol: usize = out.iter().product();
    let in_vol: usize = c.input.iter().product();
    let mut y = Vec::new();
    for ch in 0..c.channels {
        for o in 0..out_vol {
            let mut pos = vec![0; rank];
            let mut rest = o;
            for a in (0..rank).rev() {
                pos[a] = rest % out[a];
                rest /= out[a];
            }
            let k_vol: usize = c.kernel.iter().product();
            let mut best: Option<f32> = None;
            for t in 0..k_vol {
                let mut rest = t;
                let mut flat = 0usize;
                let mut inside = true;
                let mut tap = vec![0; rank];
                for a in (0..rank).rev() {
                    tap[a] = rest % c.kernel[a];
                    rest /= c.kernel[a];
                }
                for a in 0..rank {
                    let p =
                        (pos[a] * c.stride[a] + tap[a] * c.dil[a]) as isize - c.pads[a] as isize;
                    if p < 0 || p >= c.input[a] as isize {
                        inside = false;
                    }
                    flat = flat * c.input[a] + p.max(0) as usize;
                }
                if !inside {
                    continue;
                }
                let v = x[ch * in_vol + flat];
                best = match best {
                    None => Some(v),
                    Some(b) if v > b => Some(v),
                    keep => keep,
                };
            }
            y.push(best.unwrap_or(f32::NEG_INFINITY));
        }
    }
    y
}

fn max_pool(c: &Case, x: &Tensor) -> Tensor {
    let mut attrs = vec![
        ints("kernel_shape", &c.kernel),
        ints("strides", &c.stride),
        ints("dilations", &c.dil),
        ints("pads", &c.pads),
    ];
    if c.ceil {
        attrs.push(int("ceil_mode", 1));
    }
    run_kernel("MaxPool", 12, &attrs, &[x])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn max_pool_matches_reference(c in case()) {
        let mut shape = vec![1, c.channels];
        shape.extend(&c.input);
        let data = values(shape.iter().product(), c.seed);
        let x = Tensor::from_f32(&shape, data.clone()).unwrap();
        let want = reference(&c, &data);
        let got = max_pool(&c, &x);
        let Tensor::F32(got) = got else { panic!("MaxPool of f32 gave {}", got.dtype()) };
        let expect_shape: Vec<usize> = [1, c.channels].into_iter()
            .chain((0..c.input.len()).map(|a| out_len(&c, a))).collect();
        prop_assert_eq!(got.shape(), &expect_shape[..]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert_eq!(g.to_bits(), w.to_bits(), "output {} of {:?}: {} vs {}", i, c, g, w);
        }
    }
}
