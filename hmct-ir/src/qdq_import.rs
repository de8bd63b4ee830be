//! Import of standard QDQ models (onnxruntime's `quantize_static` in QDQ format, or
//! our own `export-qdq`) as calibrated models, the reverse of [`crate::export_qdq`]:
//!
//! - each QuantizeLinear → DequantizeLinear pair becomes one HzCalibration node
//!   `<tensor>_HzCalibration` from the pair's input to the DequantizeLinear's output;
//! - each DequantizeLinear of an integer constant (a weight quantized offline) becomes
//!   a float initializer holding exactly what DequantizeLinear computes,
//!   `(q - zero_point) * scale` in f32, followed by a weight calibration node with the
//!   same parameters; fake quantization reproduces those floats bit for bit, so the
//!   calibrated model computes what the QDQ model computes;
//! - a DequantizeLinear of an int32 constant (a bias, whose scale is input scale ×
//!   weight scale) becomes a plain float initializer: calibrated models do not
//!   quantize biases, and no fake quantization has 32 bits.
//!
//! Calibration nodes take the pair's scale and zero point as authoritative
//! (`constant = 2`), so the result is the same bits as onnxruntime's QuantizeLinear /
//! DequantizeLinear. Their `thresholds` are the float range the parameters stand for
//! (`qmax · scale`, or `[min, max]` for unsigned types), for display and for
//! re-quantizing at another precision; signed types with a nonzero zero point carry
//! no thresholds (a symmetric threshold cannot express them).
//!
//! onnxruntime drops a Relu or Clip whose output is quantized (the quantization clips
//! anyway) and gives the pair the range of the activation's output over its
//! calibration data. Switched OFF, such a pair would pass values the float model
//! never had, and a float model without the Clips of hard-swish blocks diverges
//! (values of 1e22 and NaN were seen on a MobileNetV3). So before every per-tensor
//! activation pair whose range starts at 0 (zero point = qmin), unless its input
//! already comes from a Relu or Clip, a `Clip(0, top)` is put back, `top` being the
//! largest value the pair represents ((qmax - zp) · scale). On the calibration data
//! that is what the dropped Relu or Clip did (onnxruntime's range is that data's),
//! and with the pair ON it changes no bit (the pair saturates at 0 and `top`).

//! Integer operators (QLinearConv, ConvInteger, ...) have no calibrated equivalent and
//! are refused, as are lone QuantizeLinear / DequantizeLinear nodes.

use std::collections::{HashMap, HashSet};

use hmct_proto::onnx::{NodeProto, OperatorSetIdProto, TensorProto};
use hmct_tensor::{DType, Tensor};

use crate::attr::{floats as floats_attr, get_int, int, ints as ints_attr, string as string_attr};
use crate::calibration::{CALIBRATION_DOMAIN, CALIBRATION_OP};
use crate::{IrError, Model, NodeId, QType, TensorType};

const QUANTIZE: &str = "QuantizeLinear";
const DEQUANTIZE: &str = "DequantizeLinear";

/// What [`import_qdq`] did, for the user to see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QdqImport {
    /// QuantizeLinear → DequantizeLinear pairs now calibration nodes (on activations,
    /// or on float weights quantized at run time).
    pub pairs: usize,
    /// Integer weights now float initializers with a weight calibration node.
    pub weights: usize,
    /// int32 constants (biases) now float initializers without calibration node.
    pub biases: usize,
    /// Clip nodes put back before activation pairs whose range starts at 0 (see
    /// the module doc).
    pub clips: usize,
}

impl std::fmt::Display for QdqImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} QuantizeLinear/DequantizeLinear pair(s) and {} integer weight(s) as HzCalibration nodes, {} int32 bias(es) as float, {} dropped Relu/Clip(s) restored",
            self.pairs, self.weights, self.biases, self.clips
        )
    }
}

