//! Running a plan: full runs, configurations of calibration nodes, captured
//! activations and incremental re-execution.
//!
//! One scheduler serves every kind of run. Given the values already known (constants,
//! inputs, and for an incremental run the captured activations of a base run), the
//! slots whose value changes (outputs of calibration nodes whose effective setting
//! differs from the base, and everything downstream), and the slots wanted, it runs
//! exactly the nodes needed: walking back from each wanted slot, a slot that is known
//! and unchanged stops the walk, anything else makes its producer run. A full run is
//! the case where nothing but constants and inputs is known, so an incremental run
//! executes the same kernels on the same inputs in the same order for every node it
//! re-runs, which is why its results are bit-identical to a full run. Chains of
//! element-wise nodes may run as one pass when no one keeps their intermediate values
//! (see the `fusion` module); a fused chain computes its nodes' results bit for bit,
//! so this changes nothing either. Several samples' runs of one configuration may go
//! together ([`Session::run_many_from`]): each sample runs alone up to its MatMuls and
//! Gemms, and from there the samples go node by node together; a product of one row by
//! a constant matrix (a classifier) then runs for all samples in one pass over the
//! matrix, bit for bit the single-row sums.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::{ArrayD, IxDyn};

use crate::fake_quant::FakeQuant;
use crate::fusion::{Chain, Chains, Tail};
use crate::layout::Blocked;
use crate::ops::OpError;
use crate::ops::blocked::{self, Layouts};
use crate::plan::{NodeOp, Plan, PlanNode, Slot};

/// Errors while running. A node's error names the node; the kernel's error is its
/// `source`, printed once by whoever prints the chain ([`hmct_ir::error_chain`]).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("node '{node}' ({op_type}, opset {opset})")]
    Node {
        node: String,
        op_type: String,
        opset: i64,
        #[source]
        source: OpError,
    },
    #[error("calibration node '{node}': {message}")]
    Calibration { node: String, message: String },
    #[error("input '{name}': {message}")]
    Input { name: String, message: String },
    #[error("value '{0}' was not computed (it is neither produced by the run nor captured)")]
    Missing(String),
    #[error("{0}")]
    ThreadPool(String),
    /// The flag given to [`Session::set_cancel_flag`] was raised during the run.
    #[error("cancelled")]
    Cancelled,
}

/// Which model a configuration starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Base {
    /// Every calibration node OFF.
    #[default]
    Float,
    /// Calibration nodes as the file's `switch` says.
    Calibrated,
}

/// An override on one calibration node.
#[derive(Clone, Debug, PartialEq)]
pub enum Override {
    /// ON with the file's parameters.
    On,
    /// The identity.
    Off,
    /// ON with these parameters (e.g. the same thresholds at int16).
    Set(FakeQuant),
}

/// A debug configuration: a base model plus overrides on calibration nodes, keyed by
/// their index in [`Plan::calibrations`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub base: Base,
    pub overrides: HashMap<usize, Override>,
}

impl Config {
    /// The float model.
    pub fn float() -> Config {
        Config::default()
    }

    /// The calibrated model as written.
    pub fn calibrated() -> Config {
        Config {
            base: Base::Calibrated,
            overrides: HashMap::new(),
        }
    }

    /// Adds an override.
    pub fn with(mut self, calibration: usize, o: Override) -> Config {
        self.overrides.insert(calibration, o);
        self
    }

    /// What calibration node `i` does under this configuration (`None` = identity).
    pub fn effective<'p>(&'p self, plan: &'p Plan, i: usize) -> Option<&'p FakeQuant> {
        let file = &plan.calibrations[i].file;
        let fq = match self.overrides.get(&i) {
            Some(Override::Off) => None,
            Some(Override::On) => Some(&file.fake_quant),
            Some(Override::Set(fq)) => Some(fq),
            None => match self.base {
                Base::Float => None,
                Base::Calibrated => file.switch_on.then_some(&file.fake_quant),
            },
        };
        fq.filter(|fq| !matches!(fq, FakeQuant::Identity))
    }
}

/// Values of a run, indexed by slot. Cheap to clone (tensors are shared).
#[derive(Clone, Debug, Default)]
pub struct Values {
    slots: Vec<Option<Arc<Tensor>>>,
}

impl Values {
    /// The value in a slot, if it was computed and kept, as the session holds it
    /// (channel-blocked between convs; [`Session::value`] gives it NCHW).
    pub fn get(&self, slot: Slot) -> Option<&Arc<Tensor>> {
        self.slots.get(slot).and_then(|v| v.as_ref())
    }

    /// A slot's value: a constant of `plan`, or a value held here.
    fn lookup(&self, plan: &Plan, slot: Slot) -> Option<Arc<Tensor>> {
        plan.constants[slot]
            .clone()
            .or_else(|| self.get(slot).cloned())
    }

    /// [`Values::lookup`], or the error naming the value when it has none.
    fn fetch(&self, plan: &Plan, slot: Slot) -> Result<Arc<Tensor>, RunError> {
        self.lookup(plan, slot)
            .ok_or_else(|| RunError::Missing(plan.value_name(slot).to_string()))
    }

    /// Bytes held by the kept values (shared tensors count once per slot).
    pub fn nbytes(&self) -> usize {
        self.slots.iter().flatten().map(|t| t.nbytes()).sum()
    }

    /// Gives the buffers of values nothing else holds to this thread's pool, for the
    /// next run on this thread to write into (see [`Session::recycle`]); values shared
    /// with captures or a caller stay untouched.
    pub fn recycle(self) {
        self.slots.into_iter().for_each(recycle);
    }
}

/// What to keep of a run beyond the wanted outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// Only the wanted slots.
    Wanted,
    /// Every value computed (activations for later incremental runs).
    All,
    /// Every value computed and wanted but those only an element-wise chain's own
    /// nodes read (its intermediate values; see the `fusion` module): activations
    /// for later incremental runs, which recompute such a value from the chain's
    /// input where they need it ([`Session::value_under`] for a reader). Chains
    /// then run as one pass here too. The PP-OCRv4 detector's float values take
    /// 258 MB instead of 668 per sample (its hard-swish chains).
    Compact,
}

/// A plan ready to run, with a thread pool and the cache of fake-quantized weights.
pub struct Session {
    plan: Plan,
    pool: rayon::ThreadPool,
    threads: usize,
    /// Fake-quantized weights per calibration node: a weight node is a constant
    /// function of its weight, so each (node, parameters) pair is computed once.
    weight_cache: Mutex<HashMap<usize, Vec<(FakeQuant, Arc<Tensor>)>>>,
    /// Wall time per plan node, when profiling is on.
    profile: Option<Mutex<NodeTimes>>,
    /// Chains of element-wise nodes that may run as one pass (see the `fusion`
    /// module), found when the session is made.
    chains: Chains,
    /// Whether those chains run as one pass.
    fuse: bool,
    /// The values kept channel-blocked between convs (see the `layout` module), with
    /// AVX-512 unless `HMCT_BLOCKED=off`.
    blocked: Option<Blocked>,
    /// Raised by another thread to stop runs between two nodes (Ctrl-C in the Python
    /// package): one forward pass of a big model takes seconds, too long to wait for.
    cancel: Option<Arc<AtomicBool>>,
}

