//! Compiling a graph into an executable plan: value slots, kernels chosen per node,
//! constants (initializers, `Constant` nodes and everything computable from them)
//! folded once, and the dependency structure that incremental re-execution walks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use hmct_proto::onnx::{GraphProto, NodeProto, ValueInfoProto};
use hmct_tensor::{DType, Tensor, tensor_from_proto};

use crate::fake_quant::FakeQuant;
use crate::ops::{self, Attrs, Kernel, NodeSpec, OpError};

/// Index of a value (tensor) in a plan.
pub type Slot = usize;

/// What a calibration node does when it is ON, and whether the file has it ON.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationSetting {
    pub switch_on: bool,
    pub fake_quant: FakeQuant,
}

/// Tells the planner how each `HzCalibration` node of the top-level graph quantizes.
/// Called with the node's index in `graph.node` (the hmct-ir `NodeId`).
pub type CalibrationResolver<'a> =
    dyn Fn(usize, &NodeProto) -> Result<CalibrationSetting, String> + 'a;

/// Errors while building a plan. Each names the node (or value) and what is wrong;
/// for [`PlanError::Node`] that is the kernel's error, its `source`.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("node '{node}' ({op_type}, opset {opset})")]
    Node {
        node: String,
        op_type: String,
        opset: i64,
        #[source]
        source: OpError,
    },
    #[error("node '{node}' (HzCalibration): {message}")]
    Calibration { node: String, message: String },
    #[error("node '{node}' reads '{value}', which no node, initializer or graph input produces")]
    Dangling { node: String, value: String },
    #[error("value '{value}' is produced twice (by '{first}' and '{second}')")]
    DuplicateOutput {
        value: String,
        first: String,
        second: String,
    },
    #[error("graph output '{0}' is never produced")]
    MissingOutput(String),
    #[error("initializer '{name}': {message}")]
    Initializer { name: String, message: String },
    #[error("the graph is not in topological order or has a cycle at node '{0}'")]
    NotTopological(String),
}

pub(crate) enum NodeOp {
    Kernel(Box<dyn Kernel>),
    /// Index into `Plan::calibrations`.
    Calibration(usize),
    If {
        then_branch: Box<Plan>,
        else_branch: Box<Plan>,
    },
}

/// One executable node.
pub struct PlanNode {
    pub name: String,
    pub op_type: String,
    pub opset: i64,
    pub inputs: Vec<Option<Slot>>,
    pub outputs: Vec<Slot>,
    pub(crate) op: NodeOp,
}

impl PlanNode {
    /// The kernel this node runs, unless it is a calibration or If node.
    pub fn kernel(&self) -> Option<&dyn Kernel> {
        match &self.op {
            NodeOp::Kernel(k) => Some(k.as_ref()),
            _ => None,
        }
    }
}

/// A calibration node of the plan.
#[derive(Clone, Debug)]
pub struct PlanCalibration {
    pub name: String,
    /// Index of the node in `Plan::nodes`.
    pub node: usize,
    /// Index of the node in the source `graph.node` list (hmct-ir `NodeId`).
    pub graph_index: usize,
    pub input: Slot,
    pub output: Slot,
    /// Its input is a constant (a weight calibration node).
    pub is_weight: bool,
    /// What the model file says.
    pub file: CalibrationSetting,
}

/// Declared type of a graph input, for checking what callers pass.
#[derive(Clone, Debug)]
pub struct InputInfo {
    pub name: String,
    pub slot: Slot,
    pub dtype: Option<DType>,
    /// `None` for symbolic or unknown dimensions.
    pub dims: Option<Vec<Option<usize>>>,
}

/// A compiled graph.
pub struct Plan {
    pub(crate) value_names: Vec<String>,
    pub(crate) value_index: HashMap<String, Slot>,
    pub(crate) constants: Vec<Option<Arc<Tensor>>>,
    pub(crate) nodes: Vec<PlanNode>,
    pub(crate) producer: Vec<Option<usize>>,
    pub(crate) inputs: Vec<InputInfo>,
    pub(crate) outputs: Vec<Slot>,
    pub(crate) calibrations: Vec<PlanCalibration>,
    pub(crate) calibration_index: HashMap<String, usize>,
}

