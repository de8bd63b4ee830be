//! HzCalibration nodes: reading their parameters, editing them, creating them.
//! The attribute contract is ../shared/spec/HZCALIBRATION.md §1-2.

use hmct_proto::onnx::NodeProto;

use crate::attr::{
    floats as floats_attr, get as attr, get_floats as attr_floats, get_int as attr_int,
    get_ints as attr_ints, get_strings as attr_strings, int as int_attr, ints as ints_attr,
    set as set_attr, string as string_attr,
};

use crate::{IrError, Model, NodeId, QType, TensorType};

/// `op_type` of calibration nodes.
pub const CALIBRATION_OP: &str = "HzCalibration";
/// Operator domain of calibration nodes (declared as opset version 1).
pub const CALIBRATION_DOMAIN: &str = "horizon";

/// True for an HzCalibration node: the one definition every crate uses. The domain
/// is `horizon` (HZCALIBRATION.md §1) or left empty (files whose writer dropped it,
/// `ai.onnx` being the same default domain): no standard op is called HzCalibration,
/// so those mean the same node. Another domain's HzCalibration is a different op.
pub fn is_calibration_node(node: &NodeProto) -> bool {
    node.op_type() == CALIBRATION_OP && matches!(node.domain(), CALIBRATION_DOMAIN | "" | "ai.onnx")
}

impl Model {
    /// True when node `id` is a calibration node.
    pub fn is_calibration(&self, id: NodeId) -> bool {
        self.nodes().get(id).is_some_and(is_calibration_node)
    }

    /// Ids of all calibration nodes, in graph order.
    pub fn calibration_nodes(&self) -> Vec<NodeId> {
        self.nodes_of_type(CALIBRATION_OP)
            .iter()
            .copied()
            .filter(|&id| self.is_calibration(id))
            .collect()
    }

    /// A read view of calibration node `id` (None if `id` is not one).
    pub fn calibration(&self, id: NodeId) -> Option<CalibrationNode<'_>> {
        self.is_calibration(id)
            .then_some(CalibrationNode { model: self, id })
    }

    /// An editing view of calibration node `id` (None if `id` is not one).
    pub fn calibration_mut(&mut self, id: NodeId) -> Option<CalibrationNodeMut<'_>> {
        if !self.is_calibration(id) {
            return None;
        }
        Some(CalibrationNodeMut {
            node: self.node_mut(id),
        })
    }

    /// The calibration node called `name`, or an error saying it is unknown or not a
    /// calibration node.
    pub fn calibration_by_name(&self, name: &str) -> Result<CalibrationNode<'_>, IrError> {
        let id = self.node_id(name)?;
        self.calibration(id).ok_or_else(|| IrError::NotCalibration {
            file: self.file().to_string(),
            node: name.to_string(),
        })
    }
}

/// Read view of one calibration node. Every getter applies the defaults and legacy
/// forms of the spec, so callers never look at raw attributes.
#[derive(Clone, Copy)]
pub struct CalibrationNode<'a> {
    model: &'a Model,
    id: NodeId,
}

impl std::fmt::Debug for CalibrationNode<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CalibrationNode")
            .field("name", &self.name())
            .field("qtype", &self.qtype())
            .field("thresholds", &self.thresholds())
            .finish_non_exhaustive()
    }
}

