//! `_native.Analyzer`: an engine (model + calibration data + cached activations) and
//! one method per analysis. Each method takes the analysis' options already
//! normalized by `hmct_rs.debug`, runs the library function interruptibly and returns
//! the CLI's `--json` text of the result (plus the verbose table and the files
//! written where the CLI prints them), so both front ends give the same answers.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hmct_debug::acc_error::{AccErrorOptions, NodeList, plot_acc_error, write_acc_error};
use hmct_debug::channelwise::{
    ChannelwiseOptions, get_channelwise_data_distribution, write_channelwise,
};
use hmct_debug::distribution::{DistributionOptions, plot_distribution, write_distribution};
use hmct_debug::engine::{Engine, EngineOptions};
use hmct_debug::mixed_precision::{
    MixedPrecisionOptions, PromoteQType, mixed_precision, write_mixed_precision,
};
use hmct_debug::outliers::{OutliersOptions, outliers};
use hmct_debug::precision_table::{PrecisionTableOptions, precision_table};
use hmct_debug::runall::{RunallOptions, runall};
use hmct_debug::sensitivity::{
    NodeType, SensitivityOptions, get_sensitivity_of_nodes, parse_metrics,
};
use hmct_debug::sensitivity_analysis::{
    DequantQType, SensitivityAnalysisOptions, sensitivity_analysis, write_partial_quantization,
};
use hmct_debug::shard::Shard;
use hmct_debug::task_metric::{Goal, Strategy, TaskMetricError};
use hmct_metrics::Metric;
use hmct_plot::Format;
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde::Serialize;

use crate::data::{DataSource, to_numpy};
use crate::errors::{py_err, to_py, value_error};
use crate::interrupt::{self, Progress};
use crate::model::PyModel;

/// The two error types of `info`.
enum PyErrSource {
    Info(hmct_debug::info::InfoError),
    Engine(hmct_debug::engine::EngineError),
}

#[pyclass(module = "hmct_rs._native")]
pub(crate) struct Analyzer {
    engine: Engine,
    cancel: Arc<AtomicBool>,
}

fn json<T: Serialize>(value: &T) -> PyResult<String> {
    serde_json::to_string(value)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

fn metrics(names: &[String]) -> PyResult<Vec<Metric>> {
    parse_metrics(names).map_err(|e| py_err!(e))
}

fn metric(name: &str) -> PyResult<Metric> {
    Ok(metrics(&[name.to_string()])?[0])
}

fn format(name: &str) -> PyResult<Format> {
    match name.trim().to_ascii_lowercase().as_str() {
        "png" => Ok(Format::Png),
        "svg" => Ok(Format::Svg),
        _ => Err(value_error(format!("format: '{name}' is not png or svg"))),
    }
}

fn data_num(n: Option<usize>) -> PyResult<Option<usize>> {
    if n == Some(0) {
        return Err(value_error("data_num must be at least 1"));
    }
    Ok(n)
}

/// `shard="I/N"` (1-based), as `--shard` takes it.
fn shard(text: Option<&str>) -> PyResult<Option<Shard>> {
    text.map(|t| t.parse::<Shard>().map_err(|e| value_error(e.to_string())))
        .transpose()
}

/// `quantize_node` / `non_quantize_node` as normalized by Python: (nested?, groups).
fn node_list(list: Option<(bool, Vec<Vec<String>>)>) -> Option<NodeList> {
    list.map(|(nested, groups)| {
        if nested {
            NodeList::Nested(groups)
        } else {
            NodeList::Flat(groups.into_iter().flatten().collect())
        }
    })
}

fn paths(written: Vec<PathBuf>) -> Vec<String> {
    written
        .into_iter()
        .map(|p| p.display().to_string())
        .collect()
}

fn promote_qtype(name: &str) -> PyResult<PromoteQType> {
    name.parse::<DequantQType>().map_err(|e| py_err!(e))
}

impl Analyzer {
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        progress: Option<&Bound<'_, PyAny>>,
        work: impl FnOnce(&Engine, &Progress) -> T + Send,
    ) -> PyResult<T> {
        interrupt::run(py, &self.cancel, progress, |p| work(&self.engine, p))
    }

    /// Runs an analysis that writes files: (result JSON, files written).
    fn run_and_write<R: Serialize + Send, E: std::error::Error + Send + 'static>(
        &self,
        py: Python<'_>,
        progress: Option<&Bound<'_, PyAny>>,
        work: impl FnOnce(&Engine, &Progress) -> Result<(R, Vec<PathBuf>), E> + Send,
    ) -> PyResult<(String, Vec<String>)> {
        let (result, written) = self
            .run(py, progress, work)?
            .map_err(|e| to_py(&e, hmct_debug::usage::is_usage(&e)))?;
        Ok((json(&result)?, paths(written)))
    }
}