/// Why a QDQ model cannot be imported; each names the node.
#[derive(Debug, thiserror::Error)]
pub enum QdqImportError {
    #[error(
        "node '{node}' is a {op}: integer operators cannot be imported, only QuantizeLinear/DequantizeLinear pairs around float operators (quantize with QuantFormat.QDQ)"
    )]
    IntegerOp { node: String, op: String },
    #[error(
        "DequantizeLinear '{node}': its input '{input}' is neither the output of a QuantizeLinear nor a constant"
    )]
    DequantizeInput { node: String, input: String },
    #[error(
        "QuantizeLinear '{node}': {reason}; only QuantizeLinear → DequantizeLinear pairs can be imported"
    )]
    LoneQuantize { node: String, reason: String },
    #[error("{op} '{node}': {message}")]
    Unsupported {
        node: String,
        op: String,
        message: String,
    },
    #[error(transparent)]
    Ir(#[from] IrError),
}

/// Operators that compute on integers; a model containing one is not a QDQ model.
fn is_integer_op(op: &str) -> bool {
    op.starts_with("QLinear")
        || matches!(
            op,
            "ConvInteger"
                | "MatMulInteger"
                | "MatMulIntegerToFloat"
                | "DynamicQuantizeLinear"
                | "DynamicQuantizeMatMul"
                | "QGemm"
                | "QAttention"
        )
}

/// True when loading should import: QuantizeLinear/DequantizeLinear nodes and no
/// calibration node (a model with both is run as it is).
pub(crate) fn wants_import(model: &Model) -> bool {
    model.calibration_nodes().is_empty()
        && !(model.nodes_of_type(QUANTIZE).is_empty() && model.nodes_of_type(DEQUANTIZE).is_empty())
}

