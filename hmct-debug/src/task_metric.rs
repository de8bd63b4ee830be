//! A task metric in the loop: searches that judge a configuration by the caller's
//! own evaluation of the model outputs (detection mAP, segmentation IoU, ...)
//! instead of a tensor metric against the float model. The seeds' YoloP case is why:
//! the cosine ranking there did not predict detection accuracy.
//!
//! The candidates and their order come from the sensitivity ranking, exactly as in
//! [`crate::mixed_precision`] (same promotion semantics: a node's activation input
//! calibration nodes get the new qtype); only the judgement changes. The caller's
//! evaluation sees the outputs of every sample of one configuration and is called
//! once per configuration the search needs, never for a configuration past the
//! answer.

use std::sync::Arc;

use hmct_quant::Base;
use hmct_tensor::Tensor;
use serde::Serialize;

use crate::engine::{Engine, EngineError, Probe};
use crate::json;
use crate::mixed_precision::{
    MixedPrecisionError, MixedPrecisionOptions, PromoteQType, Stage, Steps, prepare_steps,
};

/// The compared values of every sample: `outputs[sample][value]`.
pub type Outputs = Vec<Vec<Arc<Tensor>>>;

/// The caller's evaluation: a score for the outputs of one configuration, or an
/// error message (which stops the search).
pub type Evaluate<'a> = dyn FnMut(Outputs) -> Result<f64, String> + 'a;

/// Errors of the searches.
#[derive(Debug, thiserror::Error)]
pub enum TaskMetricError {
    #[error(transparent)]
    Search(#[from] MixedPrecisionError),
    #[error("the evaluation function failed: {0}")]
    Evaluate(String),
    #[error("target {0} is not a number")]
    BadTarget(f64),
}

impl From<EngineError> for TaskMetricError {
    fn from(e: EngineError) -> Self {
        TaskMetricError::Search(e.into())
    }
}

impl TaskMetricError {
    /// True for mistakes in the arguments.
    pub fn is_usage(&self) -> bool {
        match self {
            TaskMetricError::Search(e) => e.is_usage(),
            TaskMetricError::Evaluate(_) => false,
            TaskMetricError::BadTarget(_) => true,
        }
    }
}

/// The goal: the task score to reach and its direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Goal {
    pub target: f64,
    /// True for accuracies (reach at least `target`), false for errors (at most).
    pub higher_is_better: bool,
}

impl Goal {
    fn meets(&self, score: f64) -> bool {
        if self.higher_is_better {
            score >= self.target
        } else {
            score <= self.target
        }
    }

    /// Strictly better; NaN is worse than anything.
    fn better(&self, a: f64, b: f64) -> bool {
        if a.is_nan() {
            return false;
        }
        if b.is_nan() {
            return true;
        }
        if self.higher_is_better { a > b } else { a < b }
    }
}

/// One evaluated configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    /// The candidate tried at this evaluation (`None`: the calibrated model).
    pub node: Option<String>,
    /// The promoted nodes of the configuration evaluated, in rank order.
    pub promoted: Vec<String>,
    #[serde(serialize_with = "json::number")]
    pub score: f64,
    /// Greedy search: whether the candidate was kept (it improved the score).
    pub kept: bool,
}

/// The result of a search with a task metric.
#[derive(Clone, Debug, Serialize)]
pub struct TaskSearch {
    /// `prefix` (the first k ranked nodes) or `greedy` (each ranked node kept only
    /// when it improves the score).
    pub strategy: &'static str,
    #[serde(serialize_with = "json::number")]
    pub target: f64,
    pub higher_is_better: bool,
    pub qtype: PromoteQType,
    pub data_num: usize,
    /// The values given to the evaluation, in order.
    pub compared: Vec<String>,
    /// Ranked nodes with something to promote.
    pub candidates: usize,
    /// Every evaluation, in call order.
    pub evaluations: Vec<Evaluation>,
    pub reached: bool,
    /// The evaluation chosen: the first meeting the target, else the best.
    pub chosen: usize,
}

impl TaskSearch {
    /// The promoted nodes of the chosen configuration.
    pub fn promoted_nodes(&self) -> &[String] {
        &self.evaluations[self.chosen].promoted
    }

    /// The chosen configuration's score.
    pub fn score(&self) -> f64 {
        self.evaluations[self.chosen].score
    }

    /// The edit that turns the calibrated model into the chosen one.
    pub fn edit(&self) -> hmct_ir::Edit {
        hmct_ir::Edit::NodesQType {
            nodes: self.promoted_nodes().to_vec(),
            qtype: crate::mixed_precision::ir_qtype(self.qtype),
        }
    }
}

