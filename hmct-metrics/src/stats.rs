//! One pass over a (float, quantized) pair collects every sum the metrics need.

use crate::{Metric, MetricError};

/// Partial sums are spread over this many lanes so the inner loop can vectorize.
const LANES: usize = 8;

/// Running sums over a (float x, quantized y) pair of tensors, fed in chunks.
///
/// Element `i` (counted over everything fed so far) always lands in lane `i % 8`, and
/// each lane adds its elements in order; [`PairStats::metric`] then folds the lanes in
/// a fixed order. So the result depends only on the element sequence, never on how it
/// was cut into chunks: any chunking gives bit-identical values to a single `update`.
#[derive(Debug, Clone, Default)]
pub struct PairStats {
    lanes: Lanes,
    len: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Lanes {
    dot: [f64; LANES],
    xx: [f64; LANES],
    yy: [f64; LANES],
    /// Σ(x−y)²
    dd: [f64; LANES],
    /// Σ|x−y|
    ad: [f64; LANES],
    /// max|x−y|; NaN differences are caught through `ad` instead (see `max_abs_diff`).
    max: [f64; LANES],
}

impl Lanes {
    #[inline(always)]
    fn add(&mut self, lane: usize, x: f32, y: f32) {
        // f32 → f64 products and differences are exact; only the sums round.
        let (x, y) = (f64::from(x), f64::from(y));
        let d = x - y;
        self.dot[lane] += x * y;
        self.xx[lane] += x * x;
        self.yy[lane] += y * y;
        self.dd[lane] += d * d;
        self.ad[lane] += d.abs();
        self.max[lane] = self.max[lane].max(d.abs());
    }
}

/// Adds `x` and `y`, starting at lane 0, to `lanes`: with AVX-512 one vector lane per
/// lane, each sum rounded as in [`Lanes::add`] (products and sums apart, never
/// fused), so the bits do not depend on the CPU. Every probe of a sensitivity sweep
/// pays this per compared value and sample: `cargo bench -p hmct-benches --bench
/// metrics`, DeepLabV3's 21x512x512 output 5.3 ms in the compiler's two-lane code, 1.9
/// here.
fn add_blocks(lanes: &mut Lanes, x: &[f32], y: &[f32]) {
    let whole = x.len() / LANES * LANES;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; `whole` ≤ both lengths.
        unsafe { add_blocks_avx512(lanes, &x[..whole], &y[..whole]) };
        add_tail(lanes, &x[whole..], &y[whole..]);
        return;
    }
    // On a copy, which stays in registers.
    let mut copy = *lanes;
    for (xb, yb) in x[..whole]
        .chunks_exact(LANES)
        .zip(y[..whole].chunks_exact(LANES))
    {
        for lane in 0..LANES {
            copy.add(lane, xb[lane], yb[lane]);
        }
    }
    add_tail(&mut copy, &x[whole..], &y[whole..]);
    *lanes = copy;
}

/// The last `x.len() < LANES` pairs, from lane 0.
fn add_tail(lanes: &mut Lanes, x: &[f32], y: &[f32]) {
    for (lane, (&xv, &yv)) in x.iter().zip(y).enumerate() {
        lanes.add(lane, xv, yv);
    }
}

/// [`add_blocks`] on whole blocks of 8, each sum one AVX-512 register.
///
/// # Safety
/// The CPU has AVX-512F; `x.len() == y.len()`, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_blocks_avx512(lanes: &mut Lanes, x: &[f32], y: &[f32]) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == y.len() && x.len().is_multiple_of(LANES));
    let load = |v: &[f64; LANES]| unsafe { _mm512_loadu_pd(v.as_ptr()) };
    let (mut dot, mut xx, mut yy) = (load(&lanes.dot), load(&lanes.xx), load(&lanes.yy));
    let (mut dd, mut ad, mut max) = (load(&lanes.dd), load(&lanes.ad), load(&lanes.max));
    for i in (0..x.len()).step_by(LANES) {
        // SAFETY: i + 8 ≤ len for both.
        let (xv, yv) = unsafe {
            (
                _mm512_cvtps_pd(_mm256_loadu_ps(x.as_ptr().add(i))),
                _mm512_cvtps_pd(_mm256_loadu_ps(y.as_ptr().add(i))),
            )
        };
        let d = _mm512_sub_pd(xv, yv);
        let abs = _mm512_abs_pd(d);
        dot = _mm512_add_pd(dot, _mm512_mul_pd(xv, yv));
        xx = _mm512_add_pd(xx, _mm512_mul_pd(xv, xv));
        yy = _mm512_add_pd(yy, _mm512_mul_pd(yv, yv));
        dd = _mm512_add_pd(dd, _mm512_mul_pd(d, d));
        ad = _mm512_add_pd(ad, abs);
        // A NaN |d| yields the second operand, the running max, as `f64::max` does.
        max = _mm512_max_pd(abs, max);
    }
    let store = |v: &mut [f64; LANES], r| unsafe { _mm512_storeu_pd(v.as_mut_ptr(), r) };
    store(&mut lanes.dot, dot);
    store(&mut lanes.xx, xx);
    store(&mut lanes.yy, yy);
    store(&mut lanes.dd, dd);
    store(&mut lanes.ad, ad);
    store(&mut lanes.max, max);
}

