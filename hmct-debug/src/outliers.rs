//! `outliers`: per activation calibration node, how unevenly the channels of its
//! input fill the per-tensor range (the "ratio of outliers in tensor" table of the
//! peer toolchain's guide, seeds/004).
//!
//! For one sample of the float model, with channels along `axis` (default 1, NCHW):
//! - `m_c` = max |x| over channel c, `M` = max_c m_c (the per-tensor max);
//! - a channel is **sparse** when it is all zeros (`m_c = 0`);
//! - the **level** of a non-sparse channel is `log2(M / m_c)`: at level ≥ k its
//!   values use at most 1/2^k of a per-tensor range, i.e. per-tensor quantization
//!   leaves it k bits fewer than per-channel quantization would (at level ≥ 3 an
//!   int8 channel gets at most 16 of the 127 positive steps);
//! - `sparse_ratio` = sparse channels / channels; `level>=k ratio` = non-sparse
//!   channels at level ≥ k / channels (k = 3..6; sparse channels lose nothing, zero
//!   is exact, so they never count there).
//!
//! Each ratio is computed per sample and averaged over the samples (NaN-free by
//! construction), the tool's aggregation. A tensor is **flagged** when its
//! `level>=3 ratio` is at least `flag_ratio` (default 0.5): most of its channels
//! waste most of the int8 range, a case for per-channel quantization, int16 or
//! smoothing the outlier channels.

use std::sync::Arc;

use hmct_ir::TensorType;
use hmct_metrics::nan_mean;
use hmct_quant::{Capture, Config, Slot};
use hmct_tensor::Tensor;
use rayon::prelude::*;
use serde::Serialize;

use crate::engine::{Engine, EngineError};
use crate::json;

/// The levels reported, as in the peer table.
pub const LEVELS: [u32; 4] = [3, 4, 5, 6];

/// The arguments of [`outliers`].
#[derive(Clone, Debug)]
pub struct OutliersOptions {
    /// Use the first `data_num` samples (all when `None`); one by default, as for
    /// the distribution plots.
    pub data_num: Option<usize>,
    /// The channel axis (negative counts from the end).
    pub axis: i64,
    /// Flag tensors whose `level>=3 ratio` is at least this.
    pub flag_ratio: f64,
}

impl Default for OutliersOptions {
    fn default() -> Self {
        OutliersOptions {
            data_num: Some(1),
            axis: 1,
            flag_ratio: 0.5,
        }
    }
}

/// One activation calibration node.
#[derive(Clone, Debug, Serialize)]
pub struct OutlierRow {
    /// The calibration node.
    pub name: String,
    /// The regular nodes it quantizes (`;`-joined).
    pub node: String,
    /// The tensor measured (the calibration node's input).
    pub tensor: String,
    pub channels: usize,
    /// The largest |x| over the samples.
    #[serde(serialize_with = "json::number")]
    pub max_abs: f64,
    #[serde(serialize_with = "json::number")]
    pub sparse_ratio: f64,
    /// Ratios for [`LEVELS`], in that order.
    pub level_ratios: Vec<LevelRatio>,
    pub flagged: bool,
}

/// The share of channels at or above a level.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LevelRatio {
    pub level: u32,
    #[serde(serialize_with = "json::number")]
    pub ratio: f64,
}

/// An activation whose input could not be measured (e.g. too few dimensions for the
/// axis).
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

/// The result, in graph order of the calibration nodes.
#[derive(Clone, Debug, Serialize)]
pub struct Outliers {
    pub data_num: usize,
    pub axis: i64,
    #[serde(serialize_with = "json::number")]
    pub flag_ratio: f64,
    pub rows: Vec<OutlierRow>,
    pub skipped: Vec<Skipped>,
}

/// Per-sample figures of one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelStats {
    pub channels: usize,
    pub max_abs: f64,
    pub sparse_ratio: f64,
    /// For [`LEVELS`].
    pub level_ratios: [f64; 4],
}

/// The figures of one tensor with channels along `axis`; `Err` says why it cannot
/// be measured.
pub fn channel_stats(t: &Tensor, axis: i64) -> Result<ChannelStats, String> {
    let shape = t.shape().to_vec();
    let rank = shape.len() as i64;
    let resolved = if axis < 0 { axis + rank } else { axis };
    if resolved < 0 || resolved >= rank {
        return Err(format!(
            "axis {axis} is out of range for a tensor of shape {shape:?}"
        ));
    }
    let axis = resolved as usize;
    let channels = shape[axis];
    if channels == 0 {
        return Err(format!("the tensor of shape {shape:?} has no channels"));
    }
    let inner: usize = shape[axis + 1..].iter().product();
    let mut maxima = vec![0f32; channels];
    let mut add = |values: &[f32]| {
        for (block, chunk) in values.chunks(inner.max(1)).enumerate() {
            let c = block % channels;
            let m = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            maxima[c] = maxima[c].max(m);
        }
    };
    // Activations are f32 in standard layout: read them in place (they can be
    // hundreds of MB per sample).
    match t.as_f32() {
        Some(a) => match a.as_slice() {
            Some(s) => add(s),
            None => add(&a.iter().copied().collect::<Vec<f32>>()),
        },
        None => add(&t
            .to_f64_vec()
            .ok_or_else(|| format!("{} is not numeric", t.dtype()))?
            .into_iter()
            .map(|v| v as f32)
            .collect::<Vec<f32>>()),
    }
    let max = maxima.iter().copied().fold(0f32, f32::max);
    let n = channels as f64;
    let sparse = maxima.iter().filter(|&&m| m == 0.0).count();
    let mut level_ratios = [0.0; 4];
    for (r, level) in level_ratios.iter_mut().zip(LEVELS) {
        // level ≥ k  ⟺  M / m_c ≥ 2^k, compared without the log.
        let factor = f64::from(1u32 << level);
        let count = maxima
            .iter()
            .filter(|&&m| m > 0.0 && f64::from(max) >= factor * f64::from(m))
            .count();
        *r = count as f64 / n;
    }
    Ok(ChannelStats {
        channels,
        max_abs: f64::from(max),
        sparse_ratio: sparse as f64 / n,
        level_ratios,
    })
}

