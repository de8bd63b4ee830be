//! The `info` comparison: the calibrated model against the float model (every
//! calibration node OFF) on one sample or on each sample of a data folder, with the
//! `info` table's own figures (DEBUGGER.md §1, [`InfoFigures`]) per model output and,
//! optionally, per output of every quantized regular node.

use std::path::Path;
use std::sync::Arc;

use hmct_ir::{IrError, Model, quantized_nodes};
use hmct_metrics::{InfoFigures, MetricError, nan_mean};
use hmct_quant::{Capture, Config, PlanError, RunError, Session, Slot, plan_model};
use hmct_tensor::{Dataset, Tensor, TensorError};
use serde::Serialize;

use crate::calibrate::input_specs;

/// Why the comparison failed.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error("{file}")]
    Plan {
        file: String,
        #[source]
        source: PlanError,
    },
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Data(#[from] TensorError),
    #[error("tensor '{tensor}'")]
    Metric {
        tensor: String,
        #[source]
        source: MetricError,
    },
    #[error("{0}")]
    InvalidOption(String),
}

/// What to compare.
#[derive(Clone, Debug, Default)]
pub struct InfoOptions {
    /// Also compare the outputs of every quantized regular node.
    pub per_node: bool,
    /// Use only the first N samples of a data folder.
    pub data_num: Option<usize>,
    /// Interpreter threads (0 = all cores).
    pub threads: usize,
}

/// The `info` figures of one tensor (cosine, L1, L2, Chebyshev as in [`InfoFigures`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figures {
    pub cosine: f64,
    pub l1: f64,
    pub l2: f64,
    pub chebyshev: f64,
}

impl From<InfoFigures> for Figures {
    fn from(f: InfoFigures) -> Self {
        Figures {
            cosine: f.cosine,
            l1: f.l1,
            l2: f.l2,
            chebyshev: f.chebyshev,
        }
    }
}

impl From<Figures> for InfoFigures {
    fn from(f: Figures) -> Self {
        InfoFigures {
            cosine: f.cosine,
            l1: f.l1,
            l2: f.l2,
            chebyshev: f.chebyshev,
        }
    }
}

/// One compared tensor: a model output (`node` empty) or a quantized node's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorInfo {
    /// The regular node producing it (empty for the model outputs table).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node: String,
    pub tensor: String,
    pub figures: Figures,
}

/// The comparison on one sample.
#[derive(Clone, Debug, Serialize)]
pub struct SampleInfo {
    /// The sample's file(s), or its index.
    pub sample: String,
    pub outputs: Vec<TensorInfo>,
    /// Empty unless `per_node`.
    pub nodes: Vec<TensorInfo>,
}

/// The comparison on every sample, and the mean over samples of each figure (NaN
/// samples skipped).
#[derive(Clone, Debug, Serialize)]
pub struct InfoReport {
    pub samples: Vec<SampleInfo>,
    pub mean_outputs: Vec<TensorInfo>,
    pub mean_nodes: Vec<TensorInfo>,
}

/// A planned model with the tensors to compare.
pub struct InfoRunner {
    session: Session,
    /// (node name or "", tensor, slot): model outputs.
    outputs: Vec<(String, String, Slot)>,
    /// The same for quantized regular nodes' outputs (empty unless per-node).
    nodes: Vec<(String, String, Slot)>,
    data_num: Option<usize>,
}

