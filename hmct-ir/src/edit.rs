//! Batch edits of calibration nodes, the `modify` command's library side: the IR
//! recipes of ../shared/seeds/001 (set a node's, an op type's, every activation's or
//! a sub-graph's precision; set a threshold; switch a node) as data.
//!
//! Precision edits on regular nodes change their *activation* (feature) input
//! calibration nodes, as the seed's recipes do (`input_calib.tensor_type ==
//! "feature"`); weights change only through [`Edit::AllQType`] with
//! [`TensorType::Weight`] or by naming the weight calibration node. Switching a
//! regular node changes all its input calibration nodes (HZCALIBRATION.md §5).

use std::collections::{BTreeSet, HashSet};

use crate::suggest::{close_matches, did_you_mean};
use crate::{IrError, Model, NodeId, QType, TensorType, input_calibrations};

/// One edit. Names may be regular nodes or calibration nodes (see each variant).
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    /// `qtype` of the named nodes: a calibration node itself, a regular node its
    /// activation input calibration nodes.
    NodesQType { nodes: Vec<String>, qtype: QType },
    /// `qtype` of every calibration node of a kind (`None`: every calibration node).
    AllQType {
        kind: Option<TensorType>,
        qtype: QType,
    },
    /// `qtype` of the activation input calibration nodes of every node of these op types.
    OpTypesQType { op_types: Vec<String>, qtype: QType },
    /// `thresholds` of a calibration node (one value, or one per channel).
    Threshold { node: String, thresholds: Vec<f32> },
    /// `switch` of a calibration node, or of all input calibration nodes of a
    /// regular node.
    Switch { node: String, on: bool },
    /// `qtype` of every activation calibration node in the sub-graph between
    /// `inputs` and `outputs` (node or tensor names), see [`subgraph_nodes`].
    SubgraphQType {
        inputs: Vec<String>,
        outputs: Vec<String>,
        qtype: QType,
    },
}

/// One attribute of one calibration node that an edit changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub node: String,
    /// `qtype`, `thresholds` or `switch`.
    pub attribute: &'static str,
    pub before: String,
    pub after: String,
}

/// What [`apply_edits`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EditReport {
    /// Changed attributes, by node in graph order.
    pub changes: Vec<Change>,
    /// Calibration nodes an edit selected that already had the requested values.
    pub unchanged: Vec<String>,
}

