//! Which calibration nodes belong to which regular node (HZCALIBRATION.md §5).

use std::collections::{HashSet, VecDeque};

use crate::{Model, NodeId};

/// Ops the calibration search passes through: they move or select values without
/// changing the quantization grid, so the calibration node before them still
/// describes their output.
pub const SKIPPABLE_OPS: [&str; 11] = [
    "MaxPool",
    "GlobalMaxPool",
    "Relu",
    "Clip",
    "Reshape",
    "Transpose",
    "ReduceMax",
    "Split",
    "Slice",
    "Gather",
    "ScatterND",
];

/// True for an op in [`SKIPPABLE_OPS`].
pub fn is_skippable(op_type: &str) -> bool {
    SKIPPABLE_OPS.contains(&op_type)
}

/// The calibration node that quantizes input `index` of `node`: the producer of the
/// input if it is a calibration node, searched upwards through the first input of
/// skippable ops. Without an index every input is tried in order and the first hit
/// returned (for ScatterND only input 0, the data).
pub fn find_input_calibration(model: &Model, node: NodeId, index: Option<usize>) -> Option<NodeId> {
    let n = model.nodes().get(node)?;
    match index {
        Some(i) => search_up(model, n.input.get(i)?),
        None if n.op_type() == "ScatterND" => search_up(model, n.input.first()?),
        None => n.input.iter().find_map(|v| search_up(model, v)),
    }
}

fn search_up(model: &Model, value: &str) -> Option<NodeId> {
    let mut value = value;
    // Terminates: each step moves to an earlier node of an acyclic graph.
    loop {
        if value.is_empty() {
            return None;
        }
        let p = model.producer(value)?;
        if model.is_calibration(p) {
            return Some(p);
        }
        let producer = model.node(p);
        if !is_skippable(producer.op_type()) {
            return None;
        }
        value = producer.input.first()?;
    }
}

/// The first calibration node found breadth-first among the readers of output
/// `index` of `node` (all outputs without an index), continuing only through
/// skippable ops. A Conv whose output is not a graph output and is read only by an
/// Add searches from that Add (the Conv+Add pair is quantized as one).
pub fn find_output_calibration(
    model: &Model,
    node: NodeId,
    index: Option<usize>,
) -> Option<NodeId> {
    let n = model.nodes().get(node)?;
    let mut start: Vec<&str> = match index {
        Some(i) => vec![n.output.get(i)?.as_str()],
        None => n.output.iter().map(String::as_str).collect(),
    };
    if n.op_type() == "Conv"
        && index.unwrap_or(0) == 0
        && let Some(out) = n.output.first().filter(|o| !model.is_graph_output(o))
        && let [add] = model.consumers(out)
    {
        let add = model.node(*add);
        if add.op_type() == "Add" {
            start = add.output.iter().map(String::as_str).collect();
        }
    }
    let mut queue: VecDeque<&str> = start.into_iter().filter(|v| !v.is_empty()).collect();
    let mut seen: HashSet<NodeId> = HashSet::new();
    while let Some(value) = queue.pop_front() {
        for &c in model.consumers(value) {
            if !seen.insert(c) {
                continue;
            }
            if model.is_calibration(c) {
                return Some(c);
            }
            let consumer = model.node(c);
            if is_skippable(consumer.op_type()) {
                queue.extend(
                    consumer
                        .output
                        .iter()
                        .map(String::as_str)
                        .filter(|v| !v.is_empty()),
                );
            }
        }
    }
    None
}

/// The input calibration nodes of `node`: [`find_input_calibration`] for each input,
/// in input order, each once.
pub fn input_calibrations(model: &Model, node: NodeId) -> Vec<NodeId> {
    let inputs = model.nodes().get(node).map_or(0, |n| n.input.len());
    let mut found = Vec::new();
    for i in 0..inputs {
        if let Some(c) = find_input_calibration(model, node, Some(i))
            && !found.contains(&c)
        {
            found.push(c);
        }
    }
    found
}

/// True for a regular (non-calibration) node with at least one input calibration node.
pub fn is_quantized(model: &Model, node: NodeId) -> bool {
    node < model.nodes().len()
        && !model.is_calibration(node)
        && !input_calibrations(model, node).is_empty()
}

/// All quantized regular nodes, in graph order.
pub fn quantized_nodes(model: &Model) -> Vec<NodeId> {
    (0..model.nodes().len())
        .filter(|&id| is_quantized(model, id))
        .collect()
}

/// The regular nodes that have `calib` among their input calibration nodes (the
/// exact inverse of [`input_calibrations`]): readers of its output, and readers
/// further on through the first input of skippable ops. Graph order.
pub fn quantized_consumers(model: &Model, calib: NodeId) -> Vec<NodeId> {
    let Some(out) = model.nodes().get(calib).and_then(|n| n.output.first()) else {
        return Vec::new();
    };
    let mut found: Vec<NodeId> = Vec::new();
    let mut queue: VecDeque<&str> = VecDeque::from([out.as_str()]);
    let mut seen_values: HashSet<&str> = HashSet::new();
    while let Some(value) = queue.pop_front() {
        if value.is_empty() || !seen_values.insert(value) {
            continue;
        }
        for &c in model.consumers(value) {
            if model.is_calibration(c) {
                continue;
            }
            let consumer = model.node(c);
            // Only explicit inputs count: a subgraph read is not quantized by it.
            if !consumer.input.iter().any(|i| i == value) {
                continue;
            }
            found.push(c);
            if is_skippable(consumer.op_type())
                && consumer.input.first().is_some_and(|i| i == value)
            {
                queue.extend(consumer.output.iter().map(String::as_str));
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The table label of a calibration node: its [`quantized_consumers`] joined with `;`
/// (e.g. `Conv_50;Add_55`).
pub fn consumer_label(model: &Model, calib: NodeId) -> String {
    quantized_consumers(model, calib)
        .into_iter()
        .map(|id| model.node_name(id))
        .collect::<Vec<_>>()
        .join(";")
}

/// The group count of a ConvTranspose that reads `weight` as its weight input (1 when
/// none does, or none is grouped). Such a weight's output channels are spread over
/// axes 0 and 1 (HZCALIBRATION.md §3); a grouped Conv needs nothing of the kind.
pub fn conv_transpose_groups(model: &Model, weight: &str) -> usize {
    model
        .consumers(weight)
        .iter()
        .map(|&id| model.node(id))
        .filter(|n| {
            n.op_type() == "ConvTranspose" && n.input.get(1).map(String::as_str) == Some(weight)
        })
        .filter_map(|n| {
            n.attribute
                .iter()
                .find(|a| a.name() == "group")
                .and_then(|a| a.i)
        })
        .find(|&g| g > 1)
        .map_or(1, |g| usize::try_from(g).unwrap_or(1))
}