fn fold(lanes: &[f64; LANES]) -> f64 {
    lanes.iter().fold(0.0, |acc, v| acc + v)
}

impl PairStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk of both tensors (same position in each).
    pub fn update(&mut self, x: &[f32], y: &[f32]) -> Result<(), MetricError> {
        if x.len() != y.len() {
            return Err(MetricError::LengthMismatch {
                x: x.len(),
                y: y.len(),
            });
        }
        // Finish the lane round a previous chunk left open, so the blocks below start
        // at lane 0 again.
        let first_lane = (self.len % LANES as u64) as usize;
        let head = ((LANES - first_lane) % LANES).min(x.len());
        for i in 0..head {
            self.lanes.add(first_lane + i, x[i], y[i]);
        }
        add_blocks(&mut self.lanes, &x[head..], &y[head..]);
        self.len += x.len() as u64;
        Ok(())
    }

    /// Number of element pairs fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dot(&self) -> f64 {
        fold(&self.lanes.dot)
    }

    /// ‖x‖₂
    pub fn norm_x(&self) -> f64 {
        fold(&self.lanes.xx).sqrt()
    }

    /// ‖y‖₂
    pub fn norm_y(&self) -> f64 {
        fold(&self.lanes.yy).sqrt()
    }

    /// Σ(x−y)²
    pub fn sum_sq_diff(&self) -> f64 {
        fold(&self.lanes.dd)
    }

    /// Σ|x−y|
    pub fn sum_abs_diff(&self) -> f64 {
        fold(&self.lanes.ad)
    }

    /// max|x−y|, NaN if any difference was NaN, NaN when empty.
    pub fn max_abs_diff(&self) -> f64 {
        // `f64::max` drops NaN operands; a NaN difference still poisons Σ|x−y|, which
        // is how it is detected without a branch per element.
        if self.is_empty() || self.sum_abs_diff().is_nan() {
            return f64::NAN;
        }
        self.lanes.max.iter().fold(0.0, |acc, &v| acc.max(v))
    }

    /// The value of `metric` over everything fed so far (see the crate docs for the
    /// definitions and edge cases). NaN when nothing was fed.
    pub fn metric(&self, metric: Metric) -> f64 {
        if self.is_empty() {
            return f64::NAN;
        }
        let n = self.len as f64;
        match metric {
            Metric::CosineSimilarity => {
                self.dot() / (self.norm_x().max(1e-8) * self.norm_y().max(1e-8))
            }
            Metric::Mse => self.sum_sq_diff() / n,
            Metric::Mre => self.sum_abs_diff() / n,
            Metric::Sqnr => {
                let noise = self.sum_sq_diff().sqrt();
                if noise == 0.0 {
                    f64::INFINITY
                } else {
                    10.0 * (self.norm_x() / noise).log10()
                }
            }
            Metric::Chebyshev => self.max_abs_diff(),
        }
    }

    /// The figures of the `info` table over everything fed so far.
    pub fn info(&self) -> InfoFigures {
        if self.is_empty() {
            return InfoFigures {
                cosine: f64::NAN,
                l1: f64::NAN,
                l2: f64::NAN,
                chebyshev: f64::NAN,
            };
        }
        let n = self.len as f64;
        InfoFigures {
            cosine: (self.dot() + 1e-5) / (self.norm_x() * self.norm_y() + 1e-5),
            l1: self.sum_abs_diff() / n,
            l2: self.sum_sq_diff().sqrt() / n,
            chebyshev: self.max_abs_diff(),
        }
    }
}

/// Streaming computation of one metric: feed chunks with [`update`](Self::update), read
/// the value with [`finish`](Self::finish). No copy of the tensors is made.
#[derive(Debug, Clone)]
pub struct MetricAccumulator {
    metric: Metric,
    stats: PairStats,
}

impl MetricAccumulator {
    pub fn new(metric: Metric) -> Self {
        Self {
            metric,
            stats: PairStats::new(),
        }
    }

    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Feeds the next chunk of the float (`x`) and quantized (`y`) tensors.
    pub fn update(&mut self, x: &[f32], y: &[f32]) -> Result<(), MetricError> {
        self.stats.update(x, y)
    }