/// Computes the table. `progress` gets (samples done, samples).
pub fn outliers(
    engine: &Engine,
    options: &OutliersOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Outliers, EngineError> {
    let samples = engine.sample_count(options.data_num)?;
    let model = engine.model();
    let activations: Vec<usize> = engine
        .plan()
        .calibrations()
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            model
                .calibration(c.graph_index)
                .is_some_and(|cal| cal.tensor_type() == TensorType::Feature)
        })
        .map(|(i, _)| i)
        .collect();
    let slots: Vec<Slot> = activations
        .iter()
        .map(|&c| engine.plan().calibrations()[c].input)
        .collect();
    // per_sample[s][activation]
    let mut per_sample: Vec<Vec<Result<ChannelStats, String>>> = Vec::with_capacity(samples);
    for s in 0..samples {
        // A run that keeps only the measured tensors and stays out of the engine's
        // cache: each sample is used once.
        let inputs = engine.sample_inputs(s)?;
        let refs: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = engine.session().bind_inputs(&refs)?;
        let values =
            engine
                .session()
                .run_from(&bound, None, &Config::float(), &slots, Capture::Wanted)?;
        let stats = engine.session().install(|| {
            activations
                .par_iter()
                .map(|&c| {
                    let slot = engine.plan().calibrations()[c].input;
                    let t: Arc<Tensor> = engine.session().value(&values, slot)?;
                    Ok(channel_stats(&t, options.axis))
                })
                .collect::<Result<Vec<_>, EngineError>>()
        })?;
        per_sample.push(stats);
        progress(s + 1, samples);
    }

    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for (a, &c) in activations.iter().enumerate() {
        let cal = &engine.plan().calibrations()[c];
        let stats: Result<Vec<&ChannelStats>, &String> =
            per_sample.iter().map(|s| s[a].as_ref()).collect();
        let stats = match stats {
            Ok(stats) => stats,
            Err(reason) => {
                skipped.push(Skipped {
                    name: cal.name.clone(),
                    reason: reason.clone(),
                });
                continue;
            }
        };
        let mean = |f: &dyn Fn(&ChannelStats) -> f64| {
            nan_mean(&stats.iter().map(|s| f(s)).collect::<Vec<_>>())
        };
        let level_ratios: Vec<LevelRatio> = LEVELS
            .iter()
            .enumerate()
            .map(|(i, &level)| LevelRatio {
                level,
                ratio: mean(&|s| s.level_ratios[i]),
            })
            .collect();
        let flagged = level_ratios[0].ratio >= options.flag_ratio;
        rows.push(OutlierRow {
            name: cal.name.clone(),
            node: hmct_ir::consumer_label(model, cal.graph_index),
            tensor: engine.value_name(cal.input).to_string(),
            channels: stats.first().map_or(0, |s| s.channels),
            max_abs: stats.iter().map(|s| s.max_abs).fold(0.0, f64::max),
            sparse_ratio: mean(&|s| s.sparse_ratio),
            level_ratios,
            flagged,
        });
    }
    Ok(Outliers {
        data_num: samples,
        axis: options.axis,
        flag_ratio: options.flag_ratio,
        rows,
        skipped,
    })
}

impl Outliers {
    /// The printed table: ratios with 4 decimals, `*` on flagged tensors.
    pub fn table(&self) -> hmct_metrics::Table {
        let mut header = vec![
            "activation".to_string(),
            "node".to_string(),
            "channels".to_string(),
            "sparse channel ratio".to_string(),
        ];
        header.extend(LEVELS.iter().map(|l| format!("level>={l} ratio")));
        header.push("flag".to_string());
        let mut table = hmct_metrics::Table::new(
            "ratio of outliers in tensor (level = log2(max_per_tensor / max_per_channel))",
            header,
        );
        for r in &self.rows {
            let mut cells = vec![
                r.name.clone(),
                r.node.clone(),
                r.channels.to_string(),
                format!("{:.4}", r.sparse_ratio),
            ];
            cells.extend(r.level_ratios.iter().map(|l| format!("{:.4}", l.ratio)));
            cells.push(if r.flagged { "*" } else { "" }.to_string());
            table.push_row(cells).expect("one cell per column");
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_channel_maxima() {
        // 1x4x2 (axis 1): channel maxima 8, 1, 0.5, 0 → levels 0, 3, 4, sparse.
        let data = vec![8.0, -2.0, 1.0, -0.5, 0.5, 0.25, 0.0, 0.0];
        let t = Tensor::from_f32(&[1, 4, 2], data).unwrap();
        let s = channel_stats(&t, 1).unwrap();
        assert_eq!(s.channels, 4);
        assert_eq!(s.max_abs, 8.0);
        assert_eq!(s.sparse_ratio, 0.25);
        assert_eq!(s.level_ratios, [0.5, 0.25, 0.0, 0.0]);
        // The last axis: channels of [8,1,.5,0] and [-2,-.5,.25,0] maxima 8, 2.
        let s = channel_stats(&t, -1).unwrap();
        assert_eq!(s.channels, 2);
        assert_eq!(s.level_ratios, [0.0; 4]);
        assert!(channel_stats(&t, 3).is_err());
    }
}