/// Rewrites a QDQ model as a calibrated model (see the module doc). Tensor names
/// outside the pairs are kept; the result is marked
/// [`Model::imported_from_qdq`].
pub fn import_qdq(model: Model) -> Result<(Model, QdqImport), QdqImportError> {
    for node in model.nodes() {
        if is_integer_op(node.op_type()) {
            return Err(QdqImportError::IntegerOp {
                node: node.name().to_string(),
                op: node.op_type().to_string(),
            });
        }
    }
    for &q in model.nodes_of_type(QUANTIZE) {
        check_quantize(&model, q)?;
    }

    let mut names = Names::new(&model);
    let mut report = QdqImport::default();
    // DequantizeLinear id → the nodes replacing it (none: the value becomes an
    // initializer).
    let mut replaced: HashMap<NodeId, Vec<NodeProto>> = HashMap::new();
    let mut new_initializers: Vec<TensorProto> = Vec::new();
    for &dq in model.nodes_of_type(DEQUANTIZE) {
        let node = model.node(dq);
        let input = node.input.first().cloned().unwrap_or_default();
        let output = node.output.first().cloned().unwrap_or_default();
        let quantize = model
            .producer(&input)
            .filter(|&p| model.node(p).op_type() == QUANTIZE);
        if let Some(q) = quantize {
            let source = model.node(q).input.first().cloned().unwrap_or_default();
            let rank = value_rank(&model, &source)?;
            let qp = params(&model, q, rank, None)?;
            let dp = params(&model, dq, rank, Some(&qp.qtype))?;
            if !runnable(&qp.qtype) {
                return Err(unsupported(
                    &model,
                    q,
                    format!("{} is not a type fake quantization runs", qp.qtype),
                ));
            }
            if qp != dp {
                return Err(unsupported(
                    &model,
                    dq,
                    format!(
                        "its scale/zero point/axis differ from those of QuantizeLinear '{}' (a requantization, not a fake quantization)",
                        model.node_name(q)
                    ),
                ));
            }
            let tensor_type = if model.is_constant(&source) {
                TensorType::Weight
            } else {
                TensorType::Feature
            };
            let name = names.fresh(format!("{source}_{CALIBRATION_OP}"));
            let mut nodes = Vec::new();
            let mut quantized = source.clone();
            if let Some(top) = folded_clip_top(&model, &source, &qp) {
                let clipped = names.fresh(format!("{source}_clip"));
                let mut clip = NodeProto {
                    name: Some(names.fresh(format!("{source}_Clip"))),
                    op_type: Some("Clip".to_string()),
                    input: vec![source],
                    output: vec![clipped.clone()],
                    ..Default::default()
                };
                // Clip takes its bounds as inputs from opset 11, as attributes before.
                if model.opset("").unwrap_or(1) >= 11 {
                    for (suffix, value) in [("min", 0.0f32), ("max", top)] {
                        let bound = names.fresh(format!("{}_{suffix}", clip.name()));
                        new_initializers.push(TensorProto {
                            name: Some(bound.clone()),
                            data_type: Some(hmct_proto::onnx::tensor_proto::DataType::Float as i32),
                            float_data: vec![value],
                            ..Default::default()
                        });
                        clip.input.push(bound);
                    }
                } else {
                    clip.attribute = ["min", "max"]
                        .into_iter()
                        .zip([0.0f32, top])
                        .map(|(name, value)| crate::attr::float(name, value))
                        .collect();
                }
                nodes.push(clip);
                quantized = clipped;
                report.clips += 1;
            }
            nodes.push(calibration_node(name, quantized, output, tensor_type, &qp));
            replaced.insert(dq, nodes);
            report.pairs += 1;
        } else if let Some(q) = model.constant_tensor(&input)? {
            let rank = Some(q.shape().len());
            let dtype = q.dtype();
            let p = params(&model, dq, rank, None)?;
            let float = dequantize(&q, &p).map_err(|m| unsupported(&model, dq, m))?;
            if dtype == DType::I32 {
                new_initializers.push(hmct_tensor::tensor_to_proto(&float, &output));
                replaced.insert(dq, Vec::new());
                report.biases += 1;
            } else {
                if dtype_qtype(Some(dtype)).as_ref() != Some(&p.qtype) {
                    return Err(unsupported(
                        &model,
                        dq,
                        format!(
                            "its input '{input}' is {dtype} but its zero point is {}",
                            p.qtype
                        ),
                    ));
                }
                let base = input
                    .strip_suffix("_quantized")
                    .map_or_else(|| format!("{input}_float"), str::to_string);
                let weight = names.fresh(base);
                new_initializers.push(hmct_tensor::tensor_to_proto(&float, &weight));
                let name = names.fresh(format!("{weight}_{CALIBRATION_OP}"));
                replaced.insert(
                    dq,
                    vec![calibration_node(
                        name,
                        weight,
                        output,
                        TensorType::Weight,
                        &p,
                    )],
                );
                report.weights += 1;
            }
        } else {
            return Err(QdqImportError::DequantizeInput {
                node: node.name().to_string(),
                input,
            });
        }
    }

    let removed: HashSet<NodeId> = model
        .nodes_of_type(QUANTIZE)
        .iter()
        .chain(model.nodes_of_type(DEQUANTIZE))
        .copied()
        .collect();
    let kept: HashSet<String> = replaced
        .values()
        .flatten()
        .flat_map(|n| n.input.iter().cloned())
        .collect();
    // Parameters and integer weights read only by the removed nodes go with them.
    let dead: HashSet<String> = removed
        .iter()
        .flat_map(|&id| model.node(id).input.iter())
        .filter(|v| {
            !v.is_empty()
                && !kept.contains(*v)
                && model.is_constant(v)
                && !model.is_graph_output(v)
                && model.consumers(v).iter().all(|c| removed.contains(c))
        })
        .cloned()
        .collect();
    let dead_nodes: HashSet<NodeId> = dead.iter().filter_map(|v| model.producer(v)).collect();
    let quantized_values: HashSet<String> = model
        .nodes_of_type(QUANTIZE)
        .iter()
        .flat_map(|&q| model.node(q).output.iter().cloned())
        .collect();

    let file = model.file().to_string();
    let base_dir = model.base_dir().map(|p| p.to_path_buf());
    let mut proto = model.into_proto();
    let graph = proto.graph.get_or_insert_with(Default::default);
    let old = std::mem::take(&mut graph.node);
    for (id, node) in old.into_iter().enumerate() {
        if let Some(new) = replaced.remove(&id) {
            graph.node.extend(new);
        } else if !removed.contains(&id) && !dead_nodes.contains(&id) {
            graph.node.push(node);
        }
    }
    graph.initializer.retain(|t| !dead.contains(t.name()));
    graph.initializer.extend(new_initializers);
    graph.input.retain(|v| !dead.contains(v.name()));
    graph
        .value_info
        .retain(|v| !dead.contains(v.name()) && !quantized_values.contains(v.name()));
    if report.pairs + report.weights > 0
        && !proto
            .opset_import
            .iter()
            .any(|o| o.domain() == CALIBRATION_DOMAIN)
    {
        proto.opset_import.push(OperatorSetIdProto {
            domain: Some(CALIBRATION_DOMAIN.to_string()),
            version: Some(1),
        });
    }
    let mut model = Model::build(proto, file, base_dir)?;
    model.qdq = Some(report.clone());
    Ok((model, report))
}

