//! Raising a model's default-domain (`ai.onnx`) opset without changing what it
//! computes, for exports that need newer standard ops (QuantizeLinear with `axis`
//! needs 13, 16-bit types 21).
//!
//! Between two opsets most operators change only in the types they accept, or gain
//! an attribute whose default keeps the old meaning; those nodes stay as they are.
//! Every operator whose signature or meaning changed in a way that matters (listed
//! from onnx 1.23.2's schema history: inputs, outputs or attributes that differ
//! between versions, and deprecations) is converted, each step in version order:
//!
//! | op | at | conversion |
//! |---|---|---|
//! | Upsample | 9, 10 | `scales` attribute → input; then Resize-10 (same meaning) |
//! | BatchNormalization | 9, 14 | `spatial = 1` dropped (`0` refused); unused training outputs dropped |
//! | Slice | 10 | `starts`/`ends`/`axes` attributes → inputs |
//! | TopK | 10 | `k` attribute → input |
//! | Clip, Pad | 11 | `min`/`max`, `pads`/`value` attributes → inputs |
//! | Resize | 11 | empty `roi` input; `coordinate_transformation_mode = asymmetric` and, for nearest, `nearest_mode = floor`, which is what Resize-10 computed |
//! | Scatter | 11 | ScatterElements (same meaning; Scatter is deprecated) |
//! | Dropout | 12 | `ratio` attribute → input |
//! | Squeeze, Unsqueeze, Split, ReduceSum | 13 | `axes`/`split` attributes → inputs |
//! | Softmax, LogSoftmax, Hardmax | 13 | the old op works on the input flattened to 2-D at `axis` (default 1); the new one along one axis (default -1): `axis` is written out when it is the last axis, else Flatten → op → Reshape to the input's shape |
//! | RoiAlign | 16 | `coordinate_transformation_mode = output_half_pixel` (the old behaviour) |
//! | Reduce* | 18 | `axes` attribute → input |
//! | Split | 18 | `num_outputs` when the sizes are not given |
//! | GridSample | 20 | mode `bilinear`/`bicubic` → `linear`/`cubic` |
//!
//! Refused with the node named: opsets below 7, Scan-8, BatchNormalization with
//! `spatial = 0` or used training outputs, DFT and GroupNormalization across their
//! changes (20, 21). Subgraphs (If/Loop/Scan bodies) are converted too. The IR
//! version is raised to the one the new opset came with, if it is lower.

use std::collections::HashSet;

use std::collections::HashMap;

use hmct_proto::onnx::{GraphProto, ModelProto, NodeProto, TensorProto, tensor_proto::DataType};

use crate::attr;

/// The oldest opset this module raises; older models predate broadcasting (7).
pub const OLDEST_RAISABLE_OPSET: i64 = 7;

#[derive(Debug, thiserror::Error)]
pub enum OpsetError {
    #[error(
        "default-domain opset {from} is older than {OLDEST_RAISABLE_OPSET}; re-export the model at opset {OLDEST_RAISABLE_OPSET} or later"
    )]
    TooOld { from: i64 },
    #[error("node '{node}' ({op}) cannot be carried from opset {from} to {to}: {why}")]
    Node {
        node: String,
        op: String,
        from: i64,
        to: i64,
        why: String,
    },
}

/// What [`raise_opset`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RaisedOpset {
    pub from: i64,
    pub to: i64,
    /// One line per converted node: `name (op): what changed`.
    pub converted: Vec<String>,
}

/// The IR version each opset came with (onnx.helper.VERSION_TABLE).
fn ir_version_of(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}

