//! The core every analysis runs on: a loaded model with its plan and session, the
//! calibration data, name lookups, captured activations under a memory budget, and
//! **probes**.
//!
//! A probe is a configuration of calibration nodes (a base model, float or
//! calibrated, plus overrides). [`Engine::run_probes`] runs each probe on each
//! sample by incremental re-execution from the captured activations of the probe's
//! base model (only the nodes downstream of what the probe changes are re-run, up to
//! the wanted values; bit-identical to a full run), and hands the result at once to
//! a reduce function, so the values of a probe never outlive its task. Tasks (probe
//! × sample) run in parallel on the session's thread pool; results come back in
//! probe and sample order whatever the thread count.
//!
//! # Cache policy
//! The captured activations of a sample (every value of a full run of the float or
//! calibrated model, inputs included, but the intermediate values of element-wise
//! chains, which a probe or [`Engine::captured_value`] recomputes from the chain's
//! input: `Capture::Compact`) are kept in memory while their total stays
//! within `cache_bytes`, filled in sample order, so with a tight budget the *first*
//! samples stay cached and are reused by later calls. A sample that does not fit
//! is captured when it is needed, its probes are run, and the capture is dropped:
//! at most one such transient capture (per base model) exists at a time, on top of
//! the budget. Correctness never depends on the budget, only the work done.
//!
//! # Scores
//! [`Engine::probe_scores`] compares probes with the float model on given values and
//! remembers the figures (every metric, per probe, sample and value) for the engine's
//! life. `runall` ranks activation nodes and then regular nodes, and most regular
//! nodes read a single activation calibration node, so the second ranking is largely
//! the first one's probes again; the sensitivity analysis then re-measures its picked
//! nodes alone. A remembered figure is the figure a re-run would give (probes are
//! bit-identical to full runs), so remembering changes the work, never the results.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmct_ir::{Model, NodeId, close_matches, did_you_mean};
use hmct_metrics::{Metric, PairStats};
use hmct_quant::{
    Base, Capture, Config, Override, Plan, PlanError, RunError, Session, Slot, Values,
};
use hmct_tensor::{Dataset, Tensor, TensorError};
use rayon::prelude::*;

/// Errors of the engine and of the analyses' name and argument checks.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Run(RunError),
    #[error(transparent)]
    Data(#[from] TensorError),
    #[error("{}", describe_unknown(.0))]
    UnknownNodes(Vec<UnknownName>),
    #[error("data_num is {requested} but the data has {available} sample(s)")]
    DataNum { requested: usize, available: usize },
    #[error("data_num must be at least 1")]
    ZeroDataNum,
    #[error("cannot compare '{value}': {message}")]
    Compare { value: String, message: String },
    /// The flag given to [`Engine::set_cancel_flag`] was raised.
    #[error("cancelled")]
    Cancelled,
}

impl From<RunError> for EngineError {
    /// A run stopped by the cancel flag is the engine's cancel, whichever check saw it.
    fn from(e: RunError) -> EngineError {
        match e {
            RunError::Cancelled => EngineError::Cancelled,
            e => EngineError::Run(e),
        }
    }
}

impl EngineError {
    /// True for mistakes in the arguments: unknown names, a sample count the data
    /// does not have.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            EngineError::UnknownNodes(_) | EngineError::DataNum { .. } | EngineError::ZeroDataNum
        )
    }
}

/// A name that is not a node of the model, with the closest node names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    pub name: String,
    pub suggestions: Vec<String>,
    /// When `name` is a tensor of the model rather than a node: the node producing it.
    pub produced_by: Option<String>,
}

fn describe_unknown(names: &[UnknownName]) -> String {
    let parts: Vec<String> = names
        .iter()
        .map(|u| {
            if let Some(node) = &u.produced_by {
                format!(
                    "'{}' (a tensor, not a node: it is the output of node '{node}')",
                    u.name
                )
            } else {
                format!("'{}'{}", u.name, did_you_mean(&u.suggestions))
            }
        })
        .collect();
    let noun = if names.len() == 1 { "node" } else { "nodes" };
    format!("unknown {noun} {}", parts.join(", "))
}

/// How an engine runs.
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Memory for cached activations, in bytes (`None` = no limit). See the module
    /// docs for the policy.
    pub cache_bytes: Option<usize>,
}

