//! Folding per-sample, per-output metric values into one figure per candidate.

/// Mean of the non-NaN values; NaN when there are none.
///
/// Infinite values are kept (a sample with identical tensors has sqnr = +inf, and the
/// mean is then +inf too).
pub fn nan_mean(values: &[f64]) -> f64 {
    let (sum, count) = values
        .iter()
        .filter(|v| !v.is_nan())
        .fold((0.0, 0usize), |(sum, count), v| (sum + v, count + 1));
    if count == 0 {
        f64::NAN
    } else {
        sum / count as f64
    }
}

/// The tool's aggregation: `per_output[o][s]` is the metric on output `o` for sample
/// `s`. Each output is averaged over its samples with NaN samples skipped, then the
/// outputs are averaged plainly, so an output without a single valid sample makes the
/// result NaN (and the candidate ranks last) rather than being silently dropped.
/// No outputs at all gives NaN.
pub fn aggregate<S: AsRef<[f64]>>(per_output: &[S]) -> f64 {
    if per_output.is_empty() {
        return f64::NAN;
    }
    let sum: f64 = per_output
        .iter()
        .map(|samples| nan_mean(samples.as_ref()))
        .sum();
    sum / per_output.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_samples_are_skipped() {
        assert_eq!(nan_mean(&[1.0, f64::NAN, 0.5]), 0.75);
        assert!(nan_mean(&[f64::NAN, f64::NAN]).is_nan());
        assert!(nan_mean(&[]).is_nan());
        assert_eq!(nan_mean(&[f64::INFINITY, 1.0]), f64::INFINITY);
    }

    #[test]
    fn mean_over_samples_then_over_outputs() {
        // Output 0 averages to 0.9 over its two valid samples, output 1 to 0.5; the
        // result is their plain mean, not the mean of all four values (0.725).
        let per_output = [vec![1.0, 0.8, f64::NAN], vec![0.5, f64::NAN, f64::NAN]];
        assert!((aggregate(&per_output) - 0.7).abs() < 1e-15);
    }

    #[test]
    fn an_output_without_valid_samples_poisons_the_result() {
        let per_output = [vec![1.0], vec![f64::NAN]];
        assert!(aggregate(&per_output).is_nan());
        assert!(aggregate::<Vec<f64>>(&[]).is_nan());
    }
}
