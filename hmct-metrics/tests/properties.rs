//! Property tests of the metrics, their streaming form and the ranking rule.

use hmct_metrics::{
    InfoAccumulator, InfoFigures, Metric, MetricAccumulator, PairStats, compute, rank_worst_first,
};
use proptest::prelude::*;

/// Any finite f32, from subnormals to ±3.4e38.
fn finite() -> impl Strategy<Value = f32> {
    prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL | prop::num::f32::ZERO
}

/// Values on the scale of real activations, where sums do not lose everything.
fn moderate() -> impl Strategy<Value = f32> {
    -1e4f32..1e4f32
}

fn pair(
    len: impl Into<prop::collection::SizeRange>,
) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    prop::collection::vec((finite(), finite()), len).prop_map(|v| v.into_iter().unzip())
}

fn metric() -> impl Strategy<Value = Metric> {
    prop::sample::select(Metric::ALL.to_vec())
}

fn norm(x: &[f32]) -> f64 {
    x.iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

/// The definitions written as plainly as possible: one sequential sum per term.
fn reference(metric: Metric, x: &[f32], y: &[f32]) -> f64 {
    let n = x.len() as f64;
    let d: Vec<f64> = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| f64::from(a) - f64::from(b))
        .collect();
    match metric {
        Metric::CosineSimilarity => {
            let dot: f64 = x
                .iter()
                .zip(y)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            dot / (norm(x).max(1e-8) * norm(y).max(1e-8))
        }
        Metric::Mse => d.iter().map(|v| v * v).sum::<f64>() / n,
        Metric::Mre => d.iter().map(|v| v.abs()).sum::<f64>() / n,
        Metric::Sqnr => 10.0 * (norm(x) / d.iter().map(|v| v * v).sum::<f64>().sqrt()).log10(),
        Metric::Chebyshev => d.iter().fold(0.0, |m, v| m.max(v.abs())),
    }
}

/// Splits `x` and `y` at the same (sorted, clamped) cut points.
fn chunks<'a>(x: &'a [f32], y: &'a [f32], cuts: &[usize]) -> Vec<(&'a [f32], &'a [f32])> {
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c % (x.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain([x.len()]) {
        out.push((&x[start..c], &y[start..c]));
        start = c;
    }
    out
}