/// Why a batch of edits was refused. Nothing is changed when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("no node named '{name}'{}", did_you_mean(.suggestions))]
    UnknownNode {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("no node or tensor named '{name}'{}", did_you_mean(.suggestions))]
    UnknownNodeOrValue {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("no node of op type '{op_type}' in the model{}", did_you_mean(.suggestions))]
    UnknownOpType {
        op_type: String,
        suggestions: Vec<String>,
    },
    #[error("{0}")]
    NoCalibration(String),
    #[error(
        "'{node}' is a regular node; thresholds belong to calibration nodes (its input calibration nodes: {})",
        list_or_none(.calibrations)
    )]
    ThresholdOnRegular {
        node: String,
        calibrations: Vec<String>,
    },
    #[error(
        "sub-graph: graph input '{graph_input}' reaches output '{output}' without passing through any of the inputs, so the inputs do not enclose the sub-graph (add an input on that path)"
    )]
    NotDominated { output: String, graph_input: String },
    #[error("sub-graph: input '{input}' is not upstream of any of the outputs")]
    InputNotUpstream { input: String },
    #[error("sub-graph: {0}")]
    EmptySubgraph(String),
    #[error(transparent)]
    Ir(#[from] IrError),
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Applies `edits` in order (a later edit wins on the same node) and reports what
/// changed. All or nothing: on error `model` is left as it was.
pub fn apply_edits(model: &mut Model, edits: &[Edit]) -> Result<EditReport, EditError> {
    let mut work = model.clone();
    let mut touched: BTreeSet<NodeId> = BTreeSet::new();
    let before: Vec<Option<Snapshot>> = (0..work.nodes().len())
        .map(|id| snapshot(&work, id))
        .collect();
    for edit in edits {
        let targets = resolve(&work, edit)?;
        for &id in &targets {
            let mut cal = work
                .calibration_mut(id)
                .expect("resolve returns calibration nodes");
            match edit {
                Edit::NodesQType { qtype, .. }
                | Edit::AllQType { qtype, .. }
                | Edit::OpTypesQType { qtype, .. }
                | Edit::SubgraphQType { qtype, .. } => cal.set_qtype(qtype.clone())?,
                Edit::Threshold { thresholds, .. } => cal.set_thresholds(thresholds.clone())?,
                Edit::Switch { on, .. } => cal.set_switch(*on),
            }
        }
        touched.extend(targets);
    }
    let mut report = EditReport::default();
    for id in touched {
        let (Some(old), Some(new)) = (&before[id], snapshot(&work, id)) else {
            continue;
        };
        let name = work.node_name(id).to_string();
        let mut any = false;
        for (attribute, b, a) in [
            ("qtype", &old.qtype, &new.qtype),
            ("thresholds", &old.thresholds, &new.thresholds),
            ("switch", &old.switch, &new.switch),
        ] {
            if b != a {
                any = true;
                report.changes.push(Change {
                    node: name.clone(),
                    attribute,
                    before: b.clone(),
                    after: a.clone(),
                });
            }
        }
        if !any {
            report.unchanged.push(name);
        }
    }
    *model = work;
    Ok(report)
}

struct Snapshot {
    qtype: String,
    thresholds: String,
    switch: String,
}

fn snapshot(model: &Model, id: NodeId) -> Option<Snapshot> {
    let cal = model.calibration(id)?;
    Some(Snapshot {
        qtype: cal.qtype().to_string(),
        thresholds: format!("{:?}", cal.thresholds()),
        switch: if cal.switch_on() { "ON" } else { "OFF" }.into(),
    })
}

/// The calibration nodes `edit` applies to, in graph order.
pub fn resolve(model: &Model, edit: &Edit) -> Result<Vec<NodeId>, EditError> {
    let mut out: BTreeSet<NodeId> = BTreeSet::new();
    match edit {
        Edit::NodesQType { nodes, .. } => {
            for name in nodes {
                let id = node_by_name(model, name)?;
                if model.is_calibration(id) {
                    out.insert(id);
                    continue;
                }
                let found = activation_inputs(model, id);
                if found.is_empty() {
                    return Err(EditError::NoCalibration(format!(
                        "node '{name}' has no activation input calibration nodes (input calibration nodes: {})",
                        list_or_none(&names(model, &input_calibrations(model, id)))
                    )));
                }
                out.extend(found);
            }
        }
        Edit::AllQType { kind, .. } => {
            out.extend(
                model
                    .calibration_nodes()
                    .into_iter()
                    .filter(|&id| kind.is_none_or(|k| tensor_type(model, id) == k)),
            );
        }
        Edit::OpTypesQType { op_types, .. } => {
            for op in op_types {
                let ids = model.nodes_of_type(op);
                if ids.is_empty() {
                    let types: Vec<&str> = model.type2nodes().keys().map(String::as_str).collect();
                    return Err(EditError::UnknownOpType {
                        op_type: op.clone(),
                        suggestions: close_matches(op, types),
                    });
                }
                let found: Vec<NodeId> = ids
                    .iter()
                    .flat_map(|&id| activation_inputs(model, id))
                    .collect();
                out.extend(&found);
                if found.is_empty() {
                    return Err(EditError::NoCalibration(format!(
                        "no {op} node has activation input calibration nodes"
                    )));
                }
            }
        }
        Edit::Threshold { node, .. } => {
            let id = node_by_name(model, node)?;
            if !model.is_calibration(id) {
                return Err(EditError::ThresholdOnRegular {
                    node: node.clone(),
                    calibrations: names(model, &input_calibrations(model, id)),
                });
            }
            out.insert(id);
        }
        Edit::Switch { node, .. } => {
            let id = node_by_name(model, node)?;
            if model.is_calibration(id) {
                out.insert(id);
            } else {
                let found = input_calibrations(model, id);
                if found.is_empty() {
                    return Err(EditError::NoCalibration(format!(
                        "node '{node}' has no input calibration nodes to switch"
                    )));
                }
                out.extend(found);
            }
        }
        Edit::SubgraphQType {
            inputs, outputs, ..
        } => {
            for id in subgraph_nodes(model, inputs, outputs)? {
                if model.is_calibration(id) {
                    if tensor_type(model, id) == TensorType::Feature {
                        out.insert(id);
                    }
                } else {
                    out.extend(activation_inputs(model, id));
                }
            }
            if out.is_empty() {
                return Err(EditError::EmptySubgraph(
                    "no activation calibration nodes between the inputs and the outputs".into(),
                ));
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// The nodes of the sub-graph that ends at `outputs` and starts at `inputs`: every
/// node met walking upstream from the outputs, stopping at the inputs. A name is a
/// node (included, with its own inputs outside the sub-graph) or else a tensor (its
/// producer is outside when it is an input, inside when it is an output). The inputs
/// must cut every path from a graph input to the outputs; paths from constants are
/// part of the sub-graph.
pub fn subgraph_nodes(
    model: &Model,
    inputs: &[String],
    outputs: &[String],
) -> Result<Vec<NodeId>, EditError> {
    if inputs.is_empty() || outputs.is_empty() {
        return Err(EditError::EmptySubgraph(
            "give at least one input and one output".into(),
        ));
    }
    let mut stop_nodes: HashSet<NodeId> = HashSet::new();
    let mut stop_values: HashSet<&str> = HashSet::new();
    for name in inputs {
        match node_or_value(model, name)? {
            Some(id) => {
                stop_nodes.insert(id);
            }
            None => {
                stop_values.insert(name);
            }
        }
    }
    let mut inside: BTreeSet<NodeId> = BTreeSet::new();
    let mut reached: HashSet<&str> = HashSet::new();
    for output in outputs {
        let start = match node_or_value(model, output)? {
            Some(id) => Some(id),
            None if stop_values.contains(output.as_str()) => {
                reached.insert(output);
                None
            }
            None => match model.producer(output) {
                Some(id) => Some(id),
                None if model.is_constant(output) => None,
                None => {
                    return Err(EditError::NotDominated {
                        output: output.clone(),
                        graph_input: output.clone(),
                    });
                }
            },
        };
        let mut stack: Vec<NodeId> = start.into_iter().collect();
        while let Some(id) = stack.pop() {
            if !inside.insert(id) {
                continue;
            }
            if stop_nodes.contains(&id) {
                reached.insert(model.node_name(id));
                continue;
            }
            for value in model.node(id).input.iter().filter(|v| !v.is_empty()) {
                if stop_values.contains(value.as_str()) {
                    reached.insert(value);
                    continue;
                }
                match model.producer(value) {
                    Some(p) => stack.push(p),
                    None if model.is_constant(value) => {}
                    None => {
                        return Err(EditError::NotDominated {
                            output: output.clone(),
                            graph_input: value.clone(),
                        });
                    }
                }
            }
        }
    }
    if let Some(input) = inputs.iter().find(|i| !reached.contains(i.as_str())) {
        return Err(EditError::InputNotUpstream {
            input: input.clone(),
        });
    }
    Ok(inside.into_iter().collect())
}

fn tensor_type(model: &Model, id: NodeId) -> TensorType {
    model
        .calibration(id)
        .map_or(TensorType::Feature, |c| c.tensor_type())
}

fn activation_inputs(model: &Model, id: NodeId) -> Vec<NodeId> {
    input_calibrations(model, id)
        .into_iter()
        .filter(|&c| tensor_type(model, c) == TensorType::Feature)
        .collect()
}

fn names(model: &Model, ids: &[NodeId]) -> Vec<String> {
    ids.iter()
        .map(|&id| model.node_name(id).to_string())
        .collect()
}

fn node_by_name(model: &Model, name: &str) -> Result<NodeId, EditError> {
    model
        .node_mappings()
        .get(name)
        .copied()
        .ok_or_else(|| EditError::UnknownNode {
            name: name.to_string(),
            suggestions: close_matches(name, model.node_mappings().keys().map(String::as_str)),
        })
}

/// `Some(node)` when `name` names a node, `None` when it names a tensor.
fn node_or_value(model: &Model, name: &str) -> Result<Option<NodeId>, EditError> {
    if let Some(&id) = model.node_mappings().get(name) {
        return Ok(Some(id));
    }
    let known = model.producer(name).is_some()
        || model.inputs().iter().any(|i| i == name)
        || model.is_constant(name);
    if known {
        return Ok(None);
    }
    let values = model.nodes().iter().flat_map(|n| n.output.iter());
    let candidates: Vec<&str> = model
        .node_mappings()
        .keys()
        .chain(values)
        .chain(model.inputs())
        .map(String::as_str)
        .collect();
    Err(EditError::UnknownNodeOrValue {
        name: name.to_string(),
        suggestions: close_matches(name, candidates),
    })
}