/// Raises the default-domain opset of `model` to `to` (nothing when it is at least
/// `to` already), converting the nodes listed in the module doc.
pub fn raise_opset(model: &mut ModelProto, to: i64) -> Result<RaisedOpset, OpsetError> {
    let entry = model
        .opset_import
        .iter()
        .position(|o| matches!(o.domain(), "" | "ai.onnx"));
    // A model without an import is at opset 1 by the standard.
    let from = entry.map_or(1, |i| model.opset_import[i].version());
    if from >= to {
        return Ok(RaisedOpset {
            from,
            to: from,
            converted: Vec::new(),
        });
    }
    if from < OLDEST_RAISABLE_OPSET {
        return Err(OpsetError::TooOld { from });
    }
    let mut names = HashSet::new();
    if let Some(g) = &model.graph {
        collect_names(g, &mut names);
    }
    let mut raiser = Raiser {
        from,
        to,
        names,
        converted: Vec::new(),
    };
    if let Some(g) = model.graph.as_mut() {
        raiser.graph(g)?;
    }
    match entry {
        Some(i) => model.opset_import[i].version = Some(to),
        None => model
            .opset_import
            .push(hmct_proto::onnx::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(to),
            }),
    }
    if model.ir_version() < ir_version_of(to) {
        model.ir_version = Some(ir_version_of(to));
    }
    Ok(RaisedOpset {
        from,
        to,
        converted: raiser.converted,
    })
}

fn collect_names(g: &GraphProto, names: &mut HashSet<String>) {
    for n in &g.node {
        names.insert(n.name().to_string());
        names.extend(n.output.iter().cloned());
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                collect_names(sub, names);
            }
        }
    }
    names.extend(g.initializer.iter().map(|t| t.name().to_string()));
    names.extend(g.input.iter().map(|v| v.name().to_string()));
}

/// Values read anywhere in `g` (its subgraphs included) or returned by it.
fn collect_reads(g: &GraphProto, reads: &mut HashSet<String>) {
    for n in &g.node {
        reads.extend(n.input.iter().cloned());
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                collect_reads(sub, reads);
            }
        }
    }
    reads.extend(g.output.iter().map(|v| v.name().to_string()));
}

struct Raiser {
    from: i64,
    to: i64,
    names: HashSet<String>,
    converted: Vec<String>,
}

/// The new nodes and initializers one node becomes.
#[derive(Default)]
struct Rewrite {
    before: Vec<NodeProto>,
    after: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    what: Vec<String>,
}

impl Raiser {
    fn fresh(&mut self, base: String) -> String {
        let name = std::iter::once(base.clone())
            .chain((1..).map(|k| format!("{base}_{k}")))
            .find(|n| !self.names.contains(n))
            .expect("an unbounded sequence has a free name");
        self.names.insert(name.clone());
        name
    }

    /// True when the op's definition changes at version `v` on the way up.
    fn crosses(&self, v: i64) -> bool {
        self.from < v && v <= self.to
    }

