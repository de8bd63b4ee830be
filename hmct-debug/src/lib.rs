//! The accuracy-debug analyses on calibrated models: node sensitivity, accumulated
//! error, distributions, channel-wise statistics, sensitivity analysis, health
//! checks, runall and its HTML report, mixed-precision search, and calibration of
//! float models. Each returns its data; the plots and the page render it.

pub mod acc_error;
pub mod calibrate;
pub mod channelwise;
pub mod distribution;
pub mod engine;
pub mod health;
pub mod info;
pub mod json;
pub mod layout;
pub mod mixed_precision;
pub mod outliers;
pub mod precision_table;
pub mod report;
pub mod runall;
pub mod sensitivity;
pub mod sensitivity_analysis;
pub mod shard;
pub mod task_metric;
pub mod usage;
