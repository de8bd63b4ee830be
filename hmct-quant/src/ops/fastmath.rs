//! Branch-free f32 `exp` and `erf` that loops vectorize, and the Exp/Sigmoid/Erf/Gelu
//! slice kernels built on them (compiled for AVX-512 or AVX2 when the CPU has them;
//! the same operations on 16 or 8 lanes, so the same bits).
//!
//! libm's `expf` is a call per element and dominates Sigmoid (SiLU) and Softmax.
//! This one is Cody-Waite range reduction plus the Cephes `expf` polynomial: within
//! 1 ulp of the exact value for normal results (tested to 2). Results below the smallest normal
//! float (x < -87.34) flush to 0 instead of going subnormal. Every multiply-add is
//! fused (`mul_add`: one rounding, the same result with or without an FMA unit), so
//! the AVX2+FMA and baseline builds give bit-identical results; the FMA build does the
//! polynomial in half the instructions (Sigmoid was a fifth of EfficientNet-B0's time).

/// Above this `exp` overflows to infinity.
const HI: f32 = 88.722_83;
/// Below this `exp` is under the smallest normal float.
const LO: f32 = -87.336_54;

/// `e^x` as `2^n · p(r)` with `x = n ln 2 + r`: the rounded `n` and the polynomial.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and removing 1.5 * 2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let n = x.mul_add(LOG2E, ROUND) - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let p = 1.987_569_1e-4f32.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 5.000_000_1e-1);
    (n, (p * r).mul_add(r, r) + 1.0)
}

/// `2^n` for a whole `n` in -126..=127, from its exponent bits: adding 2^23 + 127
/// leaves `n + 127` in the low mantissa bits (no float-to-int conversion, so the loop
/// vectorizes).
#[inline(always)]
fn pow2(n: f32) -> f32 {
    f32::from_bits((n + 8_388_735.0).to_bits() << 23)
}

/// `e^x` to within 2 ulp (see the module docs for the range).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let (n, p) = exp_parts(x);
    // In range n is in -126..=128; 2^128 is not a float, so that case scales by
    // 2^127 and doubles (exact).
    let ns = n.clamp(-126.0, 127.0);
    let y = p * pow2(ns) * if n > ns { 2.0 } else { 1.0 };
    if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        y
    }
}

/// [`exp_f32`] of an `x` that is not positive (or NaN), with its bits in fewer
/// instructions: `n` is at most 0, so neither overflow case can arise, and below `LO`
/// the result is 0. Softmax's exponents are of values less their row's maximum.
#[inline(always)]
pub(crate) fn exp_f32_nonpositive(x: f32) -> f32 {
    let y = exp_f32_in_range(x);
    if x < LO { 0.0 } else { y }
}

/// [`exp_f32`] of an `x` in `LO..=87.0` (where `n` is in -126..=126), with its bits
/// and none of its range checks.
#[inline(always)]
fn exp_f32_in_range(x: f32) -> f32 {
    let (n, p) = exp_parts(x);
    p * pow2(n)
}

/// `erf(x)` to within 2 ulp (libm's `erff` is a call with branches per element:
/// 16% of ConvNeXt-T's time went to its GELUs' Erf).
///
/// Two pieces, both computed and one selected, so loops vectorize: `x * P(x^2)`
/// below |x| = 0.921875, `1 - exp(Q(|x|))` above, with `Q` close to `ln erfc`;
/// from |x| = 4 on erf rounds to +-1. Coefficients from `tools/fit_erf.py`
/// (near-minimax relative error; 2 ulp with an exact `exp`).
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    const SPLIT: f32 = 0.921_875;
    let a = x.abs();
    let s = a * a;
    let p = (-5.990_992e-4f32).mul_add(s, 4.993_213e-3);
    let p = p.mul_add(s, -2.676_664_5e-2);
    let p = p.mul_add(s, 1.128_181_7e-1);
    let p = p.mul_add(s, -3.761_249_5e-1);
    let p = p.mul_add(s, 1.128_379_1);
    let small = p * a;
    let t = a.min(4.0);
    let q = (-5.028_421_7e-7f32).mul_add(t, -1.457_805_2e-5);
    let q = q.mul_add(t, 3.983_054_2e-4);
    let q = q.mul_add(t, -4.058_853_3e-3);
    let q = q.mul_add(t, 2.490_627_6e-2);
    let q = q.mul_add(t, -1.080_261_5e-1);
    let q = q.mul_add(t, -6.335_323_5e-1);
    let q = q.mul_add(t, -1.129_439);
    let q = q.mul_add(t, 1.613_295_9e-4);
    // `q` lies in -18.0..=0.0002 (`t` in 0..=4, a NaN `x` included: `min` gives 4).
    let large = 1.0 - exp_f32_in_range(q);
    let y = if a < SPLIT { small } else { large };
    if x.is_nan() { x } else { y.copysign(x) }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