/// Options for planning.
pub struct PlanOptions<'a> {
    /// Opset version per domain (`""` for the standard domain).
    pub opsets: HashMap<String, i64>,
    /// Folder of the model file, for external tensor data.
    pub base_dir: Option<&'a Path>,
    /// How calibration nodes quantize; `None` makes every calibration node an error.
    pub calibration: Option<&'a CalibrationResolver<'a>>,
}

/// Normalizes `ai.onnx` to the empty standard domain.
pub fn normalize_domain(d: &str) -> &str {
    if d == "ai.onnx" { "" } else { d }
}

impl Plan {
    /// Compiles `graph`. For a subgraph, names it reads from enclosing scopes become
    /// extra inputs after the declared ones (see [`Plan::inputs`]).
    pub fn build(graph: &GraphProto, options: &PlanOptions) -> Result<Plan, PlanError> {
        Self::build_inner(graph, options, false)
    }

    fn build_inner(
        graph: &GraphProto,
        options: &PlanOptions,
        is_subgraph: bool,
    ) -> Result<Plan, PlanError> {
        let mut plan = Plan {
            value_names: Vec::new(),
            value_index: HashMap::new(),
            constants: Vec::new(),
            nodes: Vec::new(),
            producer: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            calibrations: Vec::new(),
            calibration_index: HashMap::new(),
        };
        plan.add_initializers(graph, options)?;
        plan.add_graph_inputs(graph);
        for graph_index in 0..graph.node.len() {
            plan.add_node(graph, graph_index, options, is_subgraph)?;
        }
        plan.add_graph_outputs(graph, is_subgraph)?;
        Ok(plan)
    }

    fn add_initializers(
        &mut self,
        graph: &GraphProto,
        options: &PlanOptions,
    ) -> Result<(), PlanError> {
        for init in &graph.initializer {
            let t =
                tensor_from_proto(init, options.base_dir).map_err(|e| PlanError::Initializer {
                    name: init.name().to_string(),
                    message: hmct_ir::error_chain(&e),
                })?;
            let s = self.slot(init.name());
            self.constants[s] = Some(Arc::new(t));
        }
        Ok(())
    }

    fn add_graph_inputs(&mut self, graph: &GraphProto) {
        for vi in &graph.input {
            if self.value_index.contains_key(vi.name()) {
                continue; // an initializer with a declared input (IR < 4): a constant
            }
            let slot = self.slot(vi.name());
            self.inputs.push(input_info(vi, slot));
        }
    }