impl EngineOptions {
    /// The default budget for cached activations, in MB: half the available memory
    /// (from /proc/meminfo), 2048 when unknown. The CLI and the Python package use it.
    pub fn default_cache_mb() -> usize {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<usize>().ok())
            })
            .map_or(2048, |kb| kb / 1024 / 2)
    }
}

/// A node of the model, as analyses see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRef {
    /// A regular node (hmct-ir id).
    Regular(NodeId),
    /// A calibration node: hmct-ir id and index in the plan's calibrations.
    Calibration { id: NodeId, index: usize },
}

/// A configuration to run: a base model and overrides on calibration nodes (plan
/// indices).
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub base: Base,
    pub overrides: Vec<(usize, Override)>,
}

impl Probe {
    /// The float model with `calibrations` switched ON.
    pub fn float_with_on(calibrations: &[usize]) -> Probe {
        Probe {
            base: Base::Float,
            overrides: calibrations.iter().map(|&c| (c, Override::On)).collect(),
        }
    }

    /// The calibrated model with `calibrations` switched OFF.
    pub fn calibrated_with_off(calibrations: &[usize]) -> Probe {
        Probe {
            base: Base::Calibrated,
            overrides: calibrations.iter().map(|&c| (c, Override::Off)).collect(),
        }
    }

    /// The same text for probes that configure the same thing, whatever the order
    /// of their overrides (a later override of a node wins, as in [`Probe::config`]).
    fn canonical(&self) -> String {
        let mut last: Vec<(usize, &Override)> = Vec::new();
        for (c, o) in &self.overrides {
            match last.iter_mut().find(|(l, _)| l == c) {
                Some(entry) => entry.1 = o,
                None => last.push((*c, o)),
            }
        }
        last.sort_by_key(|(c, _)| *c);
        format!("{:?} {last:?}", self.base)
    }

    fn config(&self) -> Config {
        self.overrides
            .iter()
            .fold(base_config(self.base), |cfg, (c, o)| {
                cfg.with(*c, o.clone())
            })
    }
}

fn base_config(base: Base) -> Config {
    match base {
        Base::Float => Config::float(),
        Base::Calibrated => Config::calibrated(),
    }
}

/// What a reduce function sees of one task: the probe's values at the wanted slots
/// and the sample's captured float (and, when some probe starts from it, calibrated)
/// activations.
pub struct ProbeView<'a> {
    /// Index of the probe in the slice given to [`Engine::run_probes`].
    pub probe: usize,
    pub sample: usize,
    session: &'a Session,
    values: &'a Values,
    float: &'a Values,
    calibrated: Option<&'a Values>,
}

impl ProbeView<'_> {
    /// The probe's value of a wanted slot.
    pub fn value(&self, slot: Slot) -> Result<Arc<Tensor>, RunError> {
        self.session.value(self.values, slot)
    }

    /// The float model's value of any slot, for this sample.
    pub fn float_value(&self, slot: Slot) -> Result<Arc<Tensor>, RunError> {
        self.session.value_under(self.float, &Config::float(), slot)
    }

    /// The calibrated model's value of any slot, for this sample (only when some
    /// probe of the call starts from the calibrated model).
    pub fn calibrated_value(&self, slot: Slot) -> Option<Result<Arc<Tensor>, RunError>> {
        self.calibrated
            .map(|v| self.session.value_under(v, &Config::calibrated(), slot))
    }
}

/// Where the time of a [`Engine::run_probes`] call went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Wall time of capturing activations (full runs of the float / calibrated model).
    pub capture: Duration,
    /// Wall time of the probe phase (runs and reductions, in parallel).
    pub probes: Duration,
    /// Time spent in probe runs, summed over tasks (CPU-ish: threads add up).
    pub probe_runs: Duration,
    /// Time spent in reduce functions (the metrics), summed over tasks.
    pub reduce: Duration,
    /// Number of (probe, sample) tasks.
    pub tasks: usize,
    /// Full runs made to capture activations (0 when everything was cached).
    pub captures: usize,
}

impl Timings {
    /// Adds the times and counts of `other` (a later call) to these.
    pub fn add(&mut self, other: &Timings) {
        self.capture += other.capture;
        self.probes += other.probes;
        self.probe_runs += other.probe_runs;
        self.reduce += other.reduce;
        self.tasks += other.tasks;
        self.captures += other.captures;
    }
}

