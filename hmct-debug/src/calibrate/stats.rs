//! Activation statistics and the threshold of each calibration method.
//!
//! Everything works on |x|, since calibration nodes are symmetric. Non-finite values
//! (masks of -inf, overflow) are ignored: they cannot be represented by any
//! threshold, and letting one infinity set the range would make every other value
//! quantize to zero. Exact zeros are counted apart from the histogram: they quantize
//! exactly whatever the threshold, so they only matter for the percentile rank.

/// Largest finite |x| (0 when there is none).
pub fn max_abs(data: &[f32]) -> f32 {
    data.iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()))
}

/// Histogram of the finite, nonzero |x| on `[0, range]` in equal bins, plus the count
/// of exact zeros. `range` is the largest |x| of all the data (a first pass), so no
/// value falls outside.
#[derive(Clone, Debug, PartialEq)]
pub struct AbsHistogram {
    range: f32,
    bins: Vec<u64>,
    zeros: u64,
}

impl AbsHistogram {
    /// An empty histogram of `nbins` (at least 1) bins over `[0, range]`.
    pub fn new(range: f32, nbins: usize) -> Self {
        AbsHistogram {
            range,
            bins: vec![0; nbins.max(1)],
            zeros: 0,
        }
    }

    /// Adds values. Values above `range` (which a correct first pass rules out) go to
    /// the last bin.
    pub fn add(&mut self, data: &[f32]) {
        let n = self.bins.len();
        if self.range <= 0.0 {
            self.zeros += data.iter().filter(|v| v.is_finite()).count() as u64;
            return;
        }
        let per_unit = n as f64 / f64::from(self.range);
        for &v in data {
            if !v.is_finite() {
                continue;
            }
            if v == 0.0 {
                self.zeros += 1;
                continue;
            }
            let b = (f64::from(v.abs()) * per_unit) as usize;
            self.bins[b.min(n - 1)] += 1;
        }
    }

    pub fn bins(&self) -> &[u64] {
        &self.bins
    }

    pub fn zeros(&self) -> u64 {
        self.zeros
    }

    pub fn range(&self) -> f32 {
        self.range
    }

    fn width(&self) -> f64 {
        f64::from(self.range) / self.bins.len() as f64
    }
}

/// The `p`-quantile of |x| (0 < p ≤ 1) over all values, zeros included, linearly
/// interpolated inside the bin where the rank falls. Returns 0 when every value is
/// zero; the result never exceeds the histogram's range.
pub fn percentile_threshold(h: &AbsHistogram, p: f64) -> f32 {
    let nonzero: u64 = h.bins.iter().sum();
    if nonzero == 0 {
        return 0.0;
    }
    let total = (nonzero + h.zeros) as f64;
    let rank = p.clamp(0.0, 1.0) * total;
    let mut below = h.zeros as f64;
    for (b, &count) in h.bins.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let c = count as f64;
        if below + c >= rank {
            let frac = ((rank - below) / c).clamp(0.0, 1.0);
            // A rank inside the zeros still needs a positive threshold: the bin's top.
            let frac = if frac == 0.0 { 1.0 } else { frac };
            return ((b as f64 + frac) * h.width()).min(f64::from(h.range)) as f32;
        }
        below += c;
    }
    h.range
}

/// Histogram bins for the entropy method on `count` values: `max_bins`, fewer when
/// that would leave under 16 values per bin on average, but never fewer than `levels`.
///
/// KL divergence compares two histograms, which only means something when the bins
/// are well filled. A sparse histogram (an SE block's gate has one value per channel
/// and sample) makes almost any cut look cheap, and the method then clips values
/// that matter. With as many bins as levels the method keeps the full range.
pub fn kl_bins(count: u64, levels: usize, max_bins: usize) -> usize {
    let by_count = usize::try_from(count / 16).unwrap_or(usize::MAX);
    by_count.clamp(levels.min(max_bins), max_bins)
}

/// The entropy (TensorRT-style) threshold for `levels` quantization levels on the
/// positive side (qmax + 1, i.e. 128 for int8).
///
/// For each candidate `i` (from `levels` bins up to all of them) the reference
/// distribution P is the first `i` bins with everything above folded into bin `i-1`;
/// Q merges those `i` bins into `levels` groups and spreads each group's count evenly
/// over its non-empty bins. The candidate with the smallest KL(P‖Q) wins (the largest
/// one on ties) and the threshold is its upper edge. When `levels` is at least the
/// number of bins (int16 on a 2048-bin histogram) Q equals P for every candidate and
/// only the folding costs anything, so the result is the full range.
pub fn kl_threshold(h: &AbsHistogram, levels: usize) -> f32 {
    let n = h.bins.len();
    let bins: Vec<f64> = h.bins.iter().map(|&c| c as f64).collect();
    let total: f64 = bins.iter().sum();
    if total == 0.0 {
        return 0.0;
    }
    let levels = levels.max(1);
    let start = levels.min(n);
    let mut best = (f64::INFINITY, n);
    let mut group_sum = vec![0f64; levels];
    let mut group_nonzero = vec![0usize; levels];
    let mut inside: f64 = bins[..start].iter().sum();
    for i in start..=n {
        if i > start {
            inside += bins[i - 1];
        }
        let outliers = total - inside;
        group_sum.fill(0.0);
        group_nonzero.fill(0);
        for (j, &c) in bins[..i].iter().enumerate() {
            let g = j * levels / i;
            group_sum[g] += c;
            group_nonzero[g] += usize::from(c > 0.0);
        }
        // Q's mass is `inside`, P's is `total`; both are normalized.
        let mut kl = 0f64;
        for (j, &c) in bins[..i].iter().enumerate() {
            let p = if j == i - 1 { c + outliers } else { c };
            if p == 0.0 {
                continue;
            }
            let q = if c > 0.0 {
                let g = j * levels / i;
                group_sum[g] / group_nonzero[g] as f64
            } else {
                0.0
            };
            if q == 0.0 {
                kl = f64::INFINITY;
                break;
            }
            kl += (p / total) * ((p / total) / (q / inside)).ln();
        }
        if kl <= best.0 {
            best = (kl, i);
        }
    }
    (best.1 as f64 * h.width()) as f32
}