    /// The metric over everything fed so far; NaN if nothing was fed.
    pub fn finish(&self) -> f64 {
        self.stats.metric(self.metric)
    }
}

/// `metric` between a float tensor `x` and a quantized tensor `y`, both flattened.
pub fn compute(metric: Metric, x: &[f32], y: &[f32]) -> Result<f64, MetricError> {
    let mut acc = MetricAccumulator::new(metric);
    acc.update(x, y)?;
    Ok(acc.finish())
}

/// The per-tensor figures of the `info` table (printed with 6 decimals).
///
/// These are not the debugger's metrics: cosine is smoothed as
/// (dot+1e-5)/(‖x‖‖y‖+1e-5), and the L2 "distance" is divided by N, not √N.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InfoFigures {
    pub cosine: f64,
    /// Σ|x−y| / N
    pub l1: f64,
    /// √(Σ(x−y)²) / N
    pub l2: f64,
    /// max|x−y|
    pub chebyshev: f64,
}

impl InfoFigures {
    /// The figures for a whole pair of tensors in one call.
    pub fn compute(x: &[f32], y: &[f32]) -> Result<Self, MetricError> {
        let mut acc = InfoAccumulator::new();
        acc.update(x, y)?;
        Ok(acc.finish())
    }
}

/// Streaming computation of [`InfoFigures`], with the same chunking guarantee as
/// [`PairStats`].
#[derive(Debug, Clone, Default)]
pub struct InfoAccumulator {
    stats: PairStats,
}

