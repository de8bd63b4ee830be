/// Everything that can go wrong in this crate: inputs that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricError {
    #[error("unknown metric '{name}'; valid metrics are: {valid}", valid = crate::Metric::NAMES.join(", "))]
    UnknownMetric { name: String },
    #[error("cannot compare tensors of different lengths: {x} (float) vs {y} (quantized) elements")]
    LengthMismatch { x: usize, y: usize },
    #[error("table row has {got} cells but the header has {expected} columns")]
    RowWidth { expected: usize, got: usize },
}