impl<'a> CalibrationNode<'a> {
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The underlying node.
    pub fn node(&self) -> &'a NodeProto {
        self.model.node(self.id)
    }

    pub fn name(&self) -> &'a str {
        self.node().name()
    }

    /// The quantized tensor (the first input; empty if the node has none).
    pub fn input(&self) -> &'a str {
        self.node().input.first().map(String::as_str).unwrap_or("")
    }

    /// The fake-quantized tensor (the first output). Further outputs are ignored.
    pub fn output(&self) -> &'a str {
        self.node().output.first().map(String::as_str).unwrap_or("")
    }

    /// `qtype`, else `int<bits>` from the legacy `bits`, else int8.
    pub fn qtype(&self) -> QType {
        qtype_of(self.node())
    }

    /// The `thresholds` attribute (empty when absent).
    pub fn thresholds(&self) -> Vec<f32> {
        thresholds_of(self.node())
    }

    /// The scale per channel (one value when per-tensor). Derived from the
    /// thresholds for integer types (`threshold / qmax`; asymmetric
    /// `(max - min) / (qmax - qmin)`); the `scales` attribute is used instead when
    /// `constant == 2`, when there are no thresholds, and for float/unknown types.
    pub fn scales(&self) -> Vec<f32> {
        scales_of(self.node())
    }

    /// `zero_point` when present; else `qmax - round(max / scale)` for asymmetric
    /// nodes; else zeros, one per scale.
    pub fn zero_point(&self) -> Vec<i64> {
        let node = self.node();
        if let Some(zp) = attr_ints(node, "zero_point") {
            return zp;
        }
        let scales = scales_of(node);
        if is_asymmetric(node)
            && let (Some((_, qmax)), [_, fmax], [s]) = (
                qtype_of(node).qrange(),
                thresholds_of(node).as_slice(),
                scales.as_slice(),
            )
        {
            return vec![qmax - (fmax / s).round_ties_even() as i64];
        }
        vec![0; scales.len()]
    }

    /// The `axis` attribute, if present (the spec's default of 1 applies only to
    /// per-channel nodes, which must carry it).
    pub fn axis(&self) -> Option<i64> {
        attr_int(self.node(), "axis")
    }

    /// Per-channel only when `axis` is present and there is more than one parameter.
    pub fn is_per_channel(&self) -> bool {
        is_per_channel(self.node())
    }

    /// Asymmetric: an unsigned type with `[min, max]` thresholds on a per-tensor
    /// node, or (without thresholds) a nonzero `zero_point`.
    pub fn is_asymmetric(&self) -> bool {
        is_asymmetric(self.node())
    }

    /// False when `switch` is `OFF` (the node is then the identity).
    pub fn switch_on(&self) -> bool {
        switch_of(self.node())
    }

    /// `constant` [0]: 0 thresholds to compute, 1 fixed, 2 `scales` authoritative.
    pub fn constant(&self) -> i64 {
        attr_int(self.node(), "constant").unwrap_or(0)
    }

    /// `group` [1]: the group count of the consuming Conv/ConvTranspose.
    pub fn group(&self) -> i64 {
        attr_int(self.node(), "group").unwrap_or(1)
    }

    /// Explicit `tensor_type` attribute; else a `feature`/`weight` token in the
    /// legacy `info_strings`; else weight when the input is a constant (initializer
    /// or `Constant` output) and feature otherwise.
    pub fn tensor_type(&self) -> TensorType {
        let node = self.node();
        let parse = |s: &str| match s.trim().to_ascii_lowercase().as_str() {
            "feature" => Some(TensorType::Feature),
            "weight" => Some(TensorType::Weight),
            _ => None,
        };
        if let Some(t) = attr_strings(node, "tensor_type")
            .iter()
            .find_map(|s| parse(s))
        {
            return t;
        }
        let token = attr_strings(node, "info_strings")
            .into_iter()
            .find_map(|s| {
                s.split(|c: char| !c.is_ascii_alphanumeric())
                    .find_map(parse)
            });
        if let Some(t) = token {
            return t;
        }
        if self.model.is_constant(self.input()) {
            TensorType::Weight
        } else {
            TensorType::Feature
        }
    }

    /// Checks that the node can be run: a known qtype and, for integer types,
    /// positive finite scales. The error names the node.
    pub fn validate(&self) -> Result<(), IrError> {
        let node = self.node();
        let q = qtype_of(node);
        if let QType::Unknown(s) = &q {
            return Err(invalid(node, format!("qtype '{s}' is not supported")));
        }
        if !q.is_int() {
            return Ok(());
        }
        let scales = scales_of(node);
        if scales.is_empty() {
            return Err(invalid(node, "has neither thresholds nor scales".into()));
        }
        if let Some((i, s)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(invalid(
                node,
                format!("scale {i} is {s}; scales must be positive and finite"),
            ));
        }
        Ok(())
    }
}

