//! MatMul of one row by a matrix (the dense layers of a CNN at batch 1) against an f64
//! reference, with column counts on and off the kernel's column blocks, and
//! bit-identical results for 1 and 3 threads.

mod common;

use common::kernel::{f32_bits, on_threads, run_kernel};
use hmct_tensor::Tensor;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `a` of shape `a_shape` (one row in all) times a `k × n` matrix.
fn check(a_shape: &[usize], k: usize, n: usize) {
    let a = values(k, 1);
    let b = values(k * n, 2);
    let at = Tensor::from_f32(a_shape, a.clone()).unwrap();
    let bt = Tensor::from_f32(&[k, n], b.clone()).unwrap();
    let run = |threads| on_threads(threads, || run_kernel("MatMul", 13, &[], &[&at, &bt]));
    let (one, three) = (run(1), run(3));
    let mut want_shape = a_shape[..a_shape.len() - 1].to_vec();
    want_shape.push(n);
    assert_eq!(one.shape(), want_shape.as_slice());
    let got: Vec<f32> = one.as_f32().unwrap().iter().copied().collect();
    for j in 0..n {
        let want: f64 = (0..k).map(|i| a[i] as f64 * b[i * n + j] as f64).sum();
        let tol = 1e-5
            * (1.0
                + (0..k)
                    .map(|i| (a[i] * b[i * n + j]).abs() as f64)
                    .sum::<f64>());
        assert!(
            (got[j] as f64 - want).abs() <= tol,
            "{a_shape:?} x [{k}, {n}], column {j}: {} vs {want}",
            got[j]
        );
    }
    assert_eq!(f32_bits(&one), f32_bits(&three), "{a_shape:?} x [{k}, {n}]");
}

#[test]
fn one_row_times_a_matrix() {
    // O-Net's first dense layer, a 1-D vector, a batch of one, few and odd columns,
    // and one large enough to split its column blocks across threads.
    check(&[1, 1152], 1152, 256);
    check(&[7], 7, 1);
    check(&[1, 1, 33], 33, 300);
    check(&[1, 5], 5, 257);
    check(&[1, 3000], 3000, 700);
}