/// Results of [`Engine::run_probes`]: `values[probe][sample]`.
#[derive(Debug)]
pub struct ProbeResults<T> {
    pub values: Vec<Vec<T>>,
    pub timings: Timings,
}

#[derive(Default)]
struct Cache {
    /// (calibrated?, sample) → captured values.
    entries: HashMap<(bool, usize), Arc<Values>>,
    bytes: usize,
    /// Size of the last capture, to predict whether the next one fits.
    last_size: Option<usize>,
}

/// A model, its data and its captured activations, ready for probes.
pub struct Engine {
    model: Model,
    session: Session,
    data: Dataset,
    input_names: Vec<String>,
    /// hmct-ir id of a calibration node → its index in the plan.
    calibration_index: HashMap<NodeId, usize>,
    /// Every value a node of the plan produces (what a capture keeps).
    all_slots: Vec<Slot>,
    cache_bytes: Option<usize>,
    cache: Mutex<Cache>,
    scores: Mutex<Scoreboard>,
}

/// Every metric ([`Metric::ALL`] order) of one value of one probe on one sample,
/// against the float model.
pub type Scores = [f64; Metric::ALL.len()];

/// Probe in canonical form → (sample, value) → figures.
type Scoreboard = HashMap<String, HashMap<(usize, Slot), Scores>>;

impl Engine {
    /// Plans `model` and opens the calibration-data folder `data_dir` against its
    /// inputs.
    pub fn new(
        model: Model,
        data_dir: &Path,
        options: &EngineOptions,
    ) -> Result<Engine, EngineError> {
        let plan = hmct_quant::plan_model(&model)?;
        let specs = plan.input_specs();
        let data = Dataset::open(data_dir, &specs)?;
        Self::with_dataset(model, plan, data, options)
    }

    /// An engine on an already planned model and an opened dataset.
    pub fn with_dataset(
        model: Model,
        plan: Plan,
        data: Dataset,
        options: &EngineOptions,
    ) -> Result<Engine, EngineError> {
        let calibration_index = plan
            .calibrations()
            .iter()
            .enumerate()
            .map(|(i, c)| (c.graph_index, i))
            .collect();
        let all_slots = plan
            .nodes()
            .iter()
            .flat_map(|n| n.outputs.iter().copied())
            .collect();
        let input_names = plan.inputs().iter().map(|i| i.name.clone()).collect();
        let session = Session::new(plan, options.threads)?;
        Ok(Engine {
            model,
            session,
            data,
            input_names,
            calibration_index,
            all_slots,
            cache_bytes: options.cache_bytes,
            cache: Mutex::new(Cache::default()),
            scores: Mutex::new(HashMap::new()),
        })
    }

    /// Makes every later call check `flag` before each capture, each probe task and
    /// each node of a run, and fail with [`EngineError::Cancelled`] once it is
    /// raised: an interactive caller (Ctrl-C in Python) stops a long sweep within one
    /// node's time. Figures remembered before the flag was raised stay valid.
    pub fn set_cancel_flag(&mut self, flag: Arc<AtomicBool>) {
        self.session.set_cancel_flag(flag);
    }