impl InfoRunner {
    /// Plans `model` and lists what to compare.
    pub fn new(model: &Model, options: &InfoOptions) -> Result<InfoRunner, InfoError> {
        if options.data_num == Some(0) {
            return Err(InfoError::InvalidOption(
                "data_num must be at least 1".into(),
            ));
        }
        let plan = plan_model(model).map_err(|source| InfoError::Plan {
            file: model.file().to_string(),
            source,
        })?;
        let session = Session::new(plan, options.threads)?;
        let plan = session.plan();
        let outputs = plan
            .output_names()
            .iter()
            .zip(plan.outputs())
            .map(|(n, &s)| (String::new(), n.to_string(), s))
            .collect();
        let mut nodes = Vec::new();
        if options.per_node {
            for id in quantized_nodes(model) {
                let node = model.node(id);
                for out in node.output.iter().filter(|o| !o.is_empty()) {
                    if let Some(slot) = plan.value(out) {
                        nodes.push((node.name().to_string(), out.clone(), slot));
                    }
                }
            }
        }
        Ok(InfoRunner {
            session,
            outputs,
            nodes,
            data_num: options.data_num,
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Compares the two models on one sample (`(input name, tensor)` per input).
    pub fn compare(
        &self,
        label: &str,
        inputs: Vec<(String, Tensor)>,
    ) -> Result<SampleInfo, InfoError> {
        let (names, tensors): (Vec<String>, Vec<Tensor>) = inputs.into_iter().unzip();
        let refs: Vec<(&str, Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
        let bound = self.session.bind_inputs(&refs)?;
        let wanted: Vec<Slot> = self
            .outputs
            .iter()
            .chain(&self.nodes)
            .map(|&(_, _, s)| s)
            .collect();
        let run = |config: &Config| {
            self.session
                .run_from(&bound, None, config, &wanted, Capture::Wanted)
        };
        let float = run(&Config::float())?;
        let calibrated = run(&Config::calibrated())?;
        let compare_all = |list: &[(String, String, Slot)]| -> Result<Vec<TensorInfo>, InfoError> {
            list.iter()
                .map(|(node, tensor, slot)| {
                    let x = self.session.value(&float, *slot)?;
                    let y = self.session.value(&calibrated, *slot)?;
                    Ok(TensorInfo {
                        node: node.clone(),
                        tensor: tensor.clone(),
                        figures: figures(tensor, &x, &y)?,
                    })
                })
                .collect()
        };
        Ok(SampleInfo {
            sample: label.to_string(),
            outputs: compare_all(&self.outputs)?,
            nodes: compare_all(&self.nodes)?,
        })
    }

    /// Compares on each sample of a calibration-data folder (the first `data_num`).
    /// `progress(done, total)` after each sample.
    pub fn compare_dir(
        &self,
        dir: &Path,
        progress: &dyn Fn(usize, usize),
    ) -> Result<InfoReport, InfoError> {
        let data = Dataset::open(dir, &input_specs(&self.session))?;
        let n = self.data_num.map_or(data.len(), |k| k.min(data.len()));
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            samples.push(self.compare(&data.sample_label(i), data.sample(i)?)?);
            progress(i + 1, n);
        }
        Ok(report(samples))
    }
}

/// Gathers samples into a report with the per-figure means.
pub fn report(samples: Vec<SampleInfo>) -> InfoReport {
    let mean = |pick: fn(&SampleInfo) -> &Vec<TensorInfo>| -> Vec<TensorInfo> {
        let Some(first) = samples.first() else {
            return Vec::new();
        };
        (0..pick(first).len())
            .map(|k| {
                let col = |f: fn(&Figures) -> f64| {
                    let v: Vec<f64> = samples.iter().map(|s| f(&pick(s)[k].figures)).collect();
                    nan_mean(&v)
                };
                TensorInfo {
                    figures: Figures {
                        cosine: col(|f| f.cosine),
                        l1: col(|f| f.l1),
                        l2: col(|f| f.l2),
                        chebyshev: col(|f| f.chebyshev),
                    },
                    ..pick(first)[k].clone()
                }
            })
            .collect()
    };
    let mean_outputs = mean(|s| &s.outputs);
    let mean_nodes = mean(|s| &s.nodes);
    InfoReport {
        samples,
        mean_outputs,
        mean_nodes,
    }
}

/// The figures of a float tensor `x` against a quantized `y`. Non-float numeric
/// tensors are compared as float32 values; other types give NaN figures.
fn figures(tensor: &str, x: &Arc<Tensor>, y: &Arc<Tensor>) -> Result<Figures, InfoError> {
    let values = |t: &Tensor| -> Option<Vec<f32>> {
        match t.as_f32() {
            Some(a) => Some(a.iter().copied().collect()),
            None => t
                .to_f64_vec()
                .map(|v| v.into_iter().map(|e| e as f32).collect()),
        }
    };
    let (Some(a), Some(b)) = (values(x), values(y)) else {
        return Ok(Figures {
            cosine: f64::NAN,
            l1: f64::NAN,
            l2: f64::NAN,
            chebyshev: f64::NAN,
        });
    };
    InfoFigures::compute(&a, &b)
        .map(Figures::from)
        .map_err(|source| InfoError::Metric {
            tensor: tensor.to_string(),
            source,
        })
}