/// The threshold minimizing the expected squared quantization error of the nonzero
/// values, for a symmetric integer type with largest level `qmax`.
///
/// Values are taken as uniformly spread inside their bin, which makes the expected
/// error of each bin exact for that model: the rounding error integrated over the bin
/// for the part below the threshold, the clipping error `(x - T)²` above it. The
/// candidates are the bin edges from 1/16 of the range up (the smallest candidate
/// would otherwise clip nearly everything for nothing); ties go to the largest.
pub fn mse_threshold(h: &AbsHistogram, qmax: i64) -> f32 {
    let n = h.bins.len();
    if h.bins.iter().all(|&c| c == 0) {
        return 0.0;
    }
    let w = h.width();
    let start = (n / 16).max(1);
    let mut best = (f64::INFINITY, n);
    for i in start..=n {
        let t = i as f64 * w;
        let err = expected_error(&h.bins, w, t, t / qmax.max(1) as f64);
        if err <= best.0 {
            best = (err, i);
        }
    }
    (best.1 as f64 * w) as f32
}

/// Σ over bins of count × mean squared error of a value uniform in the bin, for
/// threshold `t` and step `s`.
fn expected_error(bins: &[u64], w: f64, t: f64, s: f64) -> f64 {
    let mut sum = 0f64;
    for (j, &c) in bins.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let (a, b) = (j as f64 * w, (j + 1) as f64 * w);
        let rounding = rounding_integral(a, b.min(t), s);
        let clipping = if b > t {
            let lo = a.max(t) - t;
            let hi = b - t;
            (hi * hi * hi - lo * lo * lo) / 3.0
        } else {
            0.0
        };
        sum += c as f64 * (rounding + clipping) / w;
    }
    sum
}

/// ∫ₐᵇ (x − s·round(x/s))² dx (0 when b ≤ a).
fn rounding_integral(a: f64, b: f64, s: f64) -> f64 {
    if b <= a {
        return 0.0;
    }
    // Antiderivative of the periodic squared rounding error, measured from -s/2:
    // k whole periods of s³/12, plus the part of the current period.
    let antiderivative = |x: f64| {
        let u = x + s / 2.0;
        let k = (u / s).floor();
        let r = u - k * s - s / 2.0;
        k * s * s * s / 12.0 + (r * r * r + s * s * s / 8.0) / 3.0
    };
    (antiderivative(b) - antiderivative(a)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_integral_matches_numeric_integration() {
        let s = 0.3;
        for (a, b) in [(0.0, 1.0), (0.07, 0.11), (0.2, 4.9), (1.0, 1.0)] {
            let steps = 200_000;
            let dx = (b - a) / steps as f64;
            let numeric: f64 = (0..steps)
                .map(|k| {
                    let x = a + (k as f64 + 0.5) * dx;
                    let e = x - s * (x / s).round();
                    e * e * dx
                })
                .sum();
            let exact = rounding_integral(a, b, s);
            assert!(
                (exact - numeric).abs() < 1e-9,
                "[{a}, {b}]: {exact} vs {numeric}"
            );
        }
    }

    #[test]
    fn histogram_counts() {
        let mut h = AbsHistogram::new(4.0, 4);
        h.add(&[0.0, 0.5, -1.5, 2.0, 4.0, f32::NAN, f32::INFINITY, -0.0]);
        assert_eq!(h.bins(), &[1, 1, 1, 1]);
        assert_eq!(h.zeros(), 2);
        let mut z = AbsHistogram::new(0.0, 8);
        z.add(&[0.0, 0.0]);
        assert_eq!(z.zeros(), 2);
        assert_eq!(percentile_threshold(&z, 0.9), 0.0);
    }

    #[test]
    fn percentile_on_a_uniform_ramp() {
        // 1000 values 0.001..=1.0: the 0.9-quantile is 0.9.
        let data: Vec<f32> = (1..=1000).map(|k| k as f32 / 1000.0).collect();
        let mut h = AbsHistogram::new(max_abs(&data), 1000);
        h.add(&data);
        let t = percentile_threshold(&h, 0.9);
        assert!((t - 0.9).abs() <= 0.0011, "{t}");
        assert_eq!(percentile_threshold(&h, 1.0), 1.0);
    }
}