#[pymethods]
impl Analyzer {
    /// Plans `model` and opens `data` (a folder, or a dict input name -> list of
    /// numpy arrays) against its inputs.
    #[new]
    #[pyo3(signature = (model, data, threads=0, cache_mb=None))]
    fn new(
        py: Python<'_>,
        model: &PyModel,
        data: &Bound<'_, PyAny>,
        threads: usize,
        cache_mb: Option<usize>,
    ) -> PyResult<Analyzer> {
        let model = model.model.clone();
        let plan = py
            .detach(|| hmct_quant::plan_model(&model))
            .map_err(|e| to_py(&e, false))?;
        let specs = plan.input_specs();
        let dataset = DataSource::from_py(data, &specs)?.dataset(&specs)?;
        let options = EngineOptions {
            threads,
            cache_bytes: Some(
                cache_mb
                    .unwrap_or_else(EngineOptions::default_cache_mb)
                    .saturating_mul(1 << 20),
            ),
        };
        let mut engine = py
            .detach(|| Engine::with_dataset(model, plan, dataset, &options))
            .map_err(|e| py_err!(e))?;
        let cancel = Arc::new(AtomicBool::new(false));
        engine.set_cancel_flag(cancel.clone());
        Ok(Analyzer { engine, cancel })
    }

    /// Samples in the data.
    #[getter]
    fn samples(&self) -> usize {
        self.engine.available_samples()
    }