/// The load hook: imports when [`wants_import`], naming the file in errors.
pub(crate) fn import_on_load(model: Model) -> Result<Model, IrError> {
    if !wants_import(&model) {
        return Ok(model);
    }
    let file = model.file().to_string();
    match import_qdq(model) {
        Ok((model, _)) => Ok(model),
        Err(QdqImportError::Ir(e)) => Err(e),
        Err(error) => Err(IrError::QdqImport {
            file,
            error: Box::new(error),
        }),
    }
}

impl Model {
    /// What the loader did when this model was a QDQ model turned into a calibrated
    /// one (None for models loaded as they are).
    pub fn imported_from_qdq(&self) -> Option<&QdqImport> {
        self.qdq.as_ref()
    }
}

/// A QuantizeLinear must feed DequantizeLinear nodes only.
fn check_quantize(model: &Model, q: NodeId) -> Result<(), QdqImportError> {
    let node = model.node(q);
    let lone = |reason: String| QdqImportError::LoneQuantize {
        node: node.name().to_string(),
        reason,
    };
    let output = node.output.first().map(String::as_str).unwrap_or("");
    if model.is_graph_output(output) {
        return Err(lone(format!("its output '{output}' is a graph output")));
    }
    let consumers = model.consumers(output);
    if consumers.is_empty() {
        return Err(lone(format!("nothing reads its output '{output}'")));
    }
    if let Some(&c) = consumers.iter().find(|&&c| {
        let reader = model.node(c);
        reader.op_type() != DEQUANTIZE || reader.input.first().map(String::as_str) != Some(output)
    }) {
        return Err(lone(format!(
            "its output '{output}' is read by '{}' ({}), not dequantized",
            model.node_name(c),
            model.node(c).op_type()
        )));
    }
    Ok(())
}

/// The parameters of one QuantizeLinear or DequantizeLinear.
#[derive(Clone, Debug, PartialEq)]
struct Params {
    qtype: QType,
    scales: Vec<f32>,
    zero_points: Vec<i64>,
    /// The (non-negative) channel axis, only when per-channel.
    axis: Option<usize>,
}