/// The compared values of every sample under `probe`.
pub fn probe_outputs(
    engine: &Engine,
    probe: &Probe,
    compared: &[hmct_quant::Slot],
    samples: usize,
) -> Result<Outputs, EngineError> {
    let results = engine.run_probes(
        std::slice::from_ref(probe),
        compared,
        samples,
        |view| {
            compared
                .iter()
                .map(|&slot| Ok(view.value(slot)?))
                .collect::<Result<Vec<_>, EngineError>>()
        },
        &|_, _| {},
    )?;
    Ok(results.values.into_iter().next().unwrap_or_default())
}

/// How a search walks the ranking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Promote the first k ranked nodes, k = 0, 1, 2, ...; stop at the first k that
    /// meets the target (the mixed-precision search with a task metric).
    Prefix,
    /// Walk the ranking once; keep a node promoted only when it improves the score;
    /// stop when the target is met ("int16 until the metric holds").
    Greedy,
}

/// Runs a search judged by `evaluate`. `options.target` and `options.metric` are not
/// used for the judgement (`options.metric` orders the ranking); `goal` is.
/// `progress` gets (stage, done, total); the search stage counts evaluations.
pub fn search(
    engine: &Engine,
    options: &MixedPrecisionOptions,
    goal: Goal,
    strategy: Strategy,
    evaluate: &mut Evaluate<'_>,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<TaskSearch, TaskMetricError> {
    if goal.target.is_nan() {
        return Err(TaskMetricError::BadTarget(goal.target));
    }
    let Steps {
        samples,
        compared,
        candidates,
        max_steps,
        step_overrides,
        own_overrides,
        ..
    } = prepare_steps(engine, options, progress)?;
    let mut score_of =
        |overrides: Vec<(usize, hmct_quant::Override)>| -> Result<f64, TaskMetricError> {
            let probe = Probe {
                base: Base::Calibrated,
                overrides,
            };
            let outputs = probe_outputs(engine, &probe, &compared, samples)?;
            evaluate(outputs).map_err(TaskMetricError::Evaluate)
        };
    let total = max_steps + 1;
    let mut evaluations: Vec<Evaluation> = Vec::new();
    let mut reached = None;
    let base = score_of(Vec::new())?;
    evaluations.push(Evaluation {
        node: None,
        promoted: Vec::new(),
        score: base,
        kept: true,
    });
    progress(Stage::Search, 1, total);
    if goal.meets(base) {
        reached = Some(0);
    }
    match strategy {
        Strategy::Prefix => {
            for k in 1..total {
                if reached.is_some() {
                    break;
                }
                let score = score_of(step_overrides[k].clone())?;
                evaluations.push(Evaluation {
                    node: Some(candidates[k - 1].name.clone()),
                    promoted: candidates[..k].iter().map(|c| c.name.clone()).collect(),
                    score,
                    kept: true,
                });
                progress(Stage::Search, k + 1, total);
                if goal.meets(score) {
                    reached = Some(k);
                }
            }
        }
        Strategy::Greedy => {
            let mut kept_overrides: Vec<(usize, hmct_quant::Override)> = Vec::new();
            let mut kept_nodes: Vec<String> = Vec::new();
            let mut best = base;
            for k in 1..total {
                if reached.is_some() {
                    break;
                }
                let mut trial = kept_overrides.clone();
                trial.extend_from_slice(&own_overrides[k - 1]);
                let score = score_of(trial.clone())?;
                let mut promoted = kept_nodes.clone();
                promoted.push(candidates[k - 1].name.clone());
                let kept = goal.better(score, best);
                if kept {
                    best = score;
                    kept_overrides = trial;
                    kept_nodes = promoted.clone();
                }
                evaluations.push(Evaluation {
                    node: Some(candidates[k - 1].name.clone()),
                    promoted,
                    score,
                    kept,
                });
                progress(Stage::Search, k + 1, total);
                if kept && goal.meets(score) {
                    reached = Some(evaluations.len() - 1);
                }
            }
        }
    }
    let chosen = match reached {
        Some(k) => k,
        None => (1..evaluations.len()).fold(0, |best, k| {
            let (a, b) = (&evaluations[k], &evaluations[best]);
            let fewer_or_kept = strategy == Strategy::Prefix || a.kept;
            if fewer_or_kept && goal.better(a.score, b.score) {
                k
            } else {
                best
            }
        }),
    };
    Ok(TaskSearch {
        strategy: match strategy {
            Strategy::Prefix => "prefix",
            Strategy::Greedy => "greedy",
        },
        target: goal.target,
        higher_is_better: goal.higher_is_better,
        qtype: options.qtype,
        data_num: samples,
        compared: compared
            .iter()
            .map(|&s| engine.value_name(s).to_string())
            .collect(),
        candidates: candidates.len(),
        evaluations,
        reached: reached.is_some(),
        chosen,
    })
}