    /// Node sensitivity: (result JSON, verbose table).
    #[pyo3(signature = (metrics_names, node_type, output_nodes, data_num_, interested_nodes, exclude_samples=Vec::new(), shard_=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn sensitivity(
        &self,
        py: Python<'_>,
        metrics_names: Vec<String>,
        node_type: &str,
        output_nodes: Vec<String>,
        data_num_: Option<usize>,
        interested_nodes: Option<Vec<Vec<String>>>,
        exclude_samples: Vec<usize>,
        shard_: Option<&str>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, String)> {
        if interested_nodes.as_ref().is_some_and(Vec::is_empty) {
            return Err(value_error("interested_nodes: the list is empty"));
        }
        let options = SensitivityOptions {
            node_type: node_type.parse::<NodeType>().map_err(|e| py_err!(e))?,
            metrics: metrics(&metrics_names)?,
            output_nodes,
            data_num: data_num(data_num_)?,
            interested_nodes,
            exclude_samples,
            shard: shard(shard_)?,
        };
        let result = self.run(py, progress, |engine, p| {
            get_sensitivity_of_nodes(engine, &options, &|d, t| p.set("sensitivity", d, t))
        })?;
        let result = result.map_err(|e| py_err!(e))?;
        Ok((json(&result)?, result.table().render()))
    }

    /// Accumulated-error curves: (result JSON, files written).
    #[pyo3(signature = (quantize_node, non_quantize_node, metric_name, average_mode, data_num_, save_dir, fmt, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn acc_error(
        &self,
        py: Python<'_>,
        quantize_node: Option<(bool, Vec<Vec<String>>)>,
        non_quantize_node: Option<(bool, Vec<Vec<String>>)>,
        metric_name: &str,
        average_mode: bool,
        data_num_: Option<usize>,
        save_dir: PathBuf,
        fmt: &str,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, Vec<String>)> {
        if quantize_node.is_none() && non_quantize_node.is_none() {
            return Err(value_error(
                "give quantize_node or non_quantize_node (or both)",
            ));
        }
        let options = AccErrorOptions {
            quantize_node: node_list(quantize_node),
            non_quantize_node: node_list(non_quantize_node),
            metric: metric(metric_name)?,
            average_mode,
            data_num: data_num(data_num_)?,
        };
        let format = format(fmt)?;
        self.run_and_write(
            py,
            progress,
            |engine, p| -> Result<_, hmct_debug::acc_error::AccError> {
                let result =
                    plot_acc_error(engine, &options, &|d, t| p.set("accumulated error", d, t))?;
                let written = write_acc_error(&result, &save_dir, format)?;
                Ok((result, written))
            },
        )
    }

    /// Distribution histograms: (result JSON, files written).
    #[pyo3(signature = (nodes, bins, save_dir, fmt))]
    fn distribution(
        &self,
        py: Python<'_>,
        nodes: Vec<String>,
        bins: usize,
        save_dir: PathBuf,
        fmt: &str,
    ) -> PyResult<(String, Vec<String>)> {
        if nodes.is_empty() {
            return Err(value_error("nodes_list is empty"));
        }
        if bins == 0 {
            return Err(value_error("bins must be at least 1"));
        }
        let options = DistributionOptions {
            nodes,
            bins,
            ..DistributionOptions::default()
        };
        let format = format(fmt)?;
        self.run_and_write(
            py,
            None,
            |engine, _| -> Result<_, hmct_debug::distribution::DistributionError> {
                let result = plot_distribution(engine, &options)?;
                let written = write_distribution(&result, &save_dir, format)?;
                Ok((result, written))
            },
        )
    }

    /// Per-channel box plots: (result JSON, files written).
    #[pyo3(signature = (nodes, axis, save_dir, fmt))]
    fn channelwise(
        &self,
        py: Python<'_>,
        nodes: Vec<String>,
        axis: Option<i64>,
        save_dir: PathBuf,
        fmt: &str,
    ) -> PyResult<(String, Vec<String>)> {
        if nodes.is_empty() {
            return Err(value_error("nodes_list is empty"));
        }
        let options = ChannelwiseOptions {
            nodes,
            axis,
            ..ChannelwiseOptions::default()
        };
        let format = format(fmt)?;
        self.run_and_write(
            py,
            None,
            |engine, _| -> Result<_, hmct_debug::channelwise::ChannelwiseError> {
                let result = get_channelwise_data_distribution(engine, &options)?;
                let written = write_channelwise(&result, &save_dir, format)?;
                Ok((result, written))
            },
        )
    }

    /// Sensitivity analysis: (result JSON, files written).
    #[pyo3(signature = (pick_threshold, data_num_, sensitive_nodes, metric_name, qtype, save_dir, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn sensitivity_analysis(
        &self,
        py: Python<'_>,
        pick_threshold: f64,
        data_num_: Option<usize>,
        sensitive_nodes: Vec<String>,
        metric_name: &str,
        qtype: &str,
        save_dir: PathBuf,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, Vec<String>)> {
        let options = SensitivityAnalysisOptions {
            pick_threshold,
            data_num: data_num(data_num_)?,
            sensitive_nodes,
            metric: metric(metric_name)?,
            qtype: qtype.parse::<DequantQType>().map_err(|e| py_err!(e))?,
        };
        self.run_and_write(
            py,
            progress,
            |engine, p| -> Result<_, hmct_debug::sensitivity_analysis::AnalysisError> {
                let result = sensitivity_analysis(engine, &options, &|stage, d, t| {
                    p.set(&format!("{stage:?}").to_lowercase(), d, t)
                })?;
                let written = write_partial_quantization(&result, &save_dir)?;
                Ok((result, written))
            },
        )
    }

    /// The whole workflow into `save_dir`: (summary JSON, verbose tables).
    #[pyo3(signature = (options, save_dir, progress=None))]
    fn runall(
        &self,
        py: Python<'_>,
        options: &Bound<'_, pyo3::types::PyDict>,
        save_dir: PathBuf,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, Vec<String>)> {
        let get = |key: &str| options.get_item(key).map(|v| v.filter(|v| !v.is_none()));
        macro_rules! opt {
            ($key:expr) => {
                match get($key)? {
                    Some(v) => Some(v.extract()?),
                    None => None,
                }
            };
        }
        let node_type: Option<String> = opt!("node_type");
        let ns_metrics: Vec<String> =
            opt!("ns_metrics").unwrap_or_else(|| vec!["cosine-similarity".into()]);
        let ae_metric: String = opt!("ae_metric").unwrap_or_else(|| "cosine-similarity".into());
        let fmt: String = opt!("format").unwrap_or_else(|| "png".into());
        let interested: Option<Vec<Vec<String>>> = opt!("interested_nodes");
        let options = RunallOptions {
            ns_metrics: metrics(&ns_metrics)?,
            output_nodes: opt!("output_node").unwrap_or_default(),
            node_type: node_type
                .map(|t| t.parse::<NodeType>().map_err(|e| py_err!(e)))
                .transpose()?,
            data_num: data_num(opt!("data_num"))?,
            interested_nodes: interested,
            dis_nodes_list: opt!("dis_nodes_list"),
            cw_nodes_list: opt!("cw_nodes_list"),
            axis: opt!("axis"),
            quantize_node: node_list(opt!("quantize_node")),
            non_quantize_node: node_list(opt!("non_quantize_node")),
            ae_metric: metric(&ae_metric)?,
            average_mode: opt!("average_mode").unwrap_or(false),
            pick_threshold: opt!("pick_threshold").unwrap_or(0.999),
            sensitive_nodes: opt!("sensitive_nodes").unwrap_or_default(),
            format: format(&fmt)?,
            report: opt!("report").unwrap_or(true),
        };
        let summary = self.run(py, progress, |engine, p| {
            runall(engine, &options, &save_dir, None, &|step, d, t| {
                p.set(step, d, t)
            })
        })?;
        let summary = summary.map_err(|e| py_err!(e))?;
        let tables = summary
            .rankings
            .iter()
            .map(|r| r.table().render())
            .collect();
        Ok((json(&summary)?, tables))
    }

    /// Per-node end-to-end vs per-layer error: (result JSON, table).
    #[pyo3(signature = (data_num_, shard_=None, progress=None))]
    fn precision_table(
        &self,
        py: Python<'_>,
        data_num_: Option<usize>,
        shard_: Option<&str>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, String)> {
        let options = PrecisionTableOptions {
            data_num: data_num(data_num_)?,
            shard: shard(shard_)?,
        };
        let result = self.run(py, progress, |engine, p| {
            precision_table(engine, &options, &|d, t| p.set("precision table", d, t))
        })?;
        let result = result.map_err(|e| py_err!(e))?;
        Ok((json(&result)?, result.table().render()))
    }

    /// Outlier channels per activation: (result JSON, table).
    #[pyo3(signature = (data_num_, axis, flag_ratio, progress=None))]
    fn outliers(
        &self,
        py: Python<'_>,
        data_num_: Option<usize>,
        axis: i64,
        flag_ratio: f64,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, String)> {
        let options = OutliersOptions {
            data_num: data_num(data_num_)?,
            axis,
            flag_ratio,
        };
        let result = self.run(py, progress, |engine, p| {
            outliers(engine, &options, &|d, t| p.set("outliers", d, t))
        })?;
        let result = result.map_err(|e| py_err!(e))?;
        Ok((json(&result)?, result.table().render()))
    }

    /// Calibrated vs float outputs (cosine, L1, L2, Chebyshev) per sample and their
    /// means: the result JSON.
    #[pyo3(signature = (per_node, data_num_, progress=None))]
    fn info(
        &self,
        py: Python<'_>,
        per_node: bool,
        data_num_: Option<usize>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        use hmct_debug::info::{InfoError, InfoOptions, InfoRunner, report};
        let options = InfoOptions {
            per_node,
            data_num: data_num(data_num_)?,
            threads: self.engine.threads(),
        };
        // Engine errors (the data, a cancel) and the comparison's own errors.
        let out = self.run(py, progress, |engine, p| -> Result<_, PyErrSource> {
            let info = |e: InfoError| PyErrSource::Info(e);
            let runner = InfoRunner::new(engine.model(), &options).map_err(info)?;
            let n = options.data_num.map_or(engine.available_samples(), |k| {
                k.min(engine.available_samples())
            });
            let mut samples = Vec::with_capacity(n);
            for i in 0..n {
                if self.cancel.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(PyErrSource::Engine(
                        hmct_debug::engine::EngineError::Cancelled,
                    ));
                }
                let inputs = engine.sample_inputs(i).map_err(PyErrSource::Engine)?;
                samples.push(
                    runner
                        .compare(&engine.sample_label(i), inputs)
                        .map_err(info)?,
                );
                p.set("info", i + 1, n);
            }
            Ok(report(samples))
        })?;
        let result = out.map_err(|e| match e {
            PyErrSource::Info(e) => to_py(&e, false),
            PyErrSource::Engine(e) => py_err!(e),
        })?;
        json(&result)
    }

    /// Mixed-precision search on a tensor metric: (result JSON, files written; none
    /// without `save_dir`).
    #[pyo3(signature = (target, metric_name, output_nodes, qtype, budget, data_num_, save_dir, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn mixed_precision(
        &self,
        py: Python<'_>,
        target: f64,
        metric_name: &str,
        output_nodes: Vec<String>,
        qtype: &str,
        budget: Option<usize>,
        data_num_: Option<usize>,
        save_dir: Option<PathBuf>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(String, Vec<String>)> {
        let options = MixedPrecisionOptions {
            target,
            metric: metric(metric_name)?,
            output_nodes,
            qtype: promote_qtype(qtype)?,
            budget,
            data_num: data_num(data_num_)?,
            ..MixedPrecisionOptions::default()
        };
        self.run_and_write(
            py,
            progress,
            |engine, p| -> Result<_, hmct_debug::mixed_precision::MixedPrecisionError> {
                let result = mixed_precision(engine, &options, &|stage, d, t| {
                    p.set(&format!("{stage:?}").to_lowercase(), d, t)
                })?;
                let written = match &save_dir {
                    Some(dir) => write_mixed_precision(engine.model(), &result, dir)?,
                    None => Vec::new(),
                };
                Ok((result, written))
            },
        )
    }

    /// A search judged by `eval_fn(outputs_per_sample) -> float`: `strategy` is
    /// `prefix` or `greedy`. Returns the result JSON.
    #[pyo3(signature = (strategy, eval_fn, target, higher_is_better, metric_name, output_nodes, qtype, budget, data_num_, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn task_search(
        &self,
        py: Python<'_>,
        strategy: &str,
        eval_fn: Py<PyAny>,
        target: f64,
        higher_is_better: bool,
        metric_name: &str,
        output_nodes: Vec<String>,
        qtype: &str,
        budget: Option<usize>,
        data_num_: Option<usize>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        let strategy = match strategy {
            "prefix" => Strategy::Prefix,
            "greedy" => Strategy::Greedy,
            other => {
                return Err(value_error(format!(
                    "strategy '{other}' is not prefix or greedy"
                )));
            }
        };
        let options = MixedPrecisionOptions {
            metric: metric(metric_name)?,
            output_nodes,
            qtype: promote_qtype(qtype)?,
            budget,
            data_num: data_num(data_num_)?,
            ..MixedPrecisionOptions::default()
        };
        let goal = Goal {
            target,
            higher_is_better,
        };
        // The exception eval_fn raised, re-raised as it was once the search stops.
        let raised: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
        let out = self.run(py, progress, |engine, p| {
            let mut evaluate = |outputs: hmct_debug::task_metric::Outputs| -> Result<f64, String> {
                Python::attach(|py| {
                    let call = || -> PyResult<f64> {
                        let samples = PyList::empty(py);
                        for sample in outputs {
                            let arrays = sample
                                .into_iter()
                                .map(|t| to_numpy(py, t))
                                .collect::<PyResult<Vec<_>>>()?;
                            samples.append(PyList::new(py, arrays)?)?;
                        }
                        eval_fn.bind(py).call1((samples,))?.extract::<f64>()
                    };
                    call().map_err(|e| {
                        let text = e.to_string();
                        *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        text
                    })
                })
            };
            hmct_debug::task_metric::search(
                engine,
                &options,
                goal,
                strategy,
                &mut evaluate,
                &|stage, d, t| p.set(&format!("{stage:?}").to_lowercase(), d, t),
            )
        })?;
        if let Some(e) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let result = out.map_err(|e: TaskMetricError| py_err!(e))?;
        json(&result)
    }
}