proptest! {
    #[test]
    fn cosine_of_a_vector_with_itself_is_one(x in prop::collection::vec(finite(), 1..200)) {
        // The 1e-8 floor on the norms decides below that (see the crate docs).
        prop_assume!(norm(&x) >= 1e-8);
        let cos = compute(Metric::CosineSimilarity, &x, &x).unwrap();
        prop_assert!((cos - 1.0).abs() <= 1e-9, "cos = {cos}");
    }

    #[test]
    fn identical_tensors_have_infinite_sqnr_and_zero_distances(
        x in prop::collection::vec(finite(), 1..200)
    ) {
        prop_assert_eq!(compute(Metric::Sqnr, &x, &x).unwrap(), f64::INFINITY);
        for m in [Metric::Mse, Metric::Mre, Metric::Chebyshev] {
            prop_assert_eq!(compute(m, &x, &x).unwrap(), 0.0);
        }
    }

    #[test]
    fn symmetric_metrics_are_exactly_symmetric((x, y) in pair(0..200)) {
        for m in [Metric::CosineSimilarity, Metric::Mse, Metric::Mre, Metric::Chebyshev] {
            let (a, b) = (compute(m, &x, &y).unwrap(), compute(m, &y, &x).unwrap());
            prop_assert_eq!(a.to_bits(), b.to_bits(), "{} {} {}", m, a, b);
        }
    }

    #[test]
    fn distances_are_non_negative_and_ordered((x, y) in pair(1..200)) {
        let mse = compute(Metric::Mse, &x, &y).unwrap();
        let mre = compute(Metric::Mre, &x, &y).unwrap();
        let cheb = compute(Metric::Chebyshev, &x, &y).unwrap();
        prop_assert!(mse >= 0.0 && mre >= 0.0 && cheb >= 0.0);
        // A mean never exceeds the maximum (up to the rounding of the sum).
        prop_assert!(mre <= cheb * (1.0 + 1e-12));
        prop_assert!(mse <= cheb * cheb * (1.0 + 1e-12));
        let cos = compute(Metric::CosineSimilarity, &x, &y).unwrap();
        prop_assert!(cos.abs() <= 1.0 + 1e-12, "cos = {cos}");
    }

    #[test]
    fn zero_vectors_have_cosine_zero(x in prop::collection::vec(finite(), 1..100)) {
        let zeros = vec![0.0f32; x.len()];
        prop_assert_eq!(compute(Metric::CosineSimilarity, &x, &zeros).unwrap(), 0.0);
        prop_assert_eq!(compute(Metric::CosineSimilarity, &zeros, &x).unwrap(), 0.0);
        prop_assert_eq!(compute(Metric::CosineSimilarity, &zeros, &zeros).unwrap(), 0.0);
        prop_assert_eq!(compute(Metric::Sqnr, &zeros, &zeros).unwrap(), f64::INFINITY);
    }

    #[test]
    fn matches_a_plain_sequential_implementation(
        (x, y) in prop::collection::vec((moderate(), moderate()), 1..300)
            .prop_map(|v| v.into_iter().unzip::<f32, f32, Vec<f32>, Vec<f32>>()),
        m in metric(),
    ) {
        let got = compute(m, &x, &y).unwrap();
        let want = reference(m, &x, &y);
        if want.is_infinite() {
            prop_assert_eq!(got, want);
        } else {
            // Only the order of the additions differs, so they agree to rounding.
            let tol = 1e-12 * want.abs().max(1.0);
            prop_assert!((got - want).abs() <= tol, "{m}: {got} vs {want}");
        }
    }

    /// Element i always goes to lane i % 8 in order, so the chunking cannot change a
    /// single bit of the result.
    #[test]
    fn any_chunking_is_bit_identical_to_one_shot(
        (x, y) in pair(0..300),
        cuts in prop::collection::vec(0usize..1000, 0..12),
        m in metric(),
    ) {
        let one_shot = compute(m, &x, &y).unwrap();
        let mut acc = MetricAccumulator::new(m);
        let mut info = InfoAccumulator::new();
        let mut stats = PairStats::new();
        for (xc, yc) in chunks(&x, &y, &cuts) {
            acc.update(xc, yc).unwrap();
            info.update(xc, yc).unwrap();
            stats.update(xc, yc).unwrap();
        }
        prop_assert_eq!(acc.finish().to_bits(), one_shot.to_bits());
        prop_assert_eq!(stats.metric(m).to_bits(), one_shot.to_bits());
        prop_assert_eq!(stats.len(), x.len() as u64);
        let whole = InfoFigures::compute(&x, &y).unwrap();
        let streamed = info.finish();
        for (a, b) in [
            (whole.cosine, streamed.cosine),
            (whole.l1, streamed.l1),
            (whole.l2, streamed.l2),
            (whole.chebyshev, streamed.chebyshev),
        ] {
            prop_assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn ranking_is_a_stable_worst_first_permutation(
        values in prop::collection::vec(
            prop_oneof![Just(f64::NAN), Just(0.5), Just(-0.0), Just(0.0), -2.0f64..2.0], 0..40),
        m in metric(),
    ) {
        let order = rank_worst_first(m, &values);
        let mut seen = order.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..values.len()).collect::<Vec<_>>());
        for w in order.windows(2) {
            let (a, b) = (values[w[0]], values[w[1]]);
            if a.is_nan() {
                prop_assert!(b.is_nan(), "NaN before a number");
                prop_assert!(w[0] < w[1]);
            } else if !b.is_nan() {
                if a == b {
                    prop_assert!(w[0] < w[1], "tie out of input order");
                } else if m.worse_is_lower() {
                    prop_assert!(a < b);
                } else {
                    prop_assert!(a > b);
                }
            }
        }
    }
}