    fn graph(&mut self, g: &mut GraphProto) -> Result<(), OpsetError> {
        let mut reads = HashSet::new();
        collect_reads(g, &mut reads);
        let ranks = declared_ranks(g);
        let old = std::mem::take(&mut g.node);
        for mut node in old {
            for a in &mut node.attribute {
                for sub in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                    self.graph(sub)?;
                }
            }
            if !matches!(node.domain(), "" | "ai.onnx") || crate::is_calibration_node(&node) {
                g.node.push(node);
                continue;
            }
            let mut rw = Rewrite::default();
            self.node(&mut node, &reads, &ranks, &mut rw)
                .map_err(|why| OpsetError::Node {
                    node: node.name().to_string(),
                    op: node.op_type().to_string(),
                    from: self.from,
                    to: self.to,
                    why,
                })?;
            if !rw.what.is_empty() {
                self.converted.push(format!(
                    "{} ({}): {}",
                    node.name(),
                    node.op_type(),
                    rw.what.join("; ")
                ));
            }
            g.initializer.extend(rw.initializers);
            g.node.extend(rw.before);
            g.node.push(node);
            g.node.extend(rw.after);
        }
        Ok(())
    }

    /// A new initializer named after `node`, returned as an input name.
    fn constant(
        &mut self,
        node: &NodeProto,
        what: &str,
        t: TensorProto,
        rw: &mut Rewrite,
    ) -> String {
        let name = self.fresh(format!("{}_{what}", node.name()));
        rw.initializers.push(TensorProto {
            name: Some(name.clone()),
            ..t
        });
        name
    }

    fn ints_input(
        &mut self,
        node: &NodeProto,
        what: &str,
        v: Vec<i64>,
        rw: &mut Rewrite,
    ) -> String {
        let t = TensorProto {
            dims: vec![v.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            int64_data: v,
            ..Default::default()
        };
        self.constant(node, what, t, rw)
    }

    fn float_input(&mut self, node: &NodeProto, what: &str, v: f32, rw: &mut Rewrite) -> String {
        let t = TensorProto {
            data_type: Some(DataType::Float as i32),
            float_data: vec![v],
            ..Default::default()
        };
        self.constant(node, what, t, rw)
    }

    /// Moves the ints attribute `name` to input `index` (inputs in between left
    /// empty), when it is present.
    fn ints_attr_to_input(
        &mut self,
        node: &mut NodeProto,
        name: &str,
        index: usize,
        rw: &mut Rewrite,
    ) -> bool {
        let Some(a) = attr::take(node, name) else {
            return false;
        };
        let values = if a.ints.is_empty() {
            a.i.into_iter().collect()
        } else {
            a.ints
        };
        let input = self.ints_input(node, name, values, rw);
        set_input(node, index, input);
        rw.what.push(format!("{name} attribute -> input"));
        true
    }

    fn node(
        &mut self,
        node: &mut NodeProto,
        reads: &HashSet<String>,
        ranks: &HashMap<String, usize>,
        rw: &mut Rewrite,
    ) -> Result<(), String> {
        let op = node.op_type().to_string();
        match op.as_str() {
            "Upsample" => {
                if self.crosses(9)
                    && let Some(a) = attr::take(node, "scales")
                {
                    let t = TensorProto {
                        dims: vec![a.floats.len() as i64],
                        data_type: Some(DataType::Float as i32),
                        float_data: a.floats,
                        ..Default::default()
                    };
                    let input = self.constant(node, "scales", t, rw);
                    set_input(node, 1, input);
                    rw.what.push("scales attribute -> input".into());
                }
                if self.crosses(10) {
                    node.op_type = Some("Resize".into());
                    rw.what.push("Upsample -> Resize".into());
                    self.resize_10_to_11(node, 10, rw);
                }
            }
            "Resize" => self.resize_10_to_11(node, self.from, rw),
            "BatchNormalization" => {
                if self.crosses(9)
                    && let Some(a) = attr::take(node, "spatial")
                {
                    if a.i() == 0 {
                        return Err(
                            "spatial = 0 (statistics per element) has no equivalent from opset 9"
                                .into(),
                        );
                    }
                    rw.what
                        .push("spatial attribute dropped (1 is the only meaning left)".into());
                }
                if self.crosses(14) && node.output.len() > 1 {
                    if let Some(used) = node.output[1..]
                        .iter()
                        .find(|o| !o.is_empty() && reads.contains(*o))
                    {
                        return Err(format!(
                            "its training output '{used}' is used; from opset 14 those are running statistics"
                        ));
                    }
                    node.output.truncate(1);
                    rw.what.push("unused training outputs dropped".into());
                }
            }
            "Slice" if self.crosses(10) => {
                let starts = attr::take(node, "starts").ok_or("no starts attribute")?;
                let ends = attr::take(node, "ends").ok_or("no ends attribute")?;
                let axes = attr::take(node, "axes");
                let starts = self.ints_input(node, "starts", starts.ints, rw);
                let ends = self.ints_input(node, "ends", ends.ints, rw);
                set_input(node, 1, starts);
                set_input(node, 2, ends);
                if let Some(axes) = axes {
                    let axes = self.ints_input(node, "axes", axes.ints, rw);
                    set_input(node, 3, axes);
                }
                rw.what.push("starts/ends/axes attributes -> inputs".into());
            }
            "TopK" if self.crosses(10) => {
                if !self.ints_attr_to_input(node, "k", 1, rw) {
                    return Err("no k attribute".into());
                }
            }
            "Clip" if self.crosses(11) => {
                let min = attr::take(node, "min").map(|a| a.f());
                let max = attr::take(node, "max").map(|a| a.f());
                if let Some(v) = min {
                    let input = self.float_input(node, "min", v, rw);
                    set_input(node, 1, input);
                }
                if let Some(v) = max {
                    let input = self.float_input(node, "max", v, rw);
                    set_input(node, 2, input);
                }
                if min.is_some() || max.is_some() {
                    rw.what.push("min/max attributes -> inputs".into());
                }
            }
            "Pad" if self.crosses(11) => {
                if !self.ints_attr_to_input(node, "pads", 1, rw) {
                    return Err("no pads attribute".into());
                }
                if let Some(v) = attr::take(node, "value").map(|a| a.f()) {
                    let input = self.float_input(node, "value", v, rw);
                    set_input(node, 2, input);
                    rw.what.push("value attribute -> input".into());
                }
            }
            "Scatter" if self.crosses(11) => {
                node.op_type = Some("ScatterElements".into());
                rw.what.push("Scatter -> ScatterElements".into());
            }
            "Dropout" if self.crosses(12) => {
                if let Some(v) = attr::take(node, "ratio").map(|a| a.f()) {
                    let input = self.float_input(node, "ratio", v, rw);
                    set_input(node, 1, input);
                    rw.what.push("ratio attribute -> input".into());
                }
            }
            "Squeeze" | "Unsqueeze" if self.crosses(13) => {
                self.ints_attr_to_input(node, "axes", 1, rw);
            }
            "ReduceSum" if self.crosses(13) => {
                self.ints_attr_to_input(node, "axes", 1, rw);
            }
            "Softmax" | "LogSoftmax" | "Hardmax" if self.crosses(13) => {
                let rank = node.input.first().and_then(|i| ranks.get(i)).copied();
                self.softmax_13(node, rank, rw);
            }
            "Split" => {
                if self.crosses(13) {
                    self.ints_attr_to_input(node, "split", 1, rw);
                }
                if self.crosses(18) && node.input.get(1).is_none_or(|s| s.is_empty()) {
                    node.input.truncate(1);
                    let n = node.output.len() as i64;
                    attr::set(node, attr::int("num_outputs", n));
                    rw.what.push(format!("num_outputs = {n}"));
                }
            }
            "ReduceL1" | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceMax"
            | "ReduceMean" | "ReduceMin" | "ReduceProd" | "ReduceSumSquare"
                if self.crosses(18) =>
            {
                self.ints_attr_to_input(node, "axes", 1, rw);
            }
            "RoiAlign" if self.crosses(16) => {
                if attr::get(node, "coordinate_transformation_mode").is_none() {
                    attr::set(
                        node,
                        attr::string("coordinate_transformation_mode", "output_half_pixel"),
                    );
                    rw.what
                        .push("coordinate_transformation_mode = output_half_pixel".into());
                }
            }
            "GridSample" if self.crosses(20) => {
                let mode = attr::get_strings(node, "mode")
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| "bilinear".into());
                let new = match mode.as_str() {
                    "bilinear" => "linear",
                    "bicubic" => "cubic",
                    other => other,
                }
                .to_string();
                if new != mode || attr::get(node, "mode").is_none() {
                    attr::set(node, attr::string("mode", &new));
                    rw.what.push(format!("mode {mode} -> {new}"));
                }
            }
            "Scan" if self.crosses(9) => {
                return Err("Scan-8 (batched, with sequence_lens) has no conversion".into());
            }
            "DFT" if self.crosses(20) => {
                return Err("its axis attribute became an input at 20; no conversion".into());
            }
            "GroupNormalization" if self.crosses(21) => {
                return Err("scale and bias changed from per group to per channel at 21".into());
            }
            _ => {}
        }
        Ok(())
    }

    /// Resize-10 (inputs X, scales; Upsample's meaning) as Resize-11: an empty `roi`
    /// and the coordinate mapping Resize-10 used. `at` is the node's version.
    fn resize_10_to_11(&mut self, node: &mut NodeProto, at: i64, rw: &mut Rewrite) {
        if !(at < 11 && self.crosses(11)) {
            return;
        }
        let roi = TensorProto {
            dims: vec![0],
            data_type: Some(DataType::Float as i32),
            ..Default::default()
        };
        let roi = self.constant(node, "roi", roi, rw);
        let scales = node.input.get(1).cloned().unwrap_or_default();
        node.input.truncate(1);
        node.input.extend([roi, scales]);
        attr::set(
            node,
            attr::string("coordinate_transformation_mode", "asymmetric"),
        );
        let mode = attr::get_strings(node, "mode").into_iter().next();
        if mode.as_deref().is_none_or(|m| m == "nearest") {
            attr::set(node, attr::string("nearest_mode", "floor"));
        }
        rw.what
            .push("roi input; coordinate_transformation_mode = asymmetric (Resize-10's)".into());
    }

    /// Softmax-1/11 (the input flattened to 2-D at `axis`, default 1) as Softmax-13
    /// (along `axis`, default -1).
    fn softmax_13(&mut self, node: &mut NodeProto, rank: Option<usize>, rw: &mut Rewrite) {
        let axis = attr::get_int(node, "axis").unwrap_or(1);
        // Along the last axis both versions mean the same.
        if axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1) {
            attr::set(node, attr::int("axis", axis));
            rw.what.push(format!("axis {axis} (the last) written out"));
            return;
        }
        // Flatten → op along the last axis → Reshape back to the input's shape.
        let input = node.input[0].clone();
        let output = node.output[0].clone();
        let base = node.name().to_string();
        let flat = self.fresh(format!("{base}_flat"));
        let shape = self.fresh(format!("{base}_shape"));
        let result = self.fresh(format!("{base}_2d"));
        rw.before.push(NodeProto {
            op_type: Some("Flatten".into()),
            name: Some(self.fresh(format!("{base}_flatten"))),
            input: vec![input.clone()],
            output: vec![flat.clone()],
            attribute: vec![attr::int("axis", axis)],
            ..Default::default()
        });
        rw.before.push(NodeProto {
            op_type: Some("Shape".into()),
            name: Some(self.fresh(format!("{base}_input_shape"))),
            input: vec![input],
            output: vec![shape.clone()],
            ..Default::default()
        });
        node.input[0] = flat;
        node.output[0] = result.clone();
        attr::set(node, attr::int("axis", -1));
        rw.after.push(NodeProto {
            op_type: Some("Reshape".into()),
            name: Some(self.fresh(format!("{base}_unflatten"))),
            input: vec![result, shape],
            output: vec![output],
            ..Default::default()
        });
        rw.what.push(format!(
            "2-D coercion at axis {axis} made explicit: Flatten -> {} -> Reshape",
            node.op_type()
        ));
    }
}

/// Ranks of the values whose type the graph declares (inputs, outputs, value_info).
fn declared_ranks(g: &GraphProto) -> HashMap<String, usize> {
    use hmct_proto::onnx::type_proto::Value;
    g.input
        .iter()
        .chain(&g.output)
        .chain(&g.value_info)
        .filter_map(|v| match v.r#type.as_ref()?.value.as_ref()? {
            Value::TensorType(t) => Some((v.name().to_string(), t.shape.as_ref()?.dim.len())),
            _ => None,
        })
        .collect()
}

fn set_input(node: &mut NodeProto, index: usize, name: String) {
    if node.input.len() <= index {
        node.input.resize(index + 1, String::new());
    }
    node.input[index] = name;
}