/// One plan being run: a session's plan, or the branch of an If node it runs.
#[derive(Clone, Copy)]
struct Scope<'a> {
    plan: &'a Plan,
    /// Chains that may run as one pass; `None` runs every node on its own.
    chains: Option<&'a Chains>,
    /// Per-node timing, of the session's plan only (a branch's time is its If node's).
    profile: Option<&'a Mutex<NodeTimes>>,
    /// Blocked values, of the session's plan only.
    blocked: Option<&'a Blocked>,
}

/// Wall time spent in each plan node (indexed like `Plan::nodes`), summed over the
/// runs made since profiling was switched on. A node's time includes its kernel's
/// own parallel work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTimes {
    pub total: Vec<Duration>,
    /// Calls in which the node ran, on its own or as the start of a fused chain.
    pub calls: Vec<u32>,
    /// Calls in which the node ran the element-wise chain it starts
    /// ([`Session::fused_chain`]) as one pass; those calls' time is the whole chain's.
    pub fused_calls: Vec<u32>,
    /// Calls in which the node's kernel also ran the element-wise chain that alone
    /// reads its output ([`Session::fused_tail`]); those calls' time includes it.
    pub tail_calls: Vec<u32>,
    /// Calls in which the node ran for several samples at once
    /// ([`crate::ops::Kernel::run_rows`]), counted once per sample; those calls' time
    /// is the samples' together.
    pub rows_calls: Vec<u32>,
}

/// What one run does (see [`Session::execute`]).
struct Work {
    /// Per node: whether the run executes it.
    run_node: Vec<bool>,
    /// Per slot: whether the run's result keeps the value.
    keep: Vec<bool>,
    /// Per slot: the last node of the run that reads it.
    last_use: Vec<usize>,
}

/// A run in progress: its values, and the nodes a fused chain has computed.
struct RunState {
    values: Values,
    fused: Vec<bool>,
}

impl RunState {
    fn new(plan: &Plan, known: &Values) -> RunState {
        let mut values = known.clone();
        values.slots.resize(plan.num_values(), None);
        RunState {
            values,
            fused: vec![false; plan.nodes.len()],
        }
    }

    /// The run's result: every value for `Capture::All`, else the kept ones.
    fn finish(self, work: &Work, capture: Capture) -> Values {
        let mut values = self.values;
        if capture != Capture::All {
            for (s, v) in values.slots.iter_mut().enumerate() {
                if !work.keep[s] {
                    *v = None;
                }
            }
        }
        values
    }
}

/// Adds `calls` calls of node `i`, which began at `start`, to the session's profile
/// when it keeps one; `count` adds them to the counter of their kind.
fn record(
    scope: Scope,
    start: Option<Instant>,
    i: usize,
    calls: u32,
    count: impl FnOnce(&mut NodeTimes),
) {
    if let (Some(profile), Some(start)) = (scope.profile, start) {
        let mut p = profile.lock().unwrap_or_else(|e| e.into_inner());
        p.total[i] += start.elapsed();
        p.calls[i] += calls;
        count(&mut p);
    }
}

/// The error of `node`'s kernel as the run reports it.
fn node_error(node: &PlanNode) -> impl Fn(OpError) -> RunError + Copy + '_ {
    |source| RunError::Node {
        node: node.name.clone(),
        op_type: node.op_type.clone(),
        opset: node.opset,
        source,
    }
}

/// The nodes of a run that [`Session::execute_many`] runs in lockstep: those
/// downstream of a product that may batch rows (a MatMul or Gemm, of one row or many),
/// with every node of a fused chain or tail one of them belongs to (and their
/// downstream); `None` when the run has no such product.
fn lockstep_nodes(scope: Scope, work: &Work) -> Option<Vec<bool>> {
    let plan = scope.plan;
    let n = plan.nodes.len();
    let mut lock: Vec<bool> = (0..n)
        .map(|i| {
            work.run_node[i] && matches!(&plan.nodes[i].op, NodeOp::Kernel(k) if k.batches_rows())
        })
        .collect();
    if !lock.contains(&true) {
        return None;
    }
    loop {
        let mut changed = false;
        for i in 0..n {
            let node = &plan.nodes[i];
            if !lock[i]
                && node
                    .inputs
                    .iter()
                    .flatten()
                    .any(|&s| plan.producer(s).is_some_and(|p| lock[p]))
            {
                lock[i] = true;
                changed = true;
            }
            let Some(chains) = scope.chains else { continue };
            let groups = [
                chains.starting_at(i).map(|c| &c.nodes[..]),
                chains.tail_of(i).map(|c| &c.nodes[..]),
            ];
            for group in groups.into_iter().flatten() {
                let members = || std::iter::once(i).chain(group.iter().copied());
                if members().any(|j| lock[j]) && !members().all(|j| lock[j]) {
                    members().for_each(|j| lock[j] = true);
                    changed = true;
                }
            }
        }
        if !changed {
            return Some(lock);
        }
    }
}