impl InfoAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, x: &[f32], y: &[f32]) -> Result<(), MetricError> {
        self.stats.update(x, y)
    }

    /// The figures over everything fed so far; all NaN if nothing was fed.
    pub fn finish(&self) -> InfoFigures {
        self.stats.info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(x: &[f32], y: &[f32]) -> [f64; 5] {
        Metric::ALL.map(|m| compute(m, x, y).unwrap())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn hand_computed_small_case() {
        // d = [0, 0, -1]; dot = 17, ‖x‖² = 14, ‖y‖² = 21, ‖d‖ = 1.
        let [cos, mse, mre, sqnr, cheb] = all(&[1.0, 2.0, 3.0], &[1.0, 2.0, 4.0]);
        assert!(close(cos, 17.0 / 294f64.sqrt()), "{cos}");
        assert!(close(mse, 1.0 / 3.0));
        assert!(close(mre, 1.0 / 3.0));
        assert!(close(sqnr, 5.0 * 14f64.log10()), "{sqnr}");
        assert_eq!(cheb, 1.0);
    }

    #[test]
    fn mre_is_mean_absolute_error_and_sqnr_is_half_the_db_figure() {
        // x = [1,-1], y = [-1,1]: |d| = 2 each, ‖x‖/‖d‖ = √2/√8 = 1/2.
        let [cos, mse, mre, sqnr, cheb] = all(&[1.0, -1.0], &[-1.0, 1.0]);
        assert!(close(cos, -1.0));
        assert_eq!(mse, 4.0);
        assert_eq!(mre, 2.0);
        assert!(close(sqnr, 10.0 * 0.5f64.log10()), "{sqnr}");
        assert_eq!(cheb, 2.0);
    }

    #[test]
    fn zero_vector_rules() {
        let [cos, mse, mre, sqnr, cheb] = all(&[3.0, 4.0], &[0.0, 0.0]);
        assert_eq!(cos, 0.0);
        assert_eq!(mse, 12.5);
        assert_eq!(mre, 3.5);
        assert_eq!(sqnr, 0.0);
        assert_eq!(cheb, 4.0);

        let [cos, mse, mre, sqnr, cheb] = all(&[0.0, 0.0], &[0.0, 0.0]);
        assert_eq!((cos, mse, mre, cheb), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(sqnr, f64::INFINITY);

        let [cos, _, _, sqnr, _] = all(&[0.0, 0.0], &[1.0, 0.0]);
        assert_eq!(cos, 0.0);
        assert_eq!(sqnr, f64::NEG_INFINITY);
    }

    #[test]
    fn identical_tensors() {
        let x = [0.5f32, -2.0, 7.25];
        let [cos, mse, mre, sqnr, cheb] = all(&x, &x);
        assert!(close(cos, 1.0));
        assert_eq!((mse, mre, cheb), (0.0, 0.0, 0.0));
        assert_eq!(sqnr, f64::INFINITY);
    }

    #[test]
    fn cosine_floor_applies_to_tiny_norms() {
        // ‖x‖ = 1e-10 < 1e-8: the floor, not the norm, divides.
        let x = [1e-10f32];
        let expected = f64::from(x[0]).powi(2) / 1e-16;
        assert!(close(
            compute(Metric::CosineSimilarity, &x, &x).unwrap(),
            expected
        ));
    }

    #[test]
    fn empty_is_nan() {
        for m in Metric::ALL {
            assert!(compute(m, &[], &[]).unwrap().is_nan(), "{m}");
        }
        let info = InfoFigures::compute(&[], &[]).unwrap();
        assert!(info.cosine.is_nan() && info.l1.is_nan() && info.l2.is_nan());
        assert!(info.chebyshev.is_nan());
    }

    #[test]
    fn nan_elements_poison_every_metric() {
        let x = [1.0f32, f32::NAN, 3.0];
        let y = [1.0f32, 2.0, 5.0];
        for m in Metric::ALL {
            assert!(compute(m, &x, &y).unwrap().is_nan(), "{m}");
        }
        assert!(InfoFigures::compute(&x, &y).unwrap().chebyshev.is_nan());
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let err = compute(Metric::Mse, &[1.0, 2.0], &[1.0]).unwrap_err();
        assert_eq!(err, MetricError::LengthMismatch { x: 2, y: 1 });
        let mut acc = MetricAccumulator::new(Metric::Mse);
        acc.update(&[1.0], &[3.0]).unwrap();
        assert!(acc.update(&[1.0], &[]).is_err());
        // A rejected chunk leaves the accumulator as it was.
        assert_eq!(acc.finish(), 4.0);
    }

    #[test]
    fn values_beyond_f32_squares_do_not_overflow() {
        // (3e38)² overflows f32 but not f64.
        let a = f64::from(3e38f32);
        let mse = compute(Metric::Mse, &[3e38], &[-3e38]).unwrap();
        assert!(mse.is_finite());
        assert_eq!(mse, (2.0 * a) * (2.0 * a));
    }

    #[test]
    fn info_figures_hand_computed() {
        // d = [0, 0, -1], N = 3.
        let f = InfoFigures::compute(&[1.0, 2.0, 3.0], &[1.0, 2.0, 4.0]).unwrap();
        assert!(close(f.cosine, (17.0 + 1e-5) / (294f64.sqrt() + 1e-5)));
        assert!(close(f.l1, 1.0 / 3.0));
        assert!(close(f.l2, 1.0 / 3.0));
        assert_eq!(f.chebyshev, 1.0);

        // The smoothing makes two zero vectors "identical" for info (cosine 1).
        let f = InfoFigures::compute(&[0.0, 0.0], &[0.0, 0.0]).unwrap();
        assert_eq!((f.cosine, f.l1, f.l2, f.chebyshev), (1.0, 0.0, 0.0, 0.0));

        // L2 divides by N, not √N: four unit differences give 2/4.
        let f = InfoFigures::compute(&[1.0; 4], &[0.0; 4]).unwrap();
        assert_eq!(f.l2, 0.5);
    }

    /// The vector path (AVX-512 where the CPU has it) against `Lanes::add` element by
    /// element: every sum bit for bit, on values of all magnitudes, signed zeros,
    /// subnormals, infinities and a NaN.
    #[test]
    fn vector_sums_are_the_scalar_sums() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let special = [
            0.0,
            -0.0,
            1e-40,
            -3e-39,
            f32::INFINITY,
            f32::MAX,
            -f32::MAX,
            1e30,
        ];
        for len in [0, 7, 8, 9, 64, 1001] {
            for with_nan in [false, true] {
                let mut value = || {
                    let r = next();
                    if r % 17 == 0 {
                        special[(r >> 8) as usize % special.len()]
                    } else {
                        let mag = ((r >> 8) % 60) as i32 - 30;
                        ((r >> 32) as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(mag)
                    }
                };
                let mut x: Vec<f32> = (0..len).map(|_| value()).collect();
                let y: Vec<f32> = (0..len).map(|_| value()).collect();
                if with_nan && len > 3 {
                    x[3] = f32::NAN;
                }
                let mut vector = Lanes::default();
                add_blocks(&mut vector, &x, &y);
                let mut scalar = Lanes::default();
                for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                    scalar.add(i % LANES, a, b);
                }
                let bits =
                    |l: &Lanes| [l.dot, l.xx, l.yy, l.dd, l.ad, l.max].map(|s| s.map(f64::to_bits));
                assert_eq!(bits(&vector), bits(&scalar), "len {len}, NaN {with_nan}");
            }
        }
    }

    #[test]
    fn several_metrics_from_one_pass() {
        let (x, y) = ([1.0f32, 2.0, 3.0], [1.5f32, 2.0, 2.0]);
        let mut stats = PairStats::new();
        stats.update(&x, &y).unwrap();
        assert_eq!(stats.len(), 3);
        for m in Metric::ALL {
            assert_eq!(
                stats.metric(m).to_bits(),
                compute(m, &x, &y).unwrap().to_bits()
            );
        }
    }
}