/// Editing view of one calibration node. Each setter changes its attribute, keeps
/// `scales` (and `zero_point`) consistent when the node carries them, and leaves
/// every other attribute as it was.
pub struct CalibrationNodeMut<'a> {
    node: &'a mut NodeProto,
}

impl std::fmt::Debug for CalibrationNodeMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CalibrationNodeMut")
            .field("name", &self.node.name())
            .finish_non_exhaustive()
    }
}

impl CalibrationNodeMut<'_> {
    pub fn name(&self) -> &str {
        self.node.name()
    }

    pub fn qtype(&self) -> QType {
        qtype_of(self.node)
    }

    pub fn thresholds(&self) -> Vec<f32> {
        thresholds_of(self.node)
    }

    pub fn scales(&self) -> Vec<f32> {
        scales_of(self.node)
    }

    pub fn switch_on(&self) -> bool {
        switch_of(self.node)
    }

    /// Sets `qtype`. Unknown types are refused. Stored scales are recomputed from
    /// the thresholds, or, where the scales are authoritative, rescaled so that the
    /// clipping range stays the same.
    pub fn set_qtype(&mut self, qtype: QType) -> Result<(), IrError> {
        if let QType::Unknown(s) = &qtype {
            return Err(invalid(self.node, format!("qtype '{s}' is not supported")));
        }
        let old = qtype_of(self.node);
        set_attr(self.node, string_attr("qtype", &qtype.to_string()));
        let Some(stored) = attr_floats(self.node, "scales") else {
            return Ok(());
        };
        let authoritative =
            attr_int(self.node, "constant") == Some(2) || thresholds_of(self.node).is_empty();
        if !authoritative {
            self.refresh_derived();
            return Ok(());
        }
        let span = |q: &QType| {
            let (lo, hi) = q.qrange()?;
            Some(if is_asymmetric(self.node) {
                hi as f64 - lo as f64
            } else {
                hi as f64
            })
        };
        if let (Some(old_span), Some(new_span)) = (span(&old), span(&qtype)) {
            let rescaled = stored
                .iter()
                .map(|&s| (s as f64 * old_span / new_span) as f32)
                .collect();
            set_attr(self.node, floats_attr("scales", rescaled));
        }
        Ok(())
    }

    /// Sets `thresholds`. Symmetric thresholds must be positive and finite;
    /// asymmetric ones (`[min, max]`) finite with `min < max`. The error names the node.
    pub fn set_thresholds(&mut self, thresholds: Vec<f32>) -> Result<(), IrError> {
        check_thresholds(
            self.node,
            &qtype_of(self.node),
            attr_int(self.node, "axis").is_some(),
            &thresholds,
        )?;
        set_attr(self.node, floats_attr("thresholds", thresholds));
        self.refresh_derived();
        Ok(())
    }

    /// Sets `switch` to `ON` or `OFF`.
    pub fn set_switch(&mut self, on: bool) {
        set_attr(
            self.node,
            string_attr("switch", if on { "ON" } else { "OFF" }),
        );
    }

    /// Rewrites the stored `scales`/`zero_point` (only those present) from the
    /// thresholds.
    fn refresh_derived(&mut self) {
        let q = qtype_of(self.node);
        let thresholds = thresholds_of(self.node);
        let asym = is_asymmetric(self.node);
        let Some(scales) = derive_scales(&q, &thresholds, asym) else {
            return;
        };
        if attr(self.node, "scales").is_some() {
            set_attr(self.node, floats_attr("scales", scales.clone()));
        }
        if attr(self.node, "zero_point").is_some() {
            let zp = match (asym, q.qrange(), thresholds.as_slice(), scales.as_slice()) {
                (true, Some((_, qmax)), [_, fmax], [s]) => {
                    vec![qmax - (fmax / s).round_ties_even() as i64]
                }
                _ => vec![0; scales.len()],
            };
            set_attr(self.node, ints_attr("zero_point", zp));
        }
    }
}