impl Session {
    /// A session running on `threads` threads (0 = all cores). A session of one
    /// thread runs on the thread that calls it (no handoff to a pool thread).
    pub fn new(plan: Plan, threads: usize) -> Result<Session, RunError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| RunError::ThreadPool(e.to_string()))?;
        let threads = pool.current_num_threads();
        let chains = Chains::find(&plan);
        let blocked = (crate::cpu::conv_isa() == Some(crate::cpu::Isa::Avx512)
            && std::env::var("HMCT_BLOCKED").as_deref() != Ok("off"))
        .then(|| Blocked::find(&plan, &chains));
        Ok(Session {
            plan,
            pool,
            threads,
            weight_cache: Mutex::new(HashMap::new()),
            profile: None,
            chains,
            fuse: true,
            blocked,
            cancel: None,
        })
    }

    /// Keeps every value NCHW, none channel-blocked between convs (see the `layout`
    /// module). The results are the same bit for bit; this is for checking that.
    pub fn without_blocked_values(mut self) -> Session {
        self.blocked = None;
        self
    }

    /// How many values convs store channel-blocked for the next conv (see the
    /// `layout` module); 0 without AVX-512 or with `HMCT_BLOCKED=off`.
    pub fn blocked_values(&self) -> usize {
        self.blocked
            .as_ref()
            .map_or(0, |b| b.write.iter().filter(|&&w| w).count())
    }

    /// Switches per-node timing on (see [`Session::node_times`]). Timing costs a
    /// clock read per node, so it is off unless asked for.
    pub fn with_profiling(mut self) -> Session {
        let n = self.plan.nodes.len();
        self.profile = Some(Mutex::new(NodeTimes {
            total: vec![Duration::ZERO; n],
            calls: vec![0; n],
            fused_calls: vec![0; n],
            tail_calls: vec![0; n],
            rows_calls: vec![0; n],
        }));
        self
    }

    /// Runs every node on its own, never an element-wise chain as one pass. The
    /// results are the same bit for bit; this is for checking that, and for timing.
    pub fn without_fusion(mut self) -> Session {
        self.fuse = false;
        self
    }

    /// Runs stop with [`RunError::Cancelled`] before their next node once `flag` is
    /// raised. The flag is not lowered here; the caller resets it for the next call.
    pub fn set_cancel_flag(&mut self, flag: Arc<AtomicBool>) {
        self.cancel = Some(flag);
    }

    /// Whether the flag given to [`Session::set_cancel_flag`] is raised.
    pub fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Time per plan node since profiling was switched on; `None` when it is off.
    pub fn node_times(&self) -> Option<NodeTimes> {
        self.profile
            .as_ref()
            .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The nodes of the element-wise chain node `node` starts, when it starts one: the
    /// session may run them as one pass (see the `fusion` module).
    pub fn fused_chain(&self, node: usize) -> Option<&[usize]> {
        Some(&self.chains.starting_at(node)?.nodes)
    }

    /// The nodes of the element-wise chain that node `node`'s kernel may run on its
    /// output as it stores it (a Conv's activation; see [`NodeTimes::tail_calls`]).
    pub fn fused_tail(&self, node: usize) -> Option<&[usize]> {
        Some(&self.chains.tail_of(node)?.nodes)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` inside this session's thread pool (for callers that parallelize
    /// across runs, e.g. one probe per task).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Checks inputs against the declared graph inputs and binds them to slots.
    pub fn bind_inputs(&self, inputs: &[(&str, Tensor)]) -> Result<Values, RunError> {
        let plan = &self.plan;
        let mut values = Values {
            slots: vec![None; plan.num_values()],
        };
        for info in plan.inputs() {
            let Some((_, t)) = inputs.iter().find(|(n, _)| *n == info.name) else {
                return Err(RunError::Input {
                    name: info.name.clone(),
                    message: "not given".into(),
                });
            };
            if let Some(dt) = info.dtype
                && dt != t.dtype()
            {
                return Err(RunError::Input {
                    name: info.name.clone(),
                    message: format!("expected {dt}, got {}", t.dtype()),
                });
            }
            if let Some(dims) = &info.dims {
                let ok = dims.len() == t.shape().len()
                    && dims
                        .iter()
                        .zip(t.shape())
                        .all(|(d, &s)| d.is_none_or(|d| d == s));
                if !ok {
                    let want: Vec<String> = dims
                        .iter()
                        .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
                        .collect();
                    return Err(RunError::Input {
                        name: info.name.clone(),
                        message: format!(
                            "expected shape [{}], got {:?}",
                            want.join(", "),
                            t.shape()
                        ),
                    });
                }
            }
            values.slots[info.slot] = Some(Arc::new(t.clone().into_standard_layout()));
        }
        for (name, _) in inputs {
            if !plan.inputs().iter().any(|i| i.name == *name) {
                return Err(RunError::Input {
                    name: name.to_string(),
                    message: "the model has no such input".into(),
                });
            }
        }
        Ok(values)
    }

    /// Runs the model from its inputs and returns the graph outputs in order.
    pub fn run(
        &self,
        inputs: &[(&str, Tensor)],
        config: &Config,
    ) -> Result<Vec<Arc<Tensor>>, RunError> {
        let bound = self.bind_inputs(inputs)?;
        let wanted = self.plan.outputs().to_vec();
        let values = self.run_from(&bound, None, config, &wanted, Capture::Wanted)?;
        wanted.iter().map(|&s| self.value(&values, s)).collect()
    }

    /// Gives outputs of [`Session::run`] the caller is done with (those nothing else
    /// holds) back to a buffer pool the next run may take them from, so that it writes
    /// its large outputs there rather than into fresh memory: DeepLabV3's 22 MB output
    /// cost a clearing of new pages on every run. Pools are per thread: a one-thread
    /// session runs on the caller's thread, whose pool gets them; a larger session
    /// gives them to whichever of its threads takes this call.
    pub fn recycle(&self, outputs: Vec<Arc<Tensor>>) {
        let give = || outputs.into_iter().for_each(|t| recycle(Some(t)));
        if self.threads == 1 {
            give();
        } else {
            self.pool.install(give);
        }
    }

    /// The general entry point. `known` holds values already available: bound inputs,
    /// or the captured values of a base run made under `base_config`. Values of
    /// calibration nodes whose setting differs between `base_config` and `config`,
    /// and everything downstream of them, are recomputed; a slot missing from `known`
    /// is recomputed from what is there. Returns `known` updated with the new values
    /// (for `Capture::All`) or with just the wanted slots filled in.
    pub fn run_from(
        &self,
        known: &Values,
        base_config: Option<&Config>,
        config: &Config,
        wanted: &[Slot],
        capture: Capture,
    ) -> Result<Values, RunError> {
        let scope = self.scope();
        self.on_threads(|| self.execute(scope, known, base_config, config, wanted, capture))
    }

    /// The session's plan with its chains, profile and blocked values.
    fn scope(&self) -> Scope<'_> {
        Scope {
            plan: &self.plan,
            chains: self.fuse.then_some(&self.chains),
            profile: self.profile.as_ref(),
            blocked: self.blocked.as_ref(),
        }
    }

    /// Runs `run` on the session's threads.
    fn on_threads<R: Send>(&self, run: impl FnOnce() -> R + Send) -> R {
        if self.threads == 1 {
            // On the caller's thread: handing the run to the pool's one thread and
            // waking the caller afterwards costs more than many small models' runs
            // (see the `par` module).
            crate::par::sequential(run)
        } else if rayon::current_thread_index().is_none() {
            self.pool.install(|| crate::par::with_workers_awake(run))
        } else {
            // Inside a pool already (a probe among others): its threads are busy.
            self.pool.install(run)
        }
    }

    /// [`Session::run_from`] on several samples at once: `knowns[s]` holds sample
    /// `s`'s known values (all of the same kind: bound inputs, or captures of the same
    /// base run). Each result is bit for bit that of `run_from` on its sample; a
    /// product of one row by a constant matrix (a classifier) runs for all samples in
    /// one pass over the matrix rather than once per sample.
    pub fn run_many_from(
        &self,
        knowns: &[&Values],
        base_config: Option<&Config>,
        config: &Config,
        wanted: &[Slot],
        capture: Capture,
    ) -> Result<Vec<Values>, RunError> {
        let scope = self.scope();
        self.on_threads(|| self.execute_many(scope, knowns, base_config, config, wanted, capture))
    }

    fn execute(
        &self,
        scope: Scope,
        known: &Values,
        base_config: Option<&Config>,
        config: &Config,
        wanted: &[Slot],
        capture: Capture,
    ) -> Result<Values, RunError> {
        let work = Self::work(scope, known, base_config, config, wanted, capture)?;
        let mut state = RunState::new(scope.plan, known);
        for i in 0..scope.plan.nodes.len() {
            self.step(scope, &work, config, i, &mut state)?;
        }
        Ok(state.finish(&work, capture))
    }

    /// [`Session::execute`] on several samples' `known` values with the same
    /// configurations and wanted slots, bit for bit as one run each. Nodes downstream
    /// of a MatMul or Gemm ([`Kernel::batches_rows`]) run in lockstep after the rest
    /// of each sample's run: such a product of one row by a constant matrix (a
    /// classifier) runs for all samples in one pass over its matrix, which each would
    /// otherwise stream from memory; every other node runs per sample, one node after
    /// another, so a transformer's weights serve all samples while in cache. (Lockstep
    /// only after one-row products left ViT-S's and Swin-T's probes 7-12% slower;
    /// lockstep over whole CNN cones made EfficientNet-B0's 5-8% slower: session 44.)
    ///
    /// [`Kernel::batches_rows`]: crate::ops::Kernel::batches_rows
    fn execute_many(
        &self,
        scope: Scope,
        knowns: &[&Values],
        base_config: Option<&Config>,
        config: &Config,
        wanted: &[Slot],
        capture: Capture,
    ) -> Result<Vec<Values>, RunError> {
        let alone =
            |known: &&Values| self.execute(scope, known, base_config, config, wanted, capture);
        let Some(first) = knowns.first() else {
            return Ok(Vec::new());
        };
        let work = Self::work(scope, first, base_config, config, wanted, capture)?;
        let lockstep = match lockstep_nodes(scope, &work) {
            Some(l) if knowns.len() > 1 => l,
            _ => return knowns.iter().map(alone).collect(),
        };
        // The nodes to run depend on what each sample's values hold; the samples of
        // one probe hold the same slots, but the lockstep needs them to.
        for known in &knowns[1..] {
            let other = Self::work(scope, known, base_config, config, wanted, capture)?;
            if other.run_node != work.run_node || other.keep != work.keep {
                return knowns.iter().map(alone).collect();
            }
        }
        let plan = scope.plan;
        let mut states: Vec<RunState> = knowns.iter().map(|k| RunState::new(plan, k)).collect();
        for state in &mut states {
            for i in (0..plan.nodes.len()).filter(|&i| !lockstep[i]) {
                self.step(scope, &work, config, i, state)?;
            }
        }
        for i in (0..plan.nodes.len()).filter(|&i| lockstep[i]) {
            if !self.step_rows(scope, &work, config, i, &mut states)? {
                for state in &mut states {
                    self.step(scope, &work, config, i, state)?;
                }
            }
        }
        Ok(states
            .into_iter()
            .map(|s| s.finish(&work, capture))
            .collect())
    }

    /// What a run does: which nodes run, which values it keeps, where each value is
    /// read for the last time.
    fn work(
        scope: Scope,
        known: &Values,
        base_config: Option<&Config>,
        config: &Config,
        wanted: &[Slot],
        capture: Capture,
    ) -> Result<Work, RunError> {
        let plan = scope.plan;
        let n_values = plan.num_values();

        // Forward pass over the plan: which slots change relative to `known`.
        let mut dirty = vec![false; n_values];
        if let Some(base) = base_config {
            for node in &plan.nodes {
                let changed = match node.op {
                    NodeOp::Calibration(c) => config.effective(plan, c) != base.effective(plan, c),
                    _ => false,
                };
                if changed || node.inputs.iter().flatten().any(|&s| dirty[s]) {
                    for &o in &node.outputs {
                        dirty[o] = true;
                    }
                }
            }
        }

        // Backward pass: which nodes must run to produce the wanted slots.
        // Fake-quantized weights always come from this session's store (a lookup),
        // never from `known`: kernels key what they derive from a weight by its
        // address (see `NodeSpec::stable_inputs`), which holds only for tensors the
        // session keeps alive.
        let available = |s: Slot| {
            !dirty[s]
                && !plan.is_weight_calibration_output(s)
                && (plan.constants[s].is_some() || known.get(s).is_some())
        };
        let mut run_node = vec![false; plan.nodes.len()];
        let mut visited = vec![false; n_values];
        let mut stack: Vec<Slot> = wanted.to_vec();
        while let Some(s) = stack.pop() {
            if visited[s] {
                continue;
            }
            visited[s] = true;
            if available(s) {
                continue;
            }
            let Some(p) = plan.producer[s] else {
                return Err(RunError::Missing(plan.value_name(s).to_string()));
            };
            if !run_node[p] {
                run_node[p] = true;
                stack.extend(plan.nodes[p].inputs.iter().flatten().copied());
            }
        }

        // Last reader of each slot among the nodes that run, to free memory early.
        let mut keep = vec![capture != Capture::Wanted; n_values];
        for &w in wanted {
            keep[w] = true;
        }
        if capture == Capture::Compact
            && let Some(chains) = scope.chains
        {
            for s in chains.internal_slots() {
                keep[s] = false;
            }
        }
        let mut last_use = vec![usize::MAX; n_values];
        for (i, node) in plan.nodes.iter().enumerate() {
            if run_node[i] {
                for &s in node.inputs.iter().flatten() {
                    last_use[s] = i;
                }
            }
        }

        Ok(Work {
            run_node,
            keep,
            last_use,
        })
    }

    /// Runs node `i` of a run in progress, unless the run skips it or a fused chain
    /// has computed it.
    fn step(
        &self,
        scope: Scope,
        work: &Work,
        config: &Config,
        i: usize,
        state: &mut RunState,
    ) -> Result<(), RunError> {
        let plan = scope.plan;
        let node = &plan.nodes[i];
        let Work {
            run_node,
            keep,
            last_use,
        } = work;
        let RunState { values, fused } = state;
        if !run_node[i] || fused[i] {
            return Ok(());
        }
        if self.is_cancelled() {
            return Err(RunError::Cancelled);
        }
        let start = scope.profile.map(|_| Instant::now());
        let chain = scope.chains.and_then(|c| c.starting_at(i));
        if let Some(b) = scope.blocked {
            let alone = [i];
            let nodes = chain.map_or(&alone[..], |c| &c.nodes[..]);
            for &j in nodes {
                unblock_inputs(plan, b, j, values, config);
            }
        }
        if let Some(chain) = chain
            && run_chain(plan, chain, config, values, run_node, keep, last_use)
        {
            for &j in &chain.nodes {
                fused[j] = true;
            }
            release_side(chain, values, keep, last_use);
            record(scope, start, i, 1, |p| p.fused_calls[i] += 1);
            return Ok(());
        }
        // An element-wise chain that alone reads this node's output, run by the
        // kernel on its output as it stores it.
        let tail = scope
            .chains
            .and_then(|c| c.tail_of(i))
            .filter(|chain| tail_may_run(chain, run_node, keep));
        let (outputs, tail_ran) = match tail {
            Some(chain) => self.run_with_tail(plan, i, values, chain, config, scope.blocked)?,
            None => (
                self.run_node(plan, i, values, config, keep, last_use, scope.blocked)?,
                false,
            ),
        };
        record(scope, start, i, 1, |p| {
            p.tail_calls[i] += u32::from(tail_ran)
        });
        match tail.filter(|_| tail_ran) {
            Some(chain) => {
                // The output is the chain's; the node's own and the chain's
                // intermediate values never existed.
                let out = outputs
                    .into_iter()
                    .next()
                    .expect("a tail's node has one output");
                values.slots[chain.output] = Some(out);
                for &j in &chain.nodes {
                    fused[j] = true;
                }
            }
            None => {
                for (&slot, t) in node.outputs.iter().zip(outputs) {
                    values.slots[slot] = Some(t);
                }
            }
        }
        for &s in node.inputs.iter().flatten() {
            if last_use[s] == i && !keep[s] {
                recycle(values.slots[s].take());
            }
        }
        Ok(())
    }

    /// Runs node `i` for every sample at once with [`Kernel::run_rows`], when it is a
    /// node of that kind, runs for every sample on its own (no fused chain or tail),
    /// and the samples' inputs allow it; returns whether it ran.
    ///
    /// [`Kernel::run_rows`]: crate::ops::Kernel::run_rows
    fn step_rows(
        &self,
        scope: Scope,
        work: &Work,
        config: &Config,
        i: usize,
        states: &mut [RunState],
    ) -> Result<bool, RunError> {
        let plan = scope.plan;
        let node = &plan.nodes[i];
        let NodeOp::Kernel(kernel) = &node.op else {
            return Ok(false);
        };
        let alone = scope
            .chains
            .is_none_or(|c| c.starting_at(i).is_none() && c.tail_of(i).is_none());
        if !work.run_node[i]
            || !kernel.batches_rows()
            || !alone
            || states.iter().any(|s| s.fused[i])
        {
            return Ok(false);
        }
        if self.is_cancelled() {
            return Err(RunError::Cancelled);
        }
        let start = scope.profile.map(|_| Instant::now());
        let mut inputs: Vec<Vec<Option<Arc<Tensor>>>> = Vec::with_capacity(states.len());
        for state in states.iter_mut() {
            if let Some(b) = scope.blocked {
                unblock_inputs(plan, b, i, &mut state.values, config);
            }
            inputs.push(
                node.inputs
                    .iter()
                    .map(|s| s.map(|s| state.values.fetch(plan, s)).transpose())
                    .collect::<Result<_, _>>()?,
            );
        }
        let refs: Vec<Vec<Option<&Tensor>>> = inputs
            .iter()
            .map(|sample| sample.iter().map(|t| t.as_deref()).collect())
            .collect();
        let Some(outputs) = kernel.run_rows(&refs) else {
            return Ok(false);
        };
        let outputs = outputs.map_err(node_error(node))?;
        // The inputs' last readers may recycle their buffers below: let go of them.
        drop(refs);
        drop(inputs);
        let samples = states.len() as u32;
        record(scope, start, i, samples, |p| p.rows_calls[i] += samples);
        for (state, outs) in states.iter_mut().zip(outputs) {
            for (&slot, t) in node.outputs.iter().zip(outs) {
                state.values.slots[slot] = Some(Arc::new(t));
            }
            for &s in node.inputs.iter().flatten() {
                if work.last_use[s] == i && !work.keep[s] {
                    recycle(state.values.slots[s].take());
                }
            }
        }
        Ok(true)
    }

    /// Runs kernel node `i` with `tail` on its output; returns whether the tail ran
    /// (the output is then the tail's).
    fn run_with_tail(
        &self,
        plan: &Plan,
        i: usize,
        values: &Values,
        tail: &Chain,
        config: &Config,
        blocked: Option<&Blocked>,
    ) -> Result<(Vec<Arc<Tensor>>, bool), RunError> {
        let node = &plan.nodes[i];
        let tail = tail.args(|c| config.effective(plan, c), None);
        let node_err = node_error(node);
        let NodeOp::Kernel(kernel) = &node.op else {
            unreachable!("tails are found for kernel nodes only")
        };
        let inputs: Vec<Option<Arc<Tensor>>> = node
            .inputs
            .iter()
            .map(|s| s.map(|s| values.fetch(plan, s)).transpose())
            .collect::<Result<_, _>>()?;
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_deref()).collect();
        let (out, ran) = match blocked.filter(|b| b.convs[i]) {
            Some(b) => {
                let layouts = Layouts {
                    input: refs[0].is_some_and(blocked::is_blocked),
                    output: b.write[tail.chain().output],
                    wide: b.wide[tail.chain().output],
                };
                let (out, ran) = kernel
                    .run_blocked(&refs, Some(&tail), layouts)
                    .map_err(node_err)?;
                let written = if ran {
                    tail.chain().output
                } else {
                    node.outputs[0]
                };
                b.check_written(written, &out);
                (out, ran)
            }
            None => kernel.run_with_tail(&refs, &tail).map_err(node_err)?,
        };
        if out.len() > node.outputs.len() {
            return Err(node_err(OpError::invalid(
                "kernel returned too many outputs",
            )));
        }
        let out = out
            .into_iter()
            .map(|t| Arc::new(t.into_standard_layout()))
            .collect();
        Ok((out, ran))
    }

    #[allow(clippy::too_many_arguments)]
    fn run_node(
        &self,
        plan: &Plan,
        i: usize,
        values: &mut Values,
        config: &Config,
        keep: &[bool],
        last_use: &[usize],
        blocked: Option<&Blocked>,
    ) -> Result<Vec<Arc<Tensor>>, RunError> {
        let node = &plan.nodes[i];
        let fetch = |values: &Values, s: Slot| values.fetch(plan, s);
        let node_err = node_error(node);
        match &node.op {
            NodeOp::Calibration(c) => {
                let cal = &plan.calibrations[*c];
                let input_slot = node.inputs[0].expect("calibration input checked at plan time");
                let Some(fq) = config.effective(plan, *c) else {
                    return Ok(vec![fetch(values, input_slot)?]);
                };
                let calib_err = |message: String| RunError::Calibration {
                    node: cal.name.clone(),
                    message,
                };
                if cal.is_weight {
                    return Ok(vec![self.quantized_weight(
                        *c,
                        fq,
                        &fetch(values, input_slot)?,
                    )?]);
                }
                // Quantize in place when this node is the input's last reader and no
                // one keeps it; otherwise on a copy.
                let mut input = if last_use[input_slot] == i && !keep[input_slot] {
                    values.slots[input_slot].take()
                } else {
                    None
                }
                .map_or_else(|| fetch(values, input_slot), Ok)?;
                // A copy goes into a recycled buffer: `make_mut`'s clone is fresh
                // memory, whose pages fault in on every run (YOLOv8n's calibrated
                // model, 1,200 pages a run).
                if Arc::get_mut(&mut input).is_none()
                    && let Tensor::F32(a) = &*input
                    && let Some(src) = a.as_slice()
                {
                    let mut copy = crate::buffers::take::<f32>(src.len());
                    copy.copy_from_slice(src);
                    let copy = ArrayD::from_shape_vec(a.raw_dim(), copy)
                        .expect("the copy has the input's length");
                    input = Arc::new(Tensor::F32(copy));
                }
                let t = Arc::make_mut(&mut input);
                let shape = t.shape().to_vec();
                let dtype = t.dtype();
                let data = t.as_f32_mut().ok_or_else(|| {
                    calib_err(format!(
                        "input is {dtype}, only float tensors can be quantized"
                    ))
                })?;
                let slice = data
                    .as_slice_mut()
                    .expect("tensors are kept in standard layout");
                fq.apply_in_place(slice, &shape)
                    .map_err(|e| calib_err(e.to_string()))?;
                Ok(vec![input])
            }
            NodeOp::Kernel(kernel) => {
                // An input the kernel may overwrite: read for the last time here, not
                // kept, read once by this node, and held by no one else (captured values
                // are shared with the capture, so they are never touched).
                let owned = kernel.reusable_inputs().iter().find_map(|&j| {
                    let s = node.inputs.get(j).copied().flatten()?;
                    let free = last_use[s] == i
                        && !keep[s]
                        && plan.constants[s].is_none()
                        && node.inputs.iter().flatten().filter(|&&t| t == s).count() == 1;
                    if !free {
                        return None;
                    }
                    match Arc::try_unwrap(values.slots[s].take()?) {
                        Ok(t) => Some((j, t)),
                        Err(shared) => {
                            values.slots[s] = Some(shared);
                            None
                        }
                    }
                });
                let inputs: Vec<Option<Arc<Tensor>>> = node
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(j, s)| match (s, &owned) {
                        (Some(_), Some((o, _))) if *o == j => Ok(None),
                        _ => s.map(|s| fetch(values, s)).transpose(),
                    })
                    .collect::<Result<_, _>>()?;
                let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_deref()).collect();
                let out = match (owned, blocked.filter(|b| b.convs[i])) {
                    (Some((j, t)), _) => kernel.run_reusing(&refs, j, t),
                    (None, Some(b)) => {
                        let layouts = Layouts {
                            input: refs[0].is_some_and(blocked::is_blocked),
                            output: b.write[node.outputs[0]],
                            wide: b.wide[node.outputs[0]],
                        };
                        let out = kernel.run_blocked(&refs, None, layouts).map(|(out, _)| out);
                        if let Ok(out) = &out {
                            b.check_written(node.outputs[0], out);
                        }
                        out
                    }
                    (None, None) => kernel.run(&refs),
                }
                .map_err(node_err)?;
                if out.len() > node.outputs.len() {
                    return Err(node_err(OpError::invalid(
                        "kernel returned too many outputs",
                    )));
                }
                Ok(out
                    .into_iter()
                    .map(|t| Arc::new(t.into_standard_layout()))
                    .collect())
            }
            NodeOp::If {
                then_branch,
                else_branch,
            } => {
                let cond = fetch(
                    values,
                    node.inputs[0]
                        .ok_or_else(|| node_err(OpError::invalid("missing condition")))?,
                )?;
                let c = match &*cond {
                    Tensor::Bool(a) if a.len() == 1 => a.iter().next().copied().unwrap_or(false),
                    other => {
                        return Err(node_err(OpError::invalid(format!(
                            "condition must be one bool, got {} {:?}",
                            other.dtype(),
                            other.shape()
                        ))));
                    }
                };
                let branch: &Plan = if c { then_branch } else { else_branch };
                // Outer values the branches read follow the condition, then-branch's first.
                let offset = if c { 1 } else { 1 + then_branch.inputs().len() };
                let mut bound = Values {
                    slots: vec![None; branch.num_values()],
                };
                for (k, info) in branch.inputs().iter().enumerate() {
                    let s = node.inputs[offset + k].expect("outer inputs are always bound");
                    bound.slots[info.slot] = Some(fetch(values, s)?);
                }
                // The branch runs on the same scheduler, every node on its own.
                let scope = Scope {
                    plan: branch,
                    chains: None,
                    profile: None,
                    blocked: None,
                };
                let wanted = branch.outputs();
                let out = self.execute(scope, &bound, None, config, wanted, Capture::Wanted)?;
                wanted.iter().map(|&s| out.fetch(branch, s)).collect()
            }
        }
    }

    /// A slot's value: a constant of the plan or a value of `values`, in NCHW layout
    /// (values kept channel-blocked between convs are converted back).
    pub fn value(&self, values: &Values, slot: Slot) -> Result<Arc<Tensor>, RunError> {
        let v = values.fetch(&self.plan, slot)?;
        match self.blocked.as_ref().filter(|b| b.may[slot]) {
            Some(_) => Ok(blocked::unblock(&v).map_or(v, Arc::new)),
            None => Ok(v),
        }
    }

    /// [`Session::value`], or when `values` lacks the slot (a capture made with
    /// [`Capture::Compact`]), the value recomputed from what `values` holds, which
    /// a run under `config` computed.
    pub fn value_under(
        &self,
        values: &Values,
        config: &Config,
        slot: Slot,
    ) -> Result<Arc<Tensor>, RunError> {
        if self.plan.constants[slot].is_some() || values.get(slot).is_some() {
            return self.value(values, slot);
        }
        let run = self.run_from(values, Some(config), config, &[slot], Capture::Wanted)?;
        self.value(&run, slot)
    }

    fn quantized_weight(
        &self,
        c: usize,
        fq: &FakeQuant,
        weight: &Arc<Tensor>,
    ) -> Result<Arc<Tensor>, RunError> {
        let cal = &self.plan.calibrations[c];
        if let Some(hit) = self
            .weight_cache
            .lock()
            .expect("weight cache lock")
            .get(&c)
            .and_then(|v| v.iter().find(|(k, _)| k == fq))
        {
            return Ok(hit.1.clone());
        }
        let mut t = (**weight).clone();
        let shape = t.shape().to_vec();
        let data = t.as_f32_mut().ok_or_else(|| RunError::Calibration {
            node: cal.name.clone(),
            message: format!(
                "weight is {}, only float tensors can be quantized",
                weight.dtype()
            ),
        })?;
        fq.apply_in_place(data.as_slice_mut().expect("standard layout"), &shape)
            .map_err(|e| RunError::Calibration {
                node: cal.name.clone(),
                message: e.to_string(),
            })?;
        let t = Arc::new(t);
        self.weight_cache
            .lock()
            .expect("weight cache lock")
            .entry(c)
            .or_default()
            .push((fq.clone(), t.clone()));
        Ok(t)
    }
}

/// Converts the blocked values node `j` reads back to NCHW, but those it takes
/// blocked: a conv's data input (see [`Blocked`]), the input of an activation
/// calibration node that quantizes element by element (or is off), and the inputs of
/// a layout-free element-wise node when all of them that are not single constants
/// came blocked.
fn unblock_inputs(plan: &Plan, b: &Blocked, j: usize, values: &mut Values, config: &Config) {
    let node = &plan.nodes[j];
    let blocked_value = |values: &Values, s: Slot| {
        values
            .slots
            .get(s)
            .and_then(|v| v.as_deref())
            .is_some_and(blocked::is_blocked)
    };
    let all_blocked = b.layout_free[j]
        && node.inputs.iter().flatten().all(|&s| {
            crate::layout::single_constant(plan, s) || b.may[s] && blocked_value(values, s)
        });
    for (k, s) in node.inputs.iter().enumerate() {
        let Some(s) = *s else { continue };
        if !b.may[s] {
            continue;
        }
        let takes = match &node.op {
            NodeOp::Calibration(c) => config
                .effective(plan, *c)
                .is_none_or(FakeQuant::is_elementwise),
            NodeOp::Kernel(_) => b.convs[j] && k == 0 || all_blocked,
            NodeOp::If { .. } => false,
        };
        if !takes
            && let Some(t) = values.slots.get(s).and_then(|v| v.as_deref())
            && let Some(u) = blocked::unblock(t)
        {
            values.slots[s] = Some(Arc::new(u));
        }
    }
}

/// Whether `chain` may run as its input's producer's tail: every node of it has to
/// run, and neither its input nor an intermediate value is kept (the chain alone
/// reads its input, by [`Chains::tail_of`]).
fn tail_may_run(chain: &Chain, run_node: &[bool], keep: &[bool]) -> bool {
    chain.nodes.iter().all(|&j| run_node[j])
        && !keep[chain.input]
        && chain.internal.iter().all(|&s| !keep[s])
}

/// Frees `chain`'s side value after the chain ran when the chain was its last reader
/// (the executor frees a node's inputs after it runs, which fused nodes never do).
fn release_side(chain: &Chain, values: &mut Values, keep: &[bool], last_use: &[usize]) {
    if let Some(s) = chain.side
        && !keep[s]
        && chain.nodes.contains(&last_use[s])
    {
        recycle(values.slots[s].take());
    }
}

/// Runs `chain` as one pass when every node of it has to run, none of its
/// intermediate values is kept, and its input is an f32 tensor its operands
/// broadcast to. Returns false, having changed nothing, when the nodes have to run
/// one by one instead.
#[allow(clippy::too_many_arguments)]
fn run_chain(
    plan: &Plan,
    chain: &Chain,
    config: &Config,
    values: &mut Values,
    run_node: &[bool],
    keep: &[bool],
    last_use: &[usize],
) -> bool {
    if !chain.nodes.iter().all(|&j| run_node[j]) || chain.internal.iter().any(|&s| keep[s]) {
        return false;
    }
    let x_slot = chain.input;
    let Some(x) = values.lookup(plan, x_slot) else {
        return false;
    };
    let Tensor::F32(xa) = &*x else {
        return false;
    };
    let shape = xa.shape().to_vec();
    // The side was computed before the chain's first node (`fusion::find_chains`), in
    // this run or the one its values come from.
    let side = match chain.side {
        Some(s) => match values.lookup(plan, s) {
            Some(t) => Some(t),
            None => return false,
        },
        None => None,
    };
    let args = chain.args(|c| config.effective(plan, c), side.as_deref());
    let Some(tail) = args.tail(&shape) else {
        return false;
    };
    // The input may be overwritten when the chain reads it for the last time.
    let free = !keep[x_slot]
        && plan.constants[x_slot].is_none()
        && chain.nodes.contains(&last_use[x_slot])
        && chain.input_readers_within.iter().all(|&k| !run_node[k]);
    // When free, the executor gives up its reference; the buffer is overwritten
    // only if that leaves the chain the one holder.
    let x = if free {
        drop(x);
        values.slots[x_slot]
            .take()
            .expect("the input was fetched from the values above")
    } else {
        x
    };
    let out = match Arc::try_unwrap(x) {
        Ok(Tensor::F32(mut a)) => {
            let d = a
                .as_slice_mut()
                .expect("tensors are kept in standard layout");
            tail.run(None, d);
            a
        }
        Ok(other) => fresh_output(&tail, &other, &shape),
        Err(shared) => fresh_output(&tail, &shared, &shape),
    };
    for &s in &chain.internal {
        values.slots[s] = None;
    }
    values.slots[chain.output] = Some(Arc::new(Tensor::F32(out)));
    true
}

/// A chain's output in a new buffer, reading `x` (an f32 tensor of `shape`).
fn fresh_output(tail: &Tail, x: &Tensor, shape: &[usize]) -> ArrayD<f32> {
    let Tensor::F32(xa) = x else {
        unreachable!("chains run on f32 inputs only")
    };
    let src = xa.as_slice().expect("tensors are kept in standard layout");
    let mut out = crate::buffers::take::<f32>(src.len());
    tail.run(Some(src), &mut out);
    ArrayD::from_shape_vec(IxDyn(shape), out).expect("same element count as the input")
}

/// Gives a dropped value's buffer to the thread's pool when nothing else holds it
/// (values shared with a capture or a caller stay alive and untouched).
fn recycle(value: Option<Arc<Tensor>>) {
    if let Some(t) = value.and_then(|a| Arc::try_unwrap(a).ok()) {
        crate::buffers::give(t);
    }
}

#[cfg(test)]
mod tests {
    use hmct_ir::testing::build::{float_value, int_attr, ints_attr, model, named_value, node};
    use hmct_tensor::tensor_to_proto;

    use super::*;
    use crate::fake_quant::QType;

    /// One session switching a weight calibration node between settings (float, the
    /// file's int8, int8 at half the thresholds, int4) gives what a fresh session
    /// gives for each: kernels that keep what they derive from a weight (packed
    /// panels) per weight tensor never serve one setting's weight to another. The
    /// three convs take the channel-lanes 3x3 kernel, the channel-lanes pointwise
    /// kernel and the packed GEMM.
    #[test]
    fn switching_a_weight_setting_never_serves_a_stale_packed_weight() {
        let (h, w) = (32usize, 32usize);
        let values = |n: usize, seed: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let weight = |name: &str, shape: &[usize], seed| {
            let t = Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap();
            tensor_to_proto(&t, name)
        };
        let conv = |name: &str, x: &str, wt: &str, y: &str, k: i64| {
            let mut n = node(name, "Conv", &[x, wt], &[y]);
            n.attribute.push(ints_attr("pads", vec![k / 2; 4]));
            n.attribute.push(int_attr("group", 1));
            n
        };
        let proto = model(
            vec![float_value("x", &[1, 32, h as i64, w as i64])],
            vec![
                conv("c3", "x", "w3", "a", 3),
                node("r", "Relu", &["a"], &["b"]),
                conv("c1", "b", "w1", "c", 1),
                conv("c2", "c", "w2", "y", 1),
            ],
            vec![
                weight("w3", &[64, 32, 3, 3], 1),
                weight("w1", &[64, 64, 1, 1], 2),
                weight("w2", &[128, 64, 1, 1], 3),
            ],
            vec![named_value("y")],
        );
        let m = hmct_ir::Model::from_proto(proto, None).unwrap();
        let m = hmct_ir::testing::calibrate_for_tests(m, 4.0).unwrap();
        let x = Tensor::from_f32(&[1, 32, h, w], values(32 * h * w, 7)).unwrap();
        let plan = crate::plan_model(&m).unwrap();
        let weights: Vec<usize> = (0..plan.calibrations.len())
            .filter(|&c| plan.calibrations[c].is_weight)
            .collect();
        assert_eq!(weights.len(), 3);
        let setting = |c: usize, scale: f32, bits: u32| {
            let FakeQuant::Int(file) = &plan.calibrations[c].file.fake_quant else {
                panic!("an int8 weight node");
            };
            let thresholds: Vec<f32> = file.scales().iter().map(|s| s * 127.0 * scale).collect();
            let qtype = QType::Int { bits, signed: true };
            Override::Set(FakeQuant::from_thresholds(qtype, &thresholds, Some(0)).unwrap())
        };
        let mut configs = vec![Config::float(), Config::calibrated()];
        for &(scale, bits) in &[(0.5, 8), (1.0, 4), (0.25, 8)] {
            let mut cfg = Config::calibrated();
            for &c in &weights {
                cfg = cfg.with(c, setting(c, scale, bits));
            }
            configs.push(cfg);
        }
        configs.push(Config::calibrated());
        configs.push(Config::float());
        let kept = Session::new(crate::plan_model(&m).unwrap(), 2).unwrap();
        let mut outputs = Vec::new();
        for cfg in &configs {
            let got = kept.run(&[("x", x.clone())], cfg).unwrap();
            let fresh = Session::new(crate::plan_model(&m).unwrap(), 2).unwrap();
            let want = fresh.run(&[("x", x.clone())], cfg).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
            };
            assert_eq!(bits(&got[0]), bits(&want[0]), "{cfg:?}");
            outputs.push(bits(&got[0]));
        }
        // The settings differ in their results, so a stale weight would show.
        for i in 0..5 {
            assert_ne!(outputs[i], outputs[i + 1], "settings {i} and {}", i + 1);
        }
    }

    /// Outputs given back with [`Session::recycle`] and [`Values::recycle`] hold the
    /// previous run's values when the next run takes their buffers: every kernel that
    /// takes one must write all of it, so a run after a recycle gives what a fresh
    /// session on another thread (another pool) gives. A conv, a padded max pool and a
    /// Relu, outputs above the pool's minimum, starting from pooled buffers of a value
    /// no kernel computes (a max pool leaving a plane unwritten fails it).
    #[test]
    fn recycled_outputs_never_leak_into_later_runs() {
        let (c, h, w) = (16usize, 64usize, 64usize);
        let values = |n: usize, seed: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let mut conv = node("c", "Conv", &["x", "w"], &["a"]);
        conv.attribute.push(ints_attr("pads", vec![1; 4]));
        let mut pool = node("p", "MaxPool", &["a"], &["b"]);
        pool.attribute.push(ints_attr("kernel_shape", vec![3, 3]));
        pool.attribute.push(ints_attr("strides", vec![2, 2]));
        pool.attribute.push(ints_attr("pads", vec![1; 4]));
        let wt = Tensor::from_f32(&[c, c, 3, 3], values(c * c * 9, 1)).unwrap();
        let proto = model(
            vec![float_value("x", &[1, c as i64, h as i64, w as i64])],
            vec![conv, pool, node("r", "Relu", &["b"], &["y"])],
            vec![tensor_to_proto(&wt, "w")],
            vec![named_value("a"), named_value("y")],
        );
        let m = hmct_ir::Model::from_proto(proto, None).unwrap();
        let input = |seed| Tensor::from_f32(&[1, c, h, w], values(c * h * w, seed)).unwrap();
        let bits = |ts: &[Arc<Tensor>]| -> Vec<Vec<u32>> {
            ts.iter()
                .map(|t| t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect())
                .collect()
        };
        let session = Session::new(crate::plan_model(&m).unwrap(), 1).unwrap();
        let cfg = Config::float();
        // Stale values that no kernel computes, in buffers of the outputs' sizes (fresh
        // buffers hold NaN in tests, which an unwritten output would keep forever).
        for n in [c * h * w, c * h * w / 4, c * h * w / 4] {
            crate::buffers::give_vec(vec![7.0f32; n]);
        }
        for seed in [3, 4, 5] {
            // On a thread of its own: the pool is per thread, and this one's holds
            // the recycled buffers.
            let want = std::thread::scope(|s| {
                s.spawn(|| {
                    let fresh = Session::new(crate::plan_model(&m).unwrap(), 1).unwrap();
                    bits(&fresh.run(&[("x", input(seed))], &cfg).unwrap())
                })
                .join()
                .unwrap()
            });
            let got = session.run(&[("x", input(seed))], &cfg).unwrap();
            assert_eq!(bits(&got), want, "input {seed}");
            session.recycle(got);
            let bound = session.bind_inputs(&[("x", input(seed + 10))]).unwrap();
            let wanted = session.plan().outputs().to_vec();
            session
                .run_from(&bound, None, &cfg, &wanted, Capture::All)
                .unwrap()
                .recycle();
        }
    }
}