pub(crate) fn erf_slice(x: &[f32], y: &mut [f32]) {
    for (y, &v) in y.iter_mut().zip(x) {
        *y = erf_f32(v);
    }
}

/// ONNX `Gelu` (erf form), as the generic kernel writes it: `0.5 x (1 + erf(x / sqrt 2))`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
pub(crate) fn gelu_slice(x: &[f32], y: &mut [f32]) {
    let r = std::f32::consts::FRAC_1_SQRT_2;
    for (y, &v) in y.iter_mut().zip(x) {
        *y = 0.5 * v * (1.0 + erf_f32(v * r));
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
pub(crate) fn exp_slice(x: &[f32], y: &mut [f32]) {
    for (y, &v) in y.iter_mut().zip(x) {
        *y = exp_f32(v);
    }
}

/// The logistic function `1 / (1 + e^-v)` on [`exp_f32`]'s arithmetic, flushing
/// results below the smallest normal float to 0 as `exp_f32` does (`-v` above `-LO`).
///
/// Where `-v` lies in `LO..=-LO` the exponent `n` is in -126..=126, so the overflow
/// handling of `exp_f32` (a clamp, a compare and a doubling) and its range checks drop
/// out: a SiLU, the tail of most of EfficientNet-B0's and YOLOv8n's convs, went from 26
/// to 23 vector instructions (one for the NaN case below), and the whole runs 2-4% and 1-2% faster (`sh
/// tools/ab_models.sh`, two runs of 3-4 rounds). Below `LO`, `e^-v` rounds `1 + e^-v`
/// to 1 either way. The results are `1 / (1 + exp_f32(-v))`'s, bit for bit, for every
/// `v` but those where that gives a subnormal (tested).
///
/// The division stays: four Newton steps from a guess out of the bits give the same
/// quotient (checked over every f32 divisor from 1 to 2^126 in a scratch loop), but
/// their eight dependent multiply-adds made EfficientNet-B0 6-10% slower than the
/// one division.
#[inline(always)]
pub(crate) fn sigmoid_f32(v: f32) -> f32 {
    let a = -v;
    // Not `max`: a NaN must stay NaN.
    let (n, p) = exp_parts(if a < LO { LO } else { a });
    let s = 1.0 / (1.0 + p * pow2(n));
    // A NaN comes back as itself. Through the arithmetic it came back negated, and a
    // SiLU's `x · sigmoid(x)` then multiplies two different NaNs, of which the
    // compiler may pass on either (operand order is its choice): the fused chain and
    // the Sigmoid and Mul nodes run one by one gave NaNs of opposite signs in a build
    // at `opt-level = 2`.
    if a > -LO {
        0.0
    } else if v.is_nan() {
        v
    } else {
        s
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
pub(crate) fn sigmoid_slice(x: &[f32], y: &mut [f32]) {
    for (y, &v) in y.iter_mut().zip(x) {
        *y = sigmoid_f32(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_over_the_normal_range() {
        let mut worst = 0;
        let mut x = LO;
        while x < HI {
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp_f32(x), want));
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn erf_is_within_two_ulp() {
        let mut worst = (0, 0.0);
        let mut x = -6.0f32;
        while x < 6.0 {
            let want = libm::erf(x as f64) as f32;
            let e = ulps(erf_f32(x), want);
            if e > worst.0 {
                worst = (e, x);
            }
            x += 0.000_173;
        }
        // Tiny arguments, where erf(x) is 2x/sqrt(pi) to f32 precision.
        for x in [1e-30f32, 1e-20, 1e-10, 3e-5, -2e-7] {
            let e = ulps(erf_f32(x), libm::erf(x as f64) as f32);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 2, "worst error {} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn erf_edges() {
        assert_eq!(erf_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf_f32(4.0), 1.0);
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        let mut y = [0.0; 2];
        erf_slice(&[1e9, -1e9], &mut y);
        assert_eq!(y, [1.0, -1.0]);
    }

    #[test]
    fn exp_of_nonpositive_values_has_exps_bits() {
        let mut x = -0.0f32;
        let mut checked = 0;
        while x > -100.0 {
            assert_eq!(
                exp_f32_nonpositive(x).to_bits(),
                exp_f32(x).to_bits(),
                "{x}"
            );
            x = f32::from_bits(x.to_bits() + 4099);
            checked += 1;
        }
        assert!(checked > 200_000);
        for x in [
            0.0,
            LO,
            LO - 1e-5,
            f32::NEG_INFINITY,
            f32::MIN,
            -f32::MIN_POSITIVE,
        ] {
            assert_eq!(
                exp_f32_nonpositive(x).to_bits(),
                exp_f32(x).to_bits(),
                "{x}"
            );
        }
        assert!(exp_f32_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn exp_in_range_has_exps_bits() {
        for start in [0.0f32, -0.0] {
            let mut x = start;
            while (LO..=87.0).contains(&x) {
                assert_eq!(exp_f32_in_range(x).to_bits(), exp_f32(x).to_bits(), "{x}");
                x = f32::from_bits(x.to_bits() + 4099);
            }
        }
        for x in [LO, 87.0, f32::MIN_POSITIVE] {
            assert_eq!(exp_f32_in_range(x).to_bits(), exp_f32(x).to_bits(), "{x}");
        }
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        // Largest finite results.
        assert!(exp_f32(88.7).is_finite());
        let mut y = [0.0; 3];
        sigmoid_slice(&[0.0, 50.0, -200.0], &mut y);
        assert_eq!(y, [0.5, 1.0, 0.0]);
    }

    #[test]
    fn sigmoid_is_one_over_one_plus_exp_above_the_subnormals() {
        let reference = |v: f32| 1.0 / (1.0 + exp_f32(-v));
        let mut v = -90.0f32;
        let mut inputs = vec![
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            0.0,
            -0.0,
        ];
        while v < 90.0 {
            inputs.push(v);
            v += 0.000_377;
        }
        for v in [
            LO,
            -LO,
            HI,
            -HI,
            // The neighbours of the ends of the range (bits one apart).
            f32::from_bits(LO.to_bits() - 1),
            f32::from_bits((-LO).to_bits() - 1),
            f32::from_bits((-LO).to_bits() + 1),
        ] {
            inputs.extend([v, -v]);
        }
        let mut y = vec![0.0; inputs.len()];
        sigmoid_slice(&inputs, &mut y);
        for (&v, &s) in inputs.iter().zip(&y) {
            let want = reference(v);
            if want >= f32::MIN_POSITIVE || want == 0.0 {
                assert_eq!(s.to_bits(), want.to_bits(), "sigmoid({v})");
            } else {
                assert_eq!(s, 0.0, "sigmoid({v}) below the normals");
            }
        }
        let nan = f32::from_bits(0x7FC0_1234);
        assert_eq!(sigmoid_f32(nan).to_bits(), nan.to_bits());
        assert_eq!(sigmoid_f32(-nan).to_bits(), (-nan).to_bits());
    }
}
