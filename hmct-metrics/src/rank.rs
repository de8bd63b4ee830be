//! The ranking rule: worst candidates first.

use std::cmp::Ordering;

use crate::Metric;

/// Orders two values of `metric` worst first: ascending for cosine-similarity and
/// sqnr, descending for mse, mre and chebyshev. NaN compares after every number, and
/// equal values (including -0.0 vs 0.0) compare equal, so a stable sort keeps their
/// input order.
pub fn compare_worst_first(metric: Metric, a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => {
            let ascending = a.partial_cmp(&b).unwrap_or(Ordering::Equal);
            if metric.worse_is_lower() {
                ascending
            } else {
                ascending.reverse()
            }
        }
    }
}

/// Sorts `items` worst first by `metric` as read by `key`; ties keep their order
/// (pass items in graph order to get the tool's tie rule).
pub fn sort_worst_first<T>(items: &mut [T], metric: Metric, key: impl Fn(&T) -> f64) {
    items.sort_by(|a, b| compare_worst_first(metric, key(a), key(b)));
}

/// The indices of `values` (given in graph order) from worst to best by `metric`.
pub fn rank_worst_first(metric: Metric, values: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    sort_worst_first(&mut order, metric, |&i| values[i]);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAN: f64 = f64::NAN;

    #[test]
    fn cosine_and_sqnr_rank_ascending() {
        let values = [0.99, 0.5, NAN, 0.7, 0.5];
        for metric in [Metric::CosineSimilarity, Metric::Sqnr] {
            assert_eq!(rank_worst_first(metric, &values), [1, 4, 3, 0, 2]);
        }
    }

    #[test]
    fn distances_rank_descending() {
        let values = [0.1, 3.0, NAN, 3.0, f64::INFINITY];
        for metric in [Metric::Mse, Metric::Mre, Metric::Chebyshev] {
            assert_eq!(rank_worst_first(metric, &values), [4, 1, 3, 0, 2]);
        }
    }

    #[test]
    fn nan_last_and_ties_in_input_order() {
        let values = [NAN, 0.0, NAN, -0.0, 0.0];
        assert_eq!(
            rank_worst_first(Metric::CosineSimilarity, &values),
            [1, 3, 4, 0, 2]
        );
        assert_eq!(rank_worst_first(Metric::Mse, &values), [1, 3, 4, 0, 2]);
    }

    #[test]
    fn sorts_records_by_key() {
        let mut rows = vec![("Conv_2", 0.9), ("Conv_4", f64::NAN), ("Conv_9", 0.8)];
        sort_worst_first(&mut rows, Metric::CosineSimilarity, |r| r.1);
        let names: Vec<_> = rows.iter().map(|r| r.0).collect();
        assert_eq!(names, ["Conv_9", "Conv_2", "Conv_4"]);
    }
}
