//! The accuracy-debug analyses on calibrated models: node sensitivity, accumulated
//! error, distributions, channel-wise statistics, sensitivity analysis, runall, and
//! calibration of float models.