    /// Plans node `graph_index` of `graph`: binds its inputs and outputs, builds its
    /// operation, and folds it when all its inputs are constant.
    fn add_node(
        &mut self,
        graph: &GraphProto,
        graph_index: usize,
        options: &PlanOptions,
        is_subgraph: bool,
    ) -> Result<(), PlanError> {
        let node = &graph.node[graph_index];
        let domain = normalize_domain(node.domain());
        let std_opset = options.opsets.get("").copied().unwrap_or(21);
        let opset = options
            .opsets
            .get(domain)
            .copied()
            .unwrap_or(if domain.is_empty() { std_opset } else { 1 });
        let mut inputs = self.node_inputs(graph, graph_index, is_subgraph)?;
        let outputs = self.node_outputs(node)?;
        let node_err = |source| PlanError::Node {
            node: node.name().to_string(),
            op_type: node.op_type().to_string(),
            opset,
            source,
        };

        if node.op_type() == hmct_ir::CALIBRATION_OP && !hmct_ir::is_calibration_node(node) {
            return Err(PlanError::Calibration {
                node: node.name().to_string(),
                message: format!(
                    "domain '{domain}' is neither '{}' nor empty, so this is not a calibration node",
                    hmct_ir::CALIBRATION_DOMAIN
                ),
            });
        }
        let op = if hmct_ir::is_calibration_node(node) {
            self.calibration_op(node, graph_index, &inputs, &outputs, options)?
        } else if node.op_type() == "If" && domain.is_empty() {
            self.if_op(node, &mut inputs, options, is_subgraph, &node_err)?
        } else {
            let present: Vec<bool> = node.input.iter().map(|n| !n.is_empty()).collect();
            let consts: Vec<Option<&Tensor>> = inputs
                .iter()
                .map(|s| s.and_then(|s| self.constants[s].as_deref()))
                .collect();
            let stable: Vec<bool> = inputs
                .iter()
                .map(|s| s.is_some_and(|s| self.is_stable(s)))
                .collect();
            let spec = NodeSpec {
                name: node.name(),
                op_type: node.op_type(),
                domain,
                opset,
                attrs: Attrs::new(&node.attribute),
                num_inputs: node.input.len(),
                inputs_present: &present,
                num_outputs: node.output.len(),
                const_inputs: &consts,
                stable_inputs: &stable,
            };
            let kernel = ops::build_kernel(&spec).map_err(node_err)?;
            // Fold: every input constant (and at least one input, or a Constant node).
            let all_const = consts
                .iter()
                .zip(&inputs)
                .all(|(c, s)| s.is_none() || c.is_some());
            if all_const && is_foldable(node.op_type()) {
                let results = kernel.run(&consts).map_err(node_err)?;
                for (i, s) in outputs.iter().enumerate() {
                    if let Some(t) = results.get(i) {
                        self.constants[*s] = Some(Arc::new(t.clone()));
                    }
                }
                // Outputs the kernel left out stay absent; a reader then fails at
                // plan time as dangling.
                return Ok(());
            }
            NodeOp::Kernel(kernel)
        };
        let idx = self.nodes.len();
        for &s in &outputs {
            self.producer[s] = Some(idx);
        }
        self.nodes.push(PlanNode {
            name: node.name().to_string(),
            op_type: node.op_type().to_string(),
            opset,
            inputs,
            outputs,
            op,
        });
        Ok(())
    }

