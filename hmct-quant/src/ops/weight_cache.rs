//! What a kernel derives from a weight input (packed or transposed panels), kept per
//! weight tensor when that input is stable ([`NodeSpec::stable_inputs`]): a constant,
//! or a fake-quantized weight the session keeps, so a probe that switches a weight
//! calibration node packs each setting's weight once rather than once per run.

use std::sync::{Arc, Mutex};

use super::NodeSpec;

pub(crate) struct WeightCache<D> {
    stable: bool,
    /// Per weight tensor, by the address of its data; the most recently added last.
    entries: Mutex<Vec<(usize, Arc<D>)>>,
}

/// Weight tensors a kernel keeps derived data for: the float weight, its int8
/// fake-quantized form, and one more setting (int16, a threshold under test).
const CACHED_WEIGHTS: usize = 3;

impl<D: Default> WeightCache<D> {
    /// A cache for input `input` of the node.
    pub(crate) fn new(spec: &NodeSpec, input: usize) -> WeightCache<D> {
        WeightCache {
            stable: spec.stable_inputs.get(input).copied().unwrap_or(false),
            entries: Mutex::new(Vec::new()),
        }
    }

    /// The derived data of the weight whose data starts at `data` (made empty on
    /// first use), or `None` when the input is not stable.
    pub(crate) fn derived<T>(&self, data: *const T) -> Option<Arc<D>> {
        if !self.stable {
            return None;
        }
        let key = data as usize;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = entries.iter().find(|(k, _)| *k == key) {
            return Some(d.clone());
        }
        if entries.len() == CACHED_WEIGHTS {
            entries.remove(0);
        }
        let d = Arc::new(D::default());
        entries.push((key, d.clone()));
        Some(d)
    }
}