/// Calibrates a float model on `data` (folder or dict): (the calibrated model, report
/// JSON). `qtypes` are (activation qtype, weight qtype).
#[pyfunction]
#[pyo3(signature = (model, data, method, percentile, qtype, weight_qtype, data_num_, threads=0, progress=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn calibrate(
    py: Python<'_>,
    model: &PyModel,
    data: &Bound<'_, PyAny>,
    method: &str,
    percentile: Option<f64>,
    qtype: &str,
    weight_qtype: &str,
    data_num_: Option<usize>,
    threads: usize,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<(PyModel, String)> {
    use hmct_debug::calibrate::{CalibrateOptions, Method, calibrate_samples, check_qtype};
    let bad = |e: hmct_debug::calibrate::CalibrateError| py_err!(e);
    let mut options = CalibrateOptions {
        method: method.parse::<Method>().map_err(bad)?,
        qtype: hmct_ir::QType::from_name(qtype),
        weight_qtype: hmct_ir::QType::from_name(weight_qtype),
        data_num: data_num(data_num_)?,
        threads,
        ..CalibrateOptions::default()
    };
    if let Some(p) = percentile {
        options.percentile = p;
    }
    check_qtype(&options.qtype).map_err(bad)?;
    check_qtype(&options.weight_qtype).map_err(bad)?;
    let float = model.model.clone();
    let plan = py
        .detach(|| hmct_quant::plan_model(&float))
        .map_err(|e| to_py(&e, false))?;
    let specs = plan.input_specs();
    let dataset = DataSource::from_py(data, &specs)?.dataset(&specs)?;
    let cancel = Arc::new(AtomicBool::new(false));
    options.cancel = Some(cancel.clone());
    let out = interrupt::run(py, &cancel, progress, |p| {
        let n = options.data_num.unwrap_or(dataset.len()).min(dataset.len());
        let samples = (0..n)
            .map(|i| dataset.sample(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(hmct_debug::calibrate::CalibrateError::from)?;
        calibrate_samples(&float, &samples, &options, &|d, t| p.set("calibrate", d, t))
    })?;
    let calibrated = out.map_err(bad)?;
    Ok((
        PyModel {
            model: calibrated.model,
        },
        json(&calibrated.report)?,
    ))
}
