//! Which errors are mistakes in the arguments (an unknown name, a bad value: the
//! CLI's exit status 2) rather than failures while running or writing.

use std::error::Error;

use crate::acc_error::AccError;
use crate::calibrate::CalibrateError;
use crate::channelwise::ChannelwiseError;
use crate::distribution::DistributionError;
use crate::engine::EngineError;
use crate::mixed_precision::MixedPrecisionError;
use crate::runall::RunallError;
use crate::sensitivity::SensitivityError;
use crate::sensitivity_analysis::AnalysisError;
use crate::task_metric::TaskMetricError;

/// Walks `e` and its causes to the first error of this crate, which decides (each
/// knows which of its own causes are usage mistakes); `false` when there is none.
pub fn is_usage(e: &(dyn Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(usage) = own_verdict(c) {
            return usage;
        }
        cause = c.source();
    }
    false
}

fn own_verdict(e: &(dyn Error + 'static)) -> Option<bool> {
    macro_rules! first_of {
        ($($t:ty),*) => {
            $(if let Some(e) = e.downcast_ref::<$t>() {
                return Some(e.is_usage());
            })*
        };
    }
    first_of!(
        RunallError,
        TaskMetricError,
        MixedPrecisionError,
        AnalysisError,
        SensitivityError,
        AccError,
        DistributionError,
        ChannelwiseError,
        CalibrateError,
        EngineError
    );
    None
}
