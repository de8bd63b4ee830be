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
        let (xs, ys) = (x[head..].chunks_exact(LANES), y[head..].chunks_exact(LANES));
        let (x_tail, y_tail) = (xs.remainder(), ys.remainder());
        let mut lanes = self.lanes;
        for (xb, yb) in xs.zip(ys) {
            for lane in 0..LANES {
                lanes.add(lane, xb[lane], yb[lane]);
            }
        }
        for (lane, (&xv, &yv)) in x_tail.iter().zip(y_tail).enumerate() {
            lanes.add(lane, xv, yv);
        }
        self.lanes = lanes;
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