/// Reads scale, zero point and axis of node `id`. `rank` is that of the quantized
/// tensor when known (needed for a negative axis); `default_qtype` is the type when
/// the node has no zero point and its own input does not say it.
fn params(
    model: &Model,
    id: NodeId,
    rank: Option<usize>,
    default_qtype: Option<&QType>,
) -> Result<Params, QdqImportError> {
    let node = model.node(id);
    let fail = |message: String| unsupported(model, id, message);
    if let Some(b) = get_int(node, "block_size").filter(|&b| b != 0) {
        return Err(fail(format!(
            "blocked quantization (block_size {b}) is not supported"
        )));
    }
    let scale_name = node.input.get(1).map(String::as_str).unwrap_or("");
    let scale = model
        .constant_tensor(scale_name)?
        .ok_or_else(|| fail(format!("its scale '{scale_name}' is not a constant")))?;
    let scales: Vec<f32> = scale
        .as_f32()
        .ok_or_else(|| {
            fail(format!(
                "its scale '{scale_name}' is {}; only float scales are supported",
                scale.dtype()
            ))
        })?
        .iter()
        .copied()
        .collect();
    if let Some((i, s)) = scales
        .iter()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && **s > 0.0))
    {
        return Err(fail(format!(
            "scale {i} is {s}; scales must be positive and finite"
        )));
    }
    let zp_name = node.input.get(2).map(String::as_str).unwrap_or("");
    let (qtype, zero_points) = if zp_name.is_empty() {
        let qtype = match default_qtype {
            Some(q) => q.clone(),
            None if node.op_type() == QUANTIZE => match get_int(node, "output_dtype") {
                Some(code) if code != 0 => dtype_qtype(DType::from_onnx(code as i32))
                    .ok_or_else(|| fail(format!("output type {code} is not an integer type")))?,
                _ => QType::UINT8,
            },
            None => {
                let input = node.input.first().map(String::as_str).unwrap_or("");
                let t = model.constant_tensor(input)?;
                let dtype = t.as_ref().map(Tensor::dtype);
                qtype_or_bias(dtype)
                    .ok_or_else(|| fail(format!("input '{input}' is not an integer constant")))?
            }
        };
        (qtype, vec![0; scales.len()])
    } else {
        let zp = model
            .constant_tensor(zp_name)?
            .ok_or_else(|| fail(format!("its zero point '{zp_name}' is not a constant")))?;
        let qtype = qtype_or_bias(Some(zp.dtype())).ok_or_else(|| {
            fail(format!(
                "zero point type {} is not supported (int8, uint8, int16, uint16, int32)",
                zp.dtype()
            ))
        })?;
        let values = zp.to_i64_vec().expect("an integer tensor");
        if values.len() != scales.len() {
            return Err(fail(format!(
                "{} zero point(s) for {} scale(s)",
                values.len(),
                scales.len()
            )));
        }
        (qtype, values)
    };
    if scales.len() == 1 {
        return Ok(Params {
            qtype,
            scales,
            zero_points,
            axis: None,
        });
    }
    let axis = get_int(node, "axis").unwrap_or(1);
    let resolved = match rank {
        Some(rank) if axis < -(rank as i64) || axis >= rank as i64 => {
            return Err(fail(format!(
                "axis {axis} is out of range for a tensor of rank {rank}"
            )));
        }
        Some(rank) if axis < 0 => axis + rank as i64,
        _ if axis < 0 => {
            return Err(fail(format!(
                "negative axis {axis} on a tensor of unknown rank"
            )));
        }
        _ => axis,
    };
    Ok(Params {
        qtype,
        scales,
        zero_points,
        axis: Some(resolved as usize),
    })
}

/// The upper bound of the Clip a pair on activation `source` needs before it (see the
/// module doc): per-tensor, its range starts at 0, and `source` is computed by a node
/// other than a Relu or Clip.
fn folded_clip_top(model: &Model, source: &str, p: &Params) -> Option<f32> {
    let (qmin, qmax) = p.qtype.qrange()?;
    let starts_at_zero = p.axis.is_none() && p.zero_points[0] == qmin;
    let computed = !model.is_constant(source)
        && model
            .producer(source)
            .is_some_and(|id| !matches!(model.node(id).op_type(), "Relu" | "Clip"));
    (starts_at_zero && computed).then(|| (qmax - p.zero_points[0]) as f32 * p.scales[0])
}

/// True for the integer types of [`dtype_qtype`].
fn runnable(q: &QType) -> bool {
    matches!(q, QType::Int { bits: 8 | 16, .. })
}

/// The calibration type of an integer element type; int32 stands for a bias.
fn qtype_or_bias(dtype: Option<DType>) -> Option<QType> {
    match dtype? {
        DType::I32 => Some(QType::Int {
            bits: 32,
            signed: true,
        }),
        other => dtype_qtype(Some(other)),
    }
}

/// The calibration types fake quantization can run.
fn dtype_qtype(dtype: Option<DType>) -> Option<QType> {
    match dtype? {
        DType::I8 => Some(QType::INT8),
        DType::U8 => Some(QType::UINT8),
        DType::I16 => Some(QType::INT16),
        DType::U16 => Some(QType::UINT16),
        _ => None,
    }
}

/// The rank of a value: of its constant, or of its declared shape.
fn value_rank(model: &Model, value: &str) -> Result<Option<usize>, QdqImportError> {
    if let Some(t) = model.constant_tensor(value)? {
        return Ok(Some(t.shape().len()));
    }
    Ok(model
        .value_type(value)
        .and_then(|t| t.shape)
        .map(|s| s.len()))
}

