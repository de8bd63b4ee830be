//! The error metrics of the accuracy debugger, with the tool's own definitions so that
//! numbers match its tables; the aggregation over samples and outputs; the ranking
//! rule; and the plain-text table layout of its logs.
//!
//! # Definitions
//! `x` is the float reference, `y` the quantized tensor, both flattened; `d = x − y`.
//! Every sum is accumulated in f64 (each f32 product is exact in f64).
//!
//! | metric | value | worse is |
//! |---|---|---|
//! | `cosine-similarity` | dot(x,y) / (max(‖x‖,1e-8)·max(‖y‖,1e-8)) | lower |
//! | `mse` | mean(d²) | higher |
//! | `mre` | mean(\|d\|) | higher |
//! | `sqnr` | 10·log10(‖x‖ / ‖d‖) | lower |
//! | `chebyshev` | max(\|d\|) | higher |
//!
//! Two of these are not what their names usually mean, on purpose (they are the
//! tool's):
//! - `mre` is the mean **absolute** error, not a relative error.
//! - `sqnr` is 10·log10 of the *norm* ratio, i.e. **half** the usual dB figure
//!   (20·log10 of the norms, or 10·log10 of the powers).
//!
//! # Edge cases
//! - Zero vectors: the 1e-8 floors make cosine 0 whenever either tensor is all zeros,
//!   including when both are. Vectors with a norm below 1e-8 are affected by the floor
//!   too, so cosine(x, x) is 1 only for ‖x‖ ≥ 1e-8.
//! - Identical tensors (d = 0 everywhere) have sqnr = +inf, also when both are zero;
//!   a zero `x` against a non-zero `y` has sqnr = −inf.
//! - Empty tensors give NaN for every metric (no evidence either way); the
//!   aggregation skips NaN samples and the ranking puts NaN last.
//! - NaN elements make every metric NaN (chebyshev included).
//! - Tensors of different lengths are an error.
//!
//! # Streaming
//! [`PairStats`] (all sums at once, for several metrics on one pass),
//! [`MetricAccumulator`] (one metric) and [`InfoAccumulator`] take the tensors in
//! chunks. The element order alone fixes the result: any chunking gives bit-identical
//! values to a one-shot [`compute`] (see [`PairStats`] for how).
//!
//! # Aggregation and ranking
//! [`aggregate`]: mean over samples skipping NaN samples, then mean over outputs.
//! [`rank_worst_first`] / [`sort_worst_first`]: worst first by the first metric,
//! NaN last, ties in input (graph) order.
//!
//! # The `info` figures
//! [`InfoFigures`]: cosine = (dot+1e-5)/(‖x‖‖y‖+1e-5), L1 = Σ|d|/N, L2 = √(Σd²)/N,
//! Chebyshev = max|d| — a different, smoothed set used only by the `info` table.
//!
//! # Tables
//! [`Table`] renders the layout of the tool's logs; [`format_value`] writes numbers
//! as the tool does (rounded to 5 decimals, Python float spelling). The seeds title
//! all three sensitivity tables (node, weight, activation) `node sensitivity`; the
//! title is the caller's choice.
//!
//! Dependencies: `thiserror` for the error type, `serde` so [`Metric`] can appear in
//! JSON results under its kebab-case name.

mod aggregate;
mod error;
mod metric;
mod rank;
mod stats;
mod table;

pub use aggregate::{aggregate, nan_mean};
pub use error::MetricError;
pub use metric::Metric;
pub use rank::{compare_worst_first, rank_worst_first, sort_worst_first};
pub use stats::{InfoAccumulator, InfoFigures, MetricAccumulator, PairStats, compute};
pub use table::{
    MAX_CELL_CHARS, Table, display_name, format_value, info_table, python_repr, round_to,
    sensitivity_header, sensitivity_row,
};