    fn check_cancelled(&self) -> Result<(), EngineError> {
        if self.session.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        Ok(())
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn plan(&self) -> &Plan {
        self.session.plan()
    }

    pub fn threads(&self) -> usize {
        self.session.threads()
    }

    /// Number of samples in the data folder.
    pub fn available_samples(&self) -> usize {
        self.data.len()
    }

    /// The number of samples `data_num` asks for (all when `None`), checked against
    /// the data.
    pub fn sample_count(&self, data_num: Option<usize>) -> Result<usize, EngineError> {
        let available = self.data.len();
        match data_num {
            None => Ok(available),
            Some(0) => Err(EngineError::ZeroDataNum),
            Some(n) if n > available => Err(EngineError::DataNum {
                requested: n,
                available,
            }),
            Some(n) => Ok(n),
        }
    }

    /// The inputs of sample `i`, as the session takes them.
    pub fn sample_inputs(&self, i: usize) -> Result<Vec<(String, Tensor)>, EngineError> {
        Ok(self.data.sample(i)?)
    }

    /// How reports name sample `i`: its file(s), or `sample i` for data in memory.
    pub fn sample_label(&self, i: usize) -> String {
        self.data.sample_label(i)
    }

    /// Sample `i` as `.npy` bytes, one per model input, in input order (the files'
    /// own bytes when the data is a folder).
    pub fn sample_npy_bytes(&self, i: usize) -> Result<Vec<Vec<u8>>, EngineError> {
        (0..self.input_names.len())
            .map(|k| Ok(self.data.npy_bytes(k, i)?))
            .collect()
    }

    /// The node called `name`.
    pub fn lookup(&self, name: &str) -> Option<NodeRef> {
        let id = *self.model.node_mappings().get(name)?;
        Some(match self.calibration_index.get(&id) {
            Some(&index) => NodeRef::Calibration { id, index },
            None => NodeRef::Regular(id),
        })
    }

    /// Looks up every name; the error lists all unknown ones with close matches.
    pub fn lookup_all<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<NodeRef>, EngineError> {
        let mut found = Vec::new();
        let mut unknown: Vec<UnknownName> = Vec::new();
        for name in names {
            let name = name.as_ref();
            match self.lookup(name) {
                Some(r) => found.push(r),
                None if unknown.iter().any(|u| u.name == name) => {}
                None => unknown.push(UnknownName {
                    name: name.to_string(),
                    suggestions: self.suggestions(name),
                    produced_by: self
                        .model
                        .producer(name)
                        .map(|id| self.model.node_name(id).to_string()),
                }),
            }
        }
        if unknown.is_empty() {
            Ok(found)
        } else {
            Err(EngineError::UnknownNodes(unknown))
        }
    }

    /// Node names close to `name`.
    pub fn suggestions(&self, name: &str) -> Vec<String> {
        close_matches(name, self.model.nodes().iter().map(|n| n.name()))
    }

    /// The plan index of the calibration node with hmct-ir id `id`.
    pub fn calibration_index(&self, id: NodeId) -> Option<usize> {
        self.calibration_index.get(&id).copied()
    }

    /// The hmct-ir id of plan calibration `index`.
    pub fn calibration_id(&self, index: usize) -> NodeId {
        self.plan().calibrations()[index].graph_index
    }

    /// The input calibration nodes of a regular node (HZCALIBRATION.md §5), as plan
    /// indices, in input order.
    pub fn input_calibrations(&self, id: NodeId) -> Vec<usize> {
        hmct_ir::input_calibrations(&self.model, id)
            .into_iter()
            .filter_map(|c| self.calibration_index(c))
            .collect()
    }

    /// The calibration nodes a name stands for: a regular node's input calibration
    /// nodes, or a calibration node itself.
    pub fn calibrations_of(&self, node: NodeRef) -> Vec<usize> {
        match node {
            NodeRef::Regular(id) => self.input_calibrations(id),
            NodeRef::Calibration { index, .. } => vec![index],
        }
    }

    /// The slots of a node's (non-empty) outputs.
    pub fn output_slots(&self, id: NodeId) -> Vec<Slot> {
        self.model
            .node(id)
            .output
            .iter()
            .filter(|o| !o.is_empty())
            .filter_map(|o| self.plan().value(o))
            .collect()
    }

    /// The graph outputs' slots.
    pub fn model_output_slots(&self) -> Vec<Slot> {
        self.plan().outputs().to_vec()
    }

    /// The captured activations of `sample` under `base` (every value of a full run
    /// but the intermediate values of element-wise chains: see [`Capture::Compact`];
    /// [`Engine::captured_value`] reads any value), from the cache or computed now
    /// (and cached if the budget allows).
    pub fn capture(&self, sample: usize, base: Base) -> Result<Arc<Values>, EngineError> {
        Ok(self.capture_inner(sample, base)?.0)
    }

    /// A value of `values`, a capture under `base`, recomputed from the capture where
    /// it does not hold it.
    pub fn captured_value(
        &self,
        values: &Values,
        base: Base,
        slot: Slot,
    ) -> Result<Arc<Tensor>, EngineError> {
        Ok(self.session.value_under(values, &base_config(base), slot)?)
    }

    /// The values plus whether they are (now) cached.
    fn capture_inner(&self, sample: usize, base: Base) -> Result<(Arc<Values>, bool), EngineError> {
        let key = (base == Base::Calibrated, sample);
        if let Some(v) = self.lock_cache().entries.get(&key) {
            return Ok((v.clone(), true));
        }
        self.check_cancelled()?;
        let inputs = self.data.sample(sample)?;
        let refs: Vec<(&str, Tensor)> = inputs
            .into_iter()
            .map(|(n, t)| (self.input_name(&n), t))
            .collect();
        let bound = self.session.bind_inputs(&refs)?;
        let values = self.session.run_from(
            &bound,
            None,
            &base_config(base),
            &self.all_slots,
            Capture::Compact,
        )?;
        let size = distinct_bytes(&values, self.plan().num_values());
        let values = Arc::new(values);
        let mut cache = self.lock_cache();
        cache.last_size = Some(size);
        let fits = self.cache_bytes.is_none_or(|b| cache.bytes + size <= b);
        if fits {
            cache.bytes += size;
            cache.entries.insert(key, values.clone());
        }
        Ok((values, fits))
    }

    fn input_name<'a>(&'a self, name: &str) -> &'a str {
        self.input_names
            .iter()
            .find(|n| *n == name)
            .map_or("", String::as_str)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves the map consistent (inserts are
        // single operations), so a poisoned lock is still usable.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when `sample`'s captures under `bases` are cached or are predicted to fit.
    fn will_be_resident(&self, sample: usize, bases: &[Base]) -> bool {
        let cache = self.lock_cache();
        let missing = bases
            .iter()
            .filter(|b| {
                !cache
                    .entries
                    .contains_key(&(**b == Base::Calibrated, sample))
            })
            .count();
        match (self.cache_bytes, cache.last_size) {
            _ if missing == 0 => true,
            (None, _) => true,
            (Some(_), None) => true, // unknown size: try, the capture tells
            (Some(budget), Some(size)) => cache.bytes + missing * size <= budget,
        }
    }

    /// Bytes of cached activations.
    pub fn cached_bytes(&self) -> usize {
        self.lock_cache().bytes
    }

    /// Runs every probe on samples `0..samples` and reduces each (probe, sample)
    /// result with `reduce` as soon as it is computed. `wanted` are the slots the
    /// probes must compute (the only probe values `reduce` can read). `progress` is
    /// called with (tasks done, tasks in total) after each task, from worker threads.
    pub fn run_probes<T, F>(
        &self,
        probes: &[Probe],
        wanted: &[Slot],
        samples: usize,
        reduce: F,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<ProbeResults<T>, EngineError>
    where
        T: Send,
        F: Fn(&ProbeView<'_>) -> Result<T, EngineError> + Sync,
    {
        let mut bases = vec![Base::Float];
        if probes.iter().any(|p| p.base == Base::Calibrated) {
            bases.push(Base::Calibrated);
        }
        let configs: Vec<Config> = probes.iter().map(Probe::config).collect();
        let total = probes.len() * samples;
        let done = AtomicUsize::new(0);
        let mut timings = Timings::default();
        let mut results: Vec<Vec<Option<T>>> = (0..probes.len())
            .map(|_| (0..samples).map(|_| None).collect())
            .collect();

        let mut batch: Vec<SampleCaptures> = Vec::new();
        for sample in 0..samples {
            if !batch.is_empty() && !self.will_be_resident(sample, &bases) {
                let batch_timings = self.run_batch(
                    probes,
                    &configs,
                    wanted,
                    &batch,
                    &reduce,
                    &mut results,
                    &done,
                    total,
                    progress,
                )?;
                timings.add(&batch_timings);
                batch.clear();
            }
            let start = Instant::now();
            let mut resident = true;
            let mut captured = 0;
            let mut get = |base: Base| -> Result<Arc<Values>, EngineError> {
                let was_cached = self
                    .lock_cache()
                    .entries
                    .contains_key(&(base == Base::Calibrated, sample));
                let (v, fits) = self.capture_inner(sample, base)?;
                resident &= fits;
                captured += usize::from(!was_cached);
                Ok(v)
            };
            let float = get(Base::Float)?;
            let calibrated = if bases.len() > 1 {
                Some(get(Base::Calibrated)?)
            } else {
                None
            };
            timings.captures += captured;
            timings.capture += start.elapsed();
            batch.push(SampleCaptures {
                sample,
                float,
                calibrated,
            });
            if !resident {
                let batch_timings = self.run_batch(
                    probes,
                    &configs,
                    wanted,
                    &batch,
                    &reduce,
                    &mut results,
                    &done,
                    total,
                    progress,
                )?;
                timings.add(&batch_timings);
                batch.clear();
            }
        }
        if !batch.is_empty() {
            let batch_timings = self.run_batch(
                probes,
                &configs,
                wanted,
                &batch,
                &reduce,
                &mut results,
                &done,
                total,
                progress,
            )?;
            timings.add(&batch_timings);
        }
        let values = results
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|v| v.expect("every task ran"))
                    .collect()
            })
            .collect();
        Ok(ProbeResults { values, timings })
    }