/// Parameters of a calibration node to create (see [`Model::insert_calibrations`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationSpec {
    /// Node name; by convention `<input>_HzCalibration`.
    pub name: String,
    pub input: String,
    pub output: String,
    pub tensor_type: TensorType,
    pub qtype: QType,
    pub thresholds: Vec<f32>,
    /// Channel axis of per-channel thresholds.
    pub axis: Option<i64>,
    /// Group count of the consuming Conv (weights).
    pub group: Option<i64>,
    pub constant: i64,
    pub switch_on: bool,
}

impl CalibrationSpec {
    /// The node, with every attribute written explicitly (and `scales` derived for
    /// integer types). Invalid thresholds or an unknown qtype are an error.
    pub fn to_node(&self) -> Result<NodeProto, IrError> {
        let mut node = NodeProto {
            name: Some(self.name.clone()),
            op_type: Some(CALIBRATION_OP.to_string()),
            domain: Some(CALIBRATION_DOMAIN.to_string()),
            input: vec![self.input.clone()],
            output: vec![self.output.clone()],
            ..Default::default()
        };
        if let QType::Unknown(s) = &self.qtype {
            return Err(invalid(&node, format!("qtype '{s}' is not supported")));
        }
        check_thresholds(&node, &self.qtype, self.axis.is_some(), &self.thresholds)?;
        let asym = self.qtype.qrange().is_some_and(|(lo, _)| lo == 0)
            && !(self.axis.is_some() && self.thresholds.len() > 1)
            && self.thresholds.len() == 2;
        let mut attrs = vec![
            string_attr("qtype", &self.qtype.to_string()),
            floats_attr("thresholds", self.thresholds.clone()),
        ];
        if let Some(scales) = derive_scales(&self.qtype, &self.thresholds, asym) {
            attrs.push(floats_attr("scales", scales));
        }
        if let Some(axis) = self.axis {
            attrs.push(int_attr("axis", axis));
        }
        if let Some(group) = self.group {
            attrs.push(int_attr("group", group));
        }
        attrs.push(int_attr("constant", self.constant));
        attrs.push(string_attr(
            "switch",
            if self.switch_on { "ON" } else { "OFF" },
        ));
        attrs.push(string_attr("tensor_type", self.tensor_type.as_str()));
        node.attribute = attrs;
        Ok(node)
    }
}

/// A calibration node to insert and the inputs it feeds: `(node, input index)` pairs
/// whose input is currently `spec.input` and becomes `spec.output`.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationInsert {
    pub spec: CalibrationSpec,
    pub consumers: Vec<(NodeId, usize)>,
}

impl Model {
    /// Adds calibration nodes, each placed just before its first consumer (or after
    /// the producer of its input when it has none), and rewires the consumers.
    /// Node ids change; the result is validated like a loaded model.
    pub fn insert_calibrations(self, inserts: Vec<CalibrationInsert>) -> Result<Model, IrError> {
        let file = self.file().to_string();
        let base_dir = self.base_dir().map(|p| p.to_path_buf());
        let n = self.nodes().len();
        let mut before: Vec<Vec<NodeProto>> = vec![Vec::new(); n + 1];
        let mut rewires = Vec::new();
        for ins in &inserts {
            let node = ins.spec.to_node()?;
            for &(id, i) in &ins.consumers {
                let found = self.nodes().get(id).and_then(|c| c.input.get(i));
                if found != Some(&ins.spec.input) {
                    return Err(invalid(
                        &node,
                        format!(
                            "consumer (node {id}, input {i}) does not read '{}'",
                            ins.spec.input
                        ),
                    ));
                }
                rewires.push((id, i, ins.spec.output.clone()));
            }
            let at = match ins.consumers.iter().map(|&(id, _)| id).min() {
                Some(first) => first,
                None => self.producer(&ins.spec.input).map_or(0, |p| p + 1),
            };
            before[at].push(node);
        }
        let mut proto = self.into_proto();
        let graph = proto.graph.get_or_insert_with(Default::default);
        for (id, i, output) in rewires {
            graph.node[id].input[i] = output;
        }
        let old = std::mem::take(&mut graph.node);
        let mut tail = before.pop().unwrap_or_default();
        for (node, mut calibs) in old.into_iter().zip(before) {
            graph.node.append(&mut calibs);
            graph.node.push(node);
        }
        graph.node.append(&mut tail);
        Model::build(proto, file, base_dir)
    }
}

