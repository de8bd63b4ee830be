//! The error metrics of the accuracy debugger (cosine-similarity, mse, mre, sqnr,
//! chebyshev) with the tool's own definitions, f64 accumulation, and the ranking rule.