    /// The slots node `graph_index` reads (`None` for omitted inputs). In a subgraph, a
    /// name no earlier node, initializer or input gives is read from an enclosing scope.
    fn node_inputs(
        &mut self,
        graph: &GraphProto,
        graph_index: usize,
        is_subgraph: bool,
    ) -> Result<Vec<Option<Slot>>, PlanError> {
        let node = &graph.node[graph_index];
        let mut inputs = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            match self.value_index.get(name.as_str()) {
                Some(&s)
                    if self.constants[s].is_some()
                        || self.producer[s].is_some()
                        || self.is_input(s) =>
                {
                    inputs.push(Some(s))
                }
                _ if is_subgraph => inputs.push(Some(self.outer_input(name))),
                _ => {
                    if graph.node[graph_index + 1..]
                        .iter()
                        .any(|n| n.output.contains(name))
                    {
                        return Err(PlanError::NotTopological(node.name().to_string()));
                    }
                    return Err(PlanError::Dangling {
                        node: node.name().to_string(),
                        value: name.clone(),
                    });
                }
            }
        }
        Ok(inputs)
    }

    /// New slots for the values `node` writes; an omitted optional output gets a
    /// private slot nobody reads.
    fn node_outputs(&mut self, node: &NodeProto) -> Result<Vec<Slot>, PlanError> {
        let mut outputs = Vec::with_capacity(node.output.len());
        for name in &node.output {
            if name.is_empty() {
                let s = self.fresh_slot(format!("{}:unused{}", node.name(), outputs.len()));
                outputs.push(s);
                continue;
            }
            if let Some(&s) = self.value_index.get(name.as_str()) {
                let first = match self.producer[s] {
                    Some(p) => self.nodes[p].name.clone(),
                    None => "an initializer or graph input".to_string(),
                };
                return Err(PlanError::DuplicateOutput {
                    value: name.clone(),
                    first,
                    second: node.name().to_string(),
                });
            }
            outputs.push(self.slot(name));
        }
        Ok(outputs)
    }

    /// A calibration node: its setting from the resolver, registered in
    /// `calibrations`.
    fn calibration_op(
        &mut self,
        node: &NodeProto,
        graph_index: usize,
        inputs: &[Option<Slot>],
        outputs: &[Slot],
        options: &PlanOptions,
    ) -> Result<NodeOp, PlanError> {
        let resolver = options.calibration.ok_or_else(|| PlanError::Calibration {
            node: node.name().to_string(),
            message: "calibration nodes are not allowed here".into(),
        })?;
        let input = match inputs.first() {
            Some(Some(s)) => *s,
            _ => {
                return Err(PlanError::Calibration {
                    node: node.name().to_string(),
                    message: "has no input".into(),
                });
            }
        };
        let file = resolver(graph_index, node).map_err(|message| PlanError::Calibration {
            node: node.name().to_string(),
            message,
        })?;
        let index = self.calibrations.len();
        self.calibration_index
            .insert(node.name().to_string(), index);
        self.calibrations.push(PlanCalibration {
            name: node.name().to_string(),
            node: self.nodes.len(),
            graph_index,
            input,
            output: outputs[0],
            is_weight: self.constants[input].is_some(),
            file,
        });
        Ok(NodeOp::Calibration(index))
    }

    /// An If node: both branches planned as subgraphs, and the outer values they read
    /// appended to `inputs` (then-branch's first).
    fn if_op(
        &mut self,
        node: &NodeProto,
        inputs: &mut Vec<Option<Slot>>,
        options: &PlanOptions,
        is_subgraph: bool,
        node_err: &dyn Fn(OpError) -> PlanError,
    ) -> Result<NodeOp, PlanError> {
        let attrs = Attrs::new(&node.attribute);
        let branch = |name: &str| -> Result<Box<Plan>, PlanError> {
            let g = attrs
                .graph(name)
                .map_err(node_err)?
                .ok_or_else(|| node_err(OpError::invalid(format!("missing attribute '{name}'"))))?;
            let sub_options = PlanOptions {
                opsets: options.opsets.clone(),
                base_dir: options.base_dir,
                calibration: None,
            };
            Ok(Box::new(Plan::build_inner(g, &sub_options, true)?))
        };
        let then_branch = branch("then_branch")?;
        let else_branch = branch("else_branch")?;
        for sub in [&then_branch, &else_branch] {
            for info in &sub.inputs {
                let s = match self.value_index.get(info.name.as_str()) {
                    Some(&s) => s,
                    None if is_subgraph => self.outer_input(&info.name),
                    None => {
                        return Err(PlanError::Dangling {
                            node: node.name().to_string(),
                            value: info.name.clone(),
                        });
                    }
                };
                inputs.push(Some(s));
            }
        }
        Ok(NodeOp::If {
            then_branch,
            else_branch,
        })
    }

    fn add_graph_outputs(
        &mut self,
        graph: &GraphProto,
        is_subgraph: bool,
    ) -> Result<(), PlanError> {
        for vi in &graph.output {
            let s = match self.value_index.get(vi.name()) {
                Some(&s) => s,
                None if is_subgraph => self.outer_input(vi.name()),
                None => return Err(PlanError::MissingOutput(vi.name().to_string())),
            };
            self.outputs.push(s);
        }
        Ok(())
    }

    /// A subgraph's read of `name` from an enclosing scope: an extra input.
    fn outer_input(&mut self, name: &str) -> Slot {
        let s = self.slot(name);
        self.inputs.push(InputInfo {
            name: name.to_string(),
            slot: s,
            dtype: None,
            dims: None,
        });
        s
    }

    fn slot(&mut self, name: &str) -> Slot {
        if let Some(&s) = self.value_index.get(name) {
            return s;
        }
        let s = self.fresh_slot(name.to_string());
        self.value_index.insert(name.to_string(), s);
        s
    }

    fn fresh_slot(&mut self, name: String) -> Slot {
        self.value_names.push(name);
        self.constants.push(None);
        self.producer.push(None);
        self.value_names.len() - 1
    }

    fn is_input(&self, s: Slot) -> bool {
        self.inputs.iter().any(|i| i.slot == s)
    }

    /// Runtime inputs in order: declared graph inputs without initializers, then (for
    /// subgraphs) the values read from enclosing scopes.
    pub fn inputs(&self) -> &[InputInfo] {
        &self.inputs
    }

    /// The graph inputs as specs for reading input files (e.g. a calibration-data
    /// folder with `hmct_tensor::Dataset`).
    pub fn input_specs(&self) -> Vec<hmct_tensor::InputSpec> {
        self.inputs
            .iter()
            .map(|i| hmct_tensor::InputSpec {
                name: i.name.clone(),
                dtype: i.dtype,
                dims: i.dims.clone(),
            })
            .collect()
    }

    /// Graph output slots in order.
    pub fn outputs(&self) -> &[Slot] {
        &self.outputs
    }

    /// Names of the graph outputs in order.
    pub fn output_names(&self) -> Vec<&str> {
        self.outputs
            .iter()
            .map(|&s| self.value_names[s].as_str())
            .collect()
    }

    /// The slot of a named value.
    pub fn value(&self, name: &str) -> Option<Slot> {
        self.value_index.get(name).copied()
    }

    /// The name of a slot.
    pub fn value_name(&self, slot: Slot) -> &str {
        &self.value_names[slot]
    }

    /// Number of value slots.
    pub fn num_values(&self) -> usize {
        self.value_names.len()
    }

    /// The executable nodes in topological order.
    pub fn nodes(&self) -> &[PlanNode] {
        &self.nodes
    }

    /// The index of the node named `name` in [`Plan::nodes`].
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The calibration nodes, in graph order.
    pub fn calibrations(&self) -> &[PlanCalibration] {
        &self.calibrations
    }

    /// The index of a calibration node by name.
    pub fn calibration(&self, name: &str) -> Option<usize> {
        self.calibration_index.get(name).copied()
    }

    /// Whether a slot's value is the output of a weight calibration node: a constant
    /// function of the node's setting, which a session computes once per setting and
    /// keeps (so it is recomputed from that store rather than read from a caller's
    /// values, see [`NodeSpec::stable_inputs`]).
    pub(crate) fn is_weight_calibration_output(&self, slot: Slot) -> bool {
        self.constants[slot].is_none()
            && self.producer[slot].is_some_and(|p| {
                matches!(self.nodes[p].op, NodeOp::Calibration(c) if self.calibrations[c].is_weight)
            })
    }

    /// A constant, or a weight calibration node's output.
    fn is_stable(&self, slot: Slot) -> bool {
        self.constants[slot].is_some() || self.is_weight_calibration_output(slot)
    }

    /// The folded constant held in a slot, if it is one.
    pub fn constant(&self, slot: Slot) -> Option<&Arc<Tensor>> {
        self.constants[slot].as_ref()
    }

    /// The node producing a slot (None for inputs and constants).
    pub fn producer(&self, slot: Slot) -> Option<usize> {
        if self.constants[slot].is_some() {
            None
        } else {
            self.producer[slot]
        }
    }
}

/// Ops whose outputs depend only on their inputs, so constant inputs can be folded.
fn is_foldable(op_type: &str) -> bool {
    !matches!(
        op_type,
        "RandomNormal" | "RandomUniform" | "RandomNormalLike" | "RandomUniformLike" | "Multinomial"
    )
}

fn input_info(vi: &ValueInfoProto, slot: Slot) -> InputInfo {
    use hmct_proto::onnx::tensor_shape_proto::dimension::Value;
    use hmct_proto::onnx::type_proto::Value as TypeValue;
    let tensor_type = vi.r#type.as_ref().and_then(|t| match &t.value {
        Some(TypeValue::TensorType(tt)) => Some(tt),
        _ => None,
    });
    let dtype = tensor_type.and_then(|tt| DType::from_onnx(tt.elem_type()));
    let dims = tensor_type.and_then(|tt| tt.shape.as_ref()).map(|shape| {
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(Value::DimValue(v)) if *v > 0 => Some(*v as usize),
                _ => None,
            })
            .collect()
    });
    InputInfo {
        name: vi.name().to_string(),
        slot,
        dtype,
        dims,
    }
}