fn invalid(node: &NodeProto, message: String) -> IrError {
    IrError::InvalidCalibration {
        node: node.name().to_string(),
        message,
    }
}

fn check_thresholds(
    node: &NodeProto,
    qtype: &QType,
    has_axis: bool,
    thresholds: &[f32],
) -> Result<(), IrError> {
    if thresholds.is_empty() {
        return Err(invalid(node, "thresholds must not be empty".into()));
    }
    let unsigned = qtype.qrange().is_some_and(|(lo, _)| lo == 0);
    if unsigned && thresholds.len() == 2 && !has_axis {
        let (lo, hi) = (thresholds[0], thresholds[1]);
        if !(lo.is_finite() && hi.is_finite() && lo < hi) {
            return Err(invalid(
                node,
                format!("asymmetric thresholds [{lo}, {hi}] must be finite with min < max"),
            ));
        }
        return Ok(());
    }
    if let Some((i, t)) = thresholds
        .iter()
        .enumerate()
        .find(|(_, t)| !(t.is_finite() && **t > 0.0))
    {
        return Err(invalid(
            node,
            format!("threshold {i} is {t}; thresholds must be positive and finite"),
        ));
    }
    Ok(())
}

// ---- reading attributes, with the spec's defaults ----

fn qtype_of(node: &NodeProto) -> QType {
    if let Some(s) = attr(node, "qtype").and_then(|a| a.s.as_ref()) {
        return QType::from_name(&String::from_utf8_lossy(s));
    }
    match attr_int(node, "bits") {
        Some(bits) => QType::from_name(&format!("int{bits}")),
        None => QType::INT8,
    }
}

fn thresholds_of(node: &NodeProto) -> Vec<f32> {
    attr_floats(node, "thresholds").unwrap_or_default()
}

fn switch_of(node: &NodeProto) -> bool {
    !attr_strings(node, "switch")
        .first()
        .is_some_and(|s| s.trim().eq_ignore_ascii_case("off"))
}

fn param_count(node: &NodeProto) -> usize {
    let t = thresholds_of(node);
    if t.is_empty() {
        attr_floats(node, "scales").map_or(0, |s| s.len())
    } else {
        t.len()
    }
}

fn is_per_channel(node: &NodeProto) -> bool {
    attr(node, "axis").is_some() && param_count(node) > 1
}

fn is_asymmetric(node: &NodeProto) -> bool {
    if is_per_channel(node) {
        return false;
    }
    let thresholds = thresholds_of(node);
    if thresholds.is_empty() {
        return attr_ints(node, "zero_point").is_some_and(|z| z.iter().any(|&v| v != 0));
    }
    let unsigned = qtype_of(node).qrange().is_some_and(|(lo, _)| lo == 0);
    unsigned && thresholds.len() == 2
}

/// Scales from thresholds for integer types; None for float/unknown types or
/// without thresholds.
fn derive_scales(q: &QType, thresholds: &[f32], asymmetric: bool) -> Option<Vec<f32>> {
    let (qmin, qmax) = q.qrange()?;
    if thresholds.is_empty() {
        return None;
    }
    if asymmetric && let [fmin, fmax] = thresholds {
        return Some(vec![(fmax - fmin) / (qmax - qmin) as f32]);
    }
    // Division, not multiplication by a reciprocal: it must match the scale other
    // tools compute bit for bit.
    Some(thresholds.iter().map(|&t| t / qmax as f32).collect())
}

fn scales_of(node: &NodeProto) -> Vec<f32> {
    let stored = attr_floats(node, "scales");
    let thresholds = thresholds_of(node);
    let authoritative = attr_int(node, "constant") == Some(2) || thresholds.is_empty();
    if let (true, Some(s)) = (authoritative, &stored) {
        return s.clone();
    }
    derive_scales(&qtype_of(node), &thresholds, is_asymmetric(node))
        .or(stored)
        .unwrap_or_default()
}
