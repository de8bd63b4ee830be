//! MaxPool without indices and AveragePool against naive references, bit for bit, on
//! random 1-D to 3-D windows (strides, dilations, pads, ceil mode) over data with ties,
//! signed zeros and NaN: a max is its window's first tap inside the data, replaced by
//! any later tap (in row-major order) greater than it; an average is the sum of those
//! taps from zero in that order over their count (or the padded count).

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

/// A xorshift stream from `seed`.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Values with many ties, both zeros, and NaN of either sign at about two positions
/// in thirteen.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|_| match next() % 13 {
            0 => f32::NAN,
            1 => 0.0,
            2 => -0.0,
            // A NaN of another sign: where the first tap is NaN, the output is that
            // NaN, bit for bit.
            12 => -f32::NAN,
            r => (r as f32 - 6.0) * 0.5,
        })
        .collect()
}

/// Values whose sums round differently in another order: magnitudes over five decades,
/// both zeros, NaN at about one position in forty.
fn inexact_values(n: usize, seed: u64) -> Vec<f32> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|_| {
            let s = next();
            match s % 40 {
                0 => f32::NAN,
                1 => 0.0,
                2 => -0.0,
                _ => {
                    let mantissa = ((s >> 8) % 2001) as f32 / 1000.0 - 1.0;
                    mantissa * 10f32.powi((s >> 20) as i32 % 5 - 2)
                }
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

/// Per output (channels, then row-major positions): the values of its taps inside the
/// data, in row-major tap order, and how many of its taps lie inside the padded
/// extent (`count_include_pad`'s count: not those past the end padding, which ceil
/// mode can reach).
fn windows(c: &Case, x: &[f32]) -> Vec<(Vec<f32>, usize)> {
    let rank = c.input.len();
    let out: Vec<usize> = (0..rank).map(|a| out_len(c, a)).collect();
    let out_vol: usize = out.iter().product();
    let in_vol: usize = c.input.iter().product();
    let k_vol: usize = c.kernel.iter().product();
    let mut all = Vec::new();
    for ch in 0..c.channels {
        for o in 0..out_vol {
            let mut pos = vec![0; rank];
            let mut rest = o;
            for a in (0..rank).rev() {
                pos[a] = rest % out[a];
                rest /= out[a];
            }
            let (mut inside_values, mut padded) = (Vec::new(), 0);
            for t in 0..k_vol {
                let mut rest = t;
                let mut flat = 0usize;
                let (mut inside, mut in_padding) = (true, true);
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
                    if p >= (c.input[a] + c.pads[rank + a]) as isize {
                        in_padding = false;
                    }
                    flat = flat * c.input[a] + p.max(0) as usize;
                }
                padded += usize::from(in_padding);
                if inside {
                    inside_values.push(x[ch * in_vol + flat]);
                }
            }
            all.push((inside_values, padded));
        }
    }
    all
}

fn reference(c: &Case, x: &[f32]) -> Vec<f32> {
    windows(c, x)
        .into_iter()
        .map(|(values, _)| {
            values
                .into_iter()
                .reduce(|best, v| if v > best { v } else { best })
                .unwrap_or(f32::NEG_INFINITY)
        })
        .collect()
}

/// AveragePool's outputs: `0 + x0 + x1 + ...` over the taps inside the data, in
/// order, divided by their count (or by the padded count).
fn average_reference(c: &Case, x: &[f32], include_pad: bool) -> Vec<f32> {
    windows(c, x)
        .into_iter()
        .map(|(values, padded)| {
            let count = if include_pad { padded } else { values.len() };
            let sum = values.iter().fold(0.0f32, |s, &v| s + v);
            if count == 0 { 0.0 } else { sum / count as f32 }
        })
        .collect()
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

fn average_pool(c: &Case, x: &Tensor, include_pad: bool) -> Tensor {
    let mut attrs = vec![
        ints("kernel_shape", &c.kernel),
        ints("strides", &c.stride),
        ints("dilations", &c.dil),
        ints("pads", &c.pads),
        int("count_include_pad", i64::from(include_pad)),
    ];
    if c.ceil {
        attrs.push(int("ceil_mode", 1));
    }
    run_kernel("AveragePool", 19, &attrs, &[x])
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

    #[test]
    fn average_pool_matches_reference(c in case(), include_pad in any::<bool>()) {
        let mut shape = vec![1, c.channels];
        shape.extend(&c.input);
        let data = inexact_values(shape.iter().product(), c.seed);
        let x = Tensor::from_f32(&shape, data.clone()).unwrap();
        let want = average_reference(&c, &data, include_pad);
        let got = average_pool(&c, &x, include_pad);
        let Tensor::F32(got) = got else { panic!("AveragePool of f32 gave {}", got.dtype()) };
        prop_assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert_eq!(g.to_bits(), w.to_bits(), "output {} of {:?}: {} vs {}", i, c, g, w);
        }
    }
}

/// Stride-1 2-D pools whose output has the input's shape (Inception-v3's 3x3 pools
/// padded by 1, which AVX-512 runs as masked loads over the flat plane): rows of 35,
/// 17 and 8 (vectors of 16 outputs across row ends), one row, one column, uneven pads
/// and a dilated kernel, with and without the padding counted.
#[test]
fn same_shape_average_pools_match_reference() {
    let cases = [
        ([35, 35], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([17, 17], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([8, 8], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 40], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([23, 1], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([9, 13], [2, 4], [1, 1], [0, 2, 1, 1]),
        ([12, 19], [3, 3], [2, 2], [2, 2, 2, 2]),
        ([6, 7], [5, 5], [1, 1], [2, 2, 2, 2]),
    ];
    for (input, kernel, dil, pads) in cases {
        let c = case_2d(input, kernel, [1, 1], dil, pads, 3, 7);
        assert_averages_match(&c);
    }
}

/// A 2-D case without ceil mode.
fn case_2d(
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dil: [usize; 2],
    pads: [usize; 4],
    channels: usize,
    seed: u64,
) -> Case {
    Case {
        input: input.to_vec(),
        channels,
        kernel: kernel.to_vec(),
        stride: stride.to_vec(),
        dil: dil.to_vec(),
        pads: pads.to_vec(),
        ceil: false,
        seed,
    }
}

/// AveragePool of `c` on `inexact_values`, with and without the padding counted,
/// against the reference, bit for bit.
fn assert_averages_match(c: &Case) {
    let shape: Vec<usize> = [1, c.channels]
        .into_iter()
        .chain(c.input.iter().copied())
        .collect();
    let out_shape: Vec<usize> = [1, c.channels]
        .into_iter()
        .chain((0..c.input.len()).map(|a| out_len(c, a)))
        .collect();
    let data = inexact_values(shape.iter().product(), c.seed);
    let x = Tensor::from_f32(&shape, data.clone()).unwrap();
    for include_pad in [false, true] {
        let want = average_reference(c, &data, include_pad);
        let Tensor::F32(got) = average_pool(c, &x, include_pad) else {
            panic!("AveragePool of f32 gave another type")
        };
        assert_eq!(got.shape(), &out_shape[..], "{c:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "output {i} of {c:?}: {g} vs {w}");
        }
    }
}

/// 2-D max and average pools with windows wider than the random cases reach (5 to 16
/// columns, as YOLOv8n's 5x5 SPPF), at strides 1 and 2, padded and unpadded, on rows
/// shorter than the window, of a few vectors and across vector ends, and the zoo's
/// pools: every output against the definition, bit for bit.
#[test]
fn wide_pools_match_reference() {
    let mut cases = vec![
        ([112, 112], [3, 3], [2, 2], [1, 1, 1, 1]),
        ([71, 71], [3, 3], [2, 2], [0, 0, 0, 0]),
        ([20, 20], [5, 5], [1, 1], [2, 2, 2, 2]),
        ([3, 2], [5, 5], [1, 1], [2, 2, 2, 2]),
        ([56, 56], [2, 2], [2, 2], [0, 0, 0, 0]),
        ([27, 27], [2, 2], [2, 2], [0, 0, 1, 1]),
    ];
    for k in [5, 7, 9, 13, 16] {
        for (w, s) in [(k, 1), (k + 3, 2), (33, 1), (70, 2)] {
            let p = k / 2;
            cases.push(([9, w], [3, k], [1, s], [1, p, 1, p.min(k - 1)]));
            cases.push(([9, w], [3, k], [2, s], [0, 0, 0, 0]));
        }
    }
    for (input, kernel, stride, pads) in cases {
        let c = case_2d(input, kernel, stride, [1, 1], pads, 2, 11);
        let shape = [1, c.channels, input[0], input[1]];
        let data = values(shape.iter().product(), c.seed);
        let x = Tensor::from_f32(&shape, data.clone()).unwrap();
        let want = reference(&c, &data);
        let Tensor::F32(got) = max_pool(&c, &x) else {
            panic!("MaxPool of f32 gave another type")
        };
        assert_eq!(got.len(), want.len(), "{c:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "output {i} of {c:?}: {g} vs {w}");
        }
        assert_averages_match(&c);
    }
}