/// What DequantizeLinear computes: `(q - zero_point) * scale` in f32, the integer
/// difference taken exactly first as onnxruntime does.
fn dequantize(q: &Tensor, p: &Params) -> Result<Tensor, String> {
    let shape = q.shape().to_vec();
    let values = q
        .to_i64_vec()
        .ok_or_else(|| format!("input is {}, not an integer tensor", q.dtype()))?;
    // Row-major: the channel of element i is (i / inner) % channels.
    let (inner, channels) = match p.axis {
        Some(axis) => {
            let channels = shape.get(axis).copied().unwrap_or(0);
            if channels != p.scales.len() {
                return Err(format!(
                    "{} scales for {channels} channels along axis {axis} of shape {shape:?}",
                    p.scales.len()
                ));
            }
            (shape[axis + 1..].iter().product::<usize>(), channels)
        }
        None => (1, 1),
    };
    let data = values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / inner.max(1)) % channels;
            (v - p.zero_points[c]) as f32 * p.scales[c]
        })
        .collect();
    Tensor::from_f32(&shape, data).map_err(|e| e.to_string())
}

/// The HzCalibration node standing for a QuantizeLinear → DequantizeLinear with
/// parameters `p` (see the module doc for the attributes).
fn calibration_node(
    name: String,
    input: String,
    output: String,
    tensor_type: TensorType,
    p: &Params,
) -> NodeProto {
    let (qmin, qmax) = p.qtype.qrange().expect("an integer type");
    let symmetric = p.zero_points.iter().all(|&z| z == 0);
    let thresholds: Option<Vec<f32>> = match (p.axis, qmin == 0) {
        (None, true) => {
            let (s, z) = (p.scales[0], p.zero_points[0]);
            Some(vec![(qmin - z) as f32 * s, (qmax - z) as f32 * s])
        }
        _ if symmetric => Some(p.scales.iter().map(|s| s * qmax as f32).collect()),
        _ => None,
    };
    let mut attribute = vec![string_attr("qtype", &p.qtype.to_string())];
    if let Some(t) = thresholds {
        attribute.push(floats_attr("thresholds", t));
    }
    attribute.push(floats_attr("scales", p.scales.clone()));
    attribute.push(ints_attr("zero_point", p.zero_points.clone()));
    if let Some(axis) = p.axis {
        attribute.push(int("axis", axis as i64));
    }
    attribute.push(int("constant", 2));
    attribute.push(string_attr("switch", "ON"));
    attribute.push(string_attr("tensor_type", tensor_type.as_str()));
    NodeProto {
        name: Some(name),
        op_type: Some(CALIBRATION_OP.to_string()),
        domain: Some(CALIBRATION_DOMAIN.to_string()),
        input: vec![input],
        output: vec![output],
        attribute,
        ..Default::default()
    }
}

fn unsupported(model: &Model, id: NodeId, message: String) -> QdqImportError {
    QdqImportError::Unsupported {
        node: model.node_name(id).to_string(),
        op: model.node(id).op_type().to_string(),
        message,
    }
}

/// Node and value names in use, to make new ones unique. The names of the
/// QuantizeLinear/DequantizeLinear nodes are free: those nodes go, and a model written
/// by `export-qdq` gets its calibration node names back.
struct Names(HashSet<String>);

impl Names {
    fn new(model: &Model) -> Names {
        let g = model.graph_proto();
        let replaced = |n: &NodeProto| matches!(n.op_type(), QUANTIZE | DEQUANTIZE);
        Names(
            g.node
                .iter()
                .flat_map(|n| {
                    let name = (!replaced(n)).then(|| n.name().to_string());
                    n.output.iter().cloned().chain(name)
                })
                .chain(g.initializer.iter().map(|t| t.name().to_string()))
                .chain(g.input.iter().map(|v| v.name().to_string()))
                .collect(),
        )
    }

    /// `base`, or `base_1`, `base_2`, ... whichever is free first.
    fn fresh(&mut self, base: String) -> String {
        let name = std::iter::once(base.clone())
            .chain((1..).map(|k| format!("{base}_{k}")))
            .find(|n| !self.0.contains(n))
            .expect("an unbounded sequence has a free name");
        self.0.insert(name.clone());
        name
    }
}