    #[allow(clippy::too_many_arguments)]
    fn run_batch<T, F>(
        &self,
        probes: &[Probe],
        configs: &[Config],
        wanted: &[Slot],
        batch: &[SampleCaptures],
        reduce: &F,
        results: &mut [Vec<Option<T>>],
        done: &AtomicUsize,
        total: usize,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<Timings, EngineError>
    where
        T: Send,
        F: Fn(&ProbeView<'_>) -> Result<T, EngineError> + Sync,
    {
        // A task runs one probe on a group of samples together (`run_many_from`): a
        // classifier's weight then streams from memory once for the group, not once
        // per sample. Groups are as large as leaves four tasks per thread.
        let threads = self.session.threads().max(1);
        let group = (probes.len() * batch.len() / (4 * threads)).clamp(1, batch.len().max(1));
        let tasks: Vec<(usize, std::ops::Range<usize>)> = (0..probes.len())
            .flat_map(|p| {
                (0..batch.len())
                    .step_by(group)
                    .map(move |b| (p, b..(b + group).min(batch.len())))
            })
            .collect();
        let base_configs = [Config::float(), Config::calibrated()];
        let start = Instant::now();
        type Outcome<T> = (Vec<T>, Duration, Duration);
        let outcomes: Vec<Outcome<T>> = self.session.install(|| {
            tasks
                .par_iter()
                .map(|(p, samples)| {
                    let p = *p;
                    self.check_cancelled()?;
                    let calibrated = probes[p].base == Base::Calibrated;
                    let base_cfg = &base_configs[usize::from(calibrated)];
                    let knowns: Vec<&Values> = batch[samples.clone()]
                        .iter()
                        .map(|caps| match calibrated {
                            true => caps
                                .calibrated
                                .as_deref()
                                .expect("calibrated captures exist when a probe needs them"),
                            false => &*caps.float,
                        })
                        .collect();
                    let t0 = Instant::now();
                    let runs = self.session.run_many_from(
                        &knowns,
                        Some(base_cfg),
                        &configs[p],
                        wanted,
                        Capture::Wanted,
                    )?;
                    let t1 = Instant::now();
                    let mut outs = Vec::with_capacity(runs.len());
                    for (caps, values) in batch[samples.clone()].iter().zip(runs) {
                        let view = ProbeView {
                            probe: p,
                            sample: caps.sample,
                            session: &self.session,
                            values: &values,
                            float: &caps.float,
                            calibrated: caps.calibrated.as_deref(),
                        };
                        outs.push(reduce(&view)?);
                        values.recycle();
                        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                    }
                    Ok((outs, t1 - t0, t1.elapsed()))
                })
                .collect::<Result<Vec<_>, EngineError>>()
        })?;
        let mut timings = Timings {
            probes: start.elapsed(),
            tasks: probes.len() * batch.len(),
            ..Timings::default()
        };
        for ((p, samples), (outs, run, red)) in tasks.iter().zip(outcomes) {
            timings.probe_runs += run;
            timings.reduce += red;
            for (b, out) in samples.clone().zip(outs) {
                results[*p][batch[b].sample] = Some(out);
            }
        }
        Ok(timings)
    }

    /// Compares every probe with the float model on the `compared` values of samples
    /// `0..samples`: `values[probe][sample][value]` holds every metric. Figures an
    /// earlier call of this engine measured are reused (see "Scores" in the module
    /// docs); probes that appear twice run once. Progress counts the tasks run.
    pub fn probe_scores(
        &self,
        probes: &[Probe],
        compared: &[Slot],
        samples: usize,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<ProbeResults<Vec<Scores>>, EngineError> {
        let keys: Vec<String> = probes.iter().map(Probe::canonical).collect();
        let remembered = |scores: &Scoreboard, key: &str| -> Option<Vec<Vec<Scores>>> {
            let known = scores.get(key)?;
            (0..samples)
                .map(|s| {
                    compared
                        .iter()
                        .map(|&slot| known.get(&(s, slot)).copied())
                        .collect()
                })
                .collect()
        };
        let mut to_run: Vec<Probe> = Vec::new();
        let mut run_keys: Vec<&str> = Vec::new();
        {
            let scores = self.lock_scores();
            for (probe, key) in probes.iter().zip(&keys) {
                if !run_keys.contains(&key.as_str()) && remembered(&scores, key).is_none() {
                    to_run.push(probe.clone());
                    run_keys.push(key);
                }
            }
        }
        let results = if to_run.is_empty() {
            ProbeResults {
                values: Vec::new(),
                timings: Timings::default(),
            }
        } else {
            self.run_probes(
                &to_run,
                compared,
                samples,
                |view| {
                    compared
                        .iter()
                        .map(|&slot| {
                            let x = view.float_value(slot)?;
                            let y = view.value(slot)?;
                            let all = compare(&x, &y, &Metric::ALL, self.value_name(slot))?;
                            Ok(std::array::from_fn(|m| all[m]))
                        })
                        .collect::<Result<Vec<Scores>, EngineError>>()
                },
                progress,
            )?
        };
        let mut scores = self.lock_scores();
        for (key, per_sample) in run_keys.iter().zip(&results.values) {
            let known = scores.entry(key.to_string()).or_default();
            for (s, per_value) in per_sample.iter().enumerate() {
                for (&slot, &v) in compared.iter().zip(per_value) {
                    known.insert((s, slot), v);
                }
            }
        }
        let values = keys
            .iter()
            .map(|key| remembered(&scores, key).expect("every probe was measured"))
            .collect();
        Ok(ProbeResults {
            values,
            timings: results.timings,
        })
    }

    fn lock_scores(&self) -> std::sync::MutexGuard<'_, Scoreboard> {
        // Inserts are single operations, so a poisoned map is still consistent.
        self.scores.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name of a slot.
    pub fn value_name(&self, slot: Slot) -> &str {
        self.plan().value_name(slot)
    }
}

struct SampleCaptures {
    sample: usize,
    float: Arc<Values>,
    calibrated: Option<Arc<Values>>,
}

/// Bytes held by `values`, each shared tensor counted once.
fn distinct_bytes(values: &Values, n_slots: usize) -> usize {
    let mut seen = HashSet::new();
    (0..n_slots)
        .filter_map(|s| values.get(s))
        .filter(|t| seen.insert(Arc::as_ptr(t)))
        .map(|t| t.nbytes())
        .sum()
}

/// The metrics between a float reference `x` and a value `y` (same element count),
/// in the order of `metrics`. Non-f32 tensors are compared as f32.
pub fn compare(
    x: &Tensor,
    y: &Tensor,
    metrics: &[Metric],
    what: &str,
) -> Result<Vec<f64>, EngineError> {
    let err = |message: String| EngineError::Compare {
        value: what.to_string(),
        message,
    };
    let (xs, ys) = (
        as_f32(x).ok_or_else(|| err(format!("{} is not numeric", x.dtype())))?,
        as_f32(y).ok_or_else(|| err(format!("{} is not numeric", y.dtype())))?,
    );
    let mut stats = PairStats::new();
    stats.update(&xs, &ys).map_err(|e| err(e.to_string()))?;
    Ok(metrics.iter().map(|&m| stats.metric(m)).collect())
}

fn as_f32(t: &Tensor) -> Option<std::borrow::Cow<'_, [f32]>> {
    if let Some(a) = t.as_f32() {
        if let Some(s) = a.as_slice() {
            return Some(std::borrow::Cow::Borrowed(s));
        }
        return Some(std::borrow::Cow::Owned(a.iter().copied().collect()));
    }
    t.to_f64_vec()
        .map(|v| std::borrow::Cow::Owned(v.into_iter().map(|x| x as f32).collect()))
}
