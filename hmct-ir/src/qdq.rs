//! Export of a calibrated model as a standard QDQ model (HZCALIBRATION.md §3): every
//! ON integer calibration node becomes QuantizeLinear → DequantizeLinear, float16
//! a Cast pair, and OFF / float32 nodes disappear, so any ONNX runtime computes what
//! our interpreter computes on the calibrated model.
//!
//! Which QuantizeLinear: the standard (default-domain) op exists from opset 10, takes
//! `axis` (per-channel weights) from 13 and 16-bit and 4-bit types from 21. By
//! default the export writes the standard ops, which every runtime and deployment
//! toolchain reads, and when the model's default-domain opset is older than they
//! need it raises the opset to the lowest version that has them, converting every
//! node whose operator changed on the way ([`crate::raise_opset`]: attributes that
//! became inputs, changed defaults, deprecated ops) so the model still computes the
//! same; a node that cannot be converted stops the export with its name. Nothing
//! else is written at a version the model does not declare. onnxruntime's
//! `com.microsoft` QuantizeLinear / DequantizeLinear (axis, 16 and 4 bits at any
//! opset) are used only when asked for: they keep the opset but run on onnxruntime
//! alone.

use hmct_proto::onnx::{
    AttributeProto, NodeProto, OperatorSetIdProto, TensorProto, tensor_proto::DataType,
};
use hmct_tensor::DType;

use hmct_tensor::Tensor;

use crate::attr::{int as int_attr, ints as ints_attr};
use crate::{CALIBRATION_DOMAIN, Model, NodeId, OpsetError, QType, RaisedOpset, raise_opset};

/// Domain of the QuantizeLinear / DequantizeLinear nodes written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QdqDomain {
    /// The default ONNX domain (needs opset 13 for axis, 21 for 16/4-bit types).
    Standard,
    /// onnxruntime's contrib ops `com.microsoft` (any opset; onnxruntime only).
    Microsoft,
}

impl QdqDomain {
    pub fn as_str(self) -> &'static str {
        match self {
            QdqDomain::Standard => "",
            QdqDomain::Microsoft => "com.microsoft",
        }
    }
}

/// How to export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QdqOptions {
    /// `None` or `Some(Standard)`: the standard ops, raising the opset when needed.
    pub domain: Option<QdqDomain>,
}

/// The exported model and what was done.
#[derive(Debug)]
pub struct QdqExport {
    pub model: Model,
    pub domain: QdqDomain,
    /// The model's default-domain opset.
    pub opset: i64,
    /// The lowest default-domain opset at which the standard ops would do.
    pub standard_needs: i64,
    /// Set when the export raised the default-domain opset (to `standard_needs`).
    pub raised: Option<RaisedOpset>,
    /// Calibration nodes written as QuantizeLinear/DequantizeLinear.
    pub quantized: usize,
    /// float16 calibration nodes written as a Cast pair.
    pub cast: usize,
    /// OFF and float32 calibration nodes removed.
    pub removed: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum QdqError {
    #[error("calibration node '{node}': {message}")]
    Unsupported { node: String, message: String },
    #[error(
        "the standard QuantizeLinear/DequantizeLinear need default-domain opset {needed} for this model, which declares {opset}, and raising it failed"
    )]
    Opset {
        opset: i64,
        needed: i64,
        source: OpsetError,
    },
    #[error(transparent)]
    Ir(#[from] crate::IrError),
}

/// What one calibration node becomes.
enum Plan {
    Remove,
    Cast,
    Qdq {
        dtype: DataType,
        bits: u8,
        scales: Vec<f32>,
        zero_points: Vec<i64>,
        axis: Option<i64>,
        regroup: Option<Regroup>,
    },
}

/// A per-channel weight of a ConvTranspose with `groups > 1`, `[C_in, C_out/g, k..]`:
/// its output channels are not one axis (HZCALIBRATION §3), so the export quantizes
/// the same values laid out as `[C_in/g, C_out, k..]` (channels on axis 1) and puts
/// them back with Reshape → Transpose → Reshape, which runtimes fold as constants.
struct Regroup {
    groups: usize,
    /// `[C_in, C_out/g, k..]`.
    shape: Vec<usize>,
    /// The weight in the `[C_in/g, C_out, k..]` layout.
    permuted: Vec<f32>,
}

impl Regroup {
    fn new(weight: &Tensor, groups: usize) -> Option<Regroup> {
        let data = weight.as_f32()?;
        let shape = weight.shape().to_vec();
        if shape.len() < 2 || groups < 2 || shape[0] % groups != 0 {
            return None;
        }
        let (c_in, per_group) = (shape[0], shape[1]);
        let inner: usize = shape[2..].iter().product();
        let rows = c_in / groups;
        let values: Vec<f32> = data.iter().copied().collect();
        let mut permuted = Vec::with_capacity(values.len());
        // Row a of the new layout holds, for each group, that group's row a.
        for a in 0..rows {
            for g in 0..groups {
                let i = g * rows + a;
                permuted
                    .extend_from_slice(&values[i * per_group * inner..(i + 1) * per_group * inner]);
            }
        }
        Some(Regroup {
            groups,
            shape,
            permuted,
        })
    }

    fn permuted_dims(&self) -> Vec<i64> {
        let mut dims: Vec<i64> = self.shape.iter().map(|&d| d as i64).collect();
        dims[0] /= self.groups as i64;
        dims[1] *= self.groups as i64;
        dims
    }

    /// `[C_in/g, g, C_out/g, k..]`.
    fn split_dims(&self) -> Vec<i64> {
        let mut dims: Vec<i64> = self.shape.iter().map(|&d| d as i64).collect();
        dims[0] /= self.groups as i64;
        dims.insert(1, self.groups as i64);
        dims
    }
}

/// Rewrites every calibration node of `model` (see the module doc). Tensor names are
/// kept: each replacement ends in the calibration node's output tensor.
pub fn export_qdq(model: &Model, options: &QdqOptions) -> Result<QdqExport, QdqError> {
    let ids = model.calibration_nodes();
    let mut plans: Vec<(NodeId, Plan)> = Vec::with_capacity(ids.len());
    let mut standard_needs = 10;
    for &id in &ids {
        let plan = plan_node(model, id)?;
        if let Plan::Qdq { bits, axis, .. } = &plan {
            if axis.is_some() {
                standard_needs = standard_needs.max(13);
            }
            if *bits != 8 {
                standard_needs = standard_needs.max(21);
            }
        }
        plans.push((id, plan));
    }
    // `opset("")` also finds an import spelled "ai.onnx".
    let opset = model.opset("").unwrap_or(1);
    let domain = options.domain.unwrap_or(QdqDomain::Standard);

    let mut proto = model.proto().clone();
    let graph = proto.graph.get_or_insert_with(Default::default);
    let mut taken: std::collections::HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| {
            n.output
                .iter()
                .cloned()
                .chain(std::iter::once(n.name().to_string()))
        })
        .chain(graph.initializer.iter().map(|t| t.name().to_string()))
        .chain(graph.input.iter().map(|v| v.name().to_string()))
        .collect();
    let mut fresh = |base: String| {
        let name = std::iter::once(base.clone())
            .chain((1..).map(|k| format!("{base}_{k}")))
            .find(|n| !taken.contains(n))
            .expect("an unbounded sequence has a free name");
        taken.insert(name.clone());
        name
    };

    // Renames of removed nodes' outputs to their inputs, applied to readers below.
    let mut renames: std::collections::HashMap<String, String> = Default::default();
    let mut replacement: Vec<Option<Vec<NodeProto>>> = vec![None; graph.node.len()];
    let (mut quantized, mut cast, mut removed) = (0, 0, 0);
    let mut orphaned: Vec<String> = Vec::new();
    for (id, plan) in plans {
        let cal = model
            .calibration(id)
            .expect("calibration_nodes lists calibration nodes");
        let (name, input, output) = (
            cal.name(),
            cal.input().to_string(),
            cal.output().to_string(),
        );
        let nodes = match plan {
            Plan::Remove if !model.is_graph_output(&output) => {
                removed += 1;
                renames.insert(output, input);
                Vec::new()
            }
            Plan::Remove => {
                removed += 1;
                vec![node("Identity", "", name, vec![input], &output, vec![])]
            }
            Plan::Cast => {
                cast += 1;
                let half = fresh(format!("{name}_float16"));
                vec![
                    node(
                        "Cast",
                        "",
                        &fresh(format!("{name}_to_float16")),
                        vec![input],
                        &half,
                        vec![int_attr("to", DataType::Float16 as i64)],
                    ),
                    node(
                        "Cast",
                        "",
                        name,
                        vec![half],
                        &output,
                        vec![int_attr("to", DataType::Float as i64)],
                    ),
                ]
            }
            Plan::Qdq {
                dtype,
                bits: _,
                scales,
                zero_points,
                axis,
                regroup,
            } => {
                quantized += 1;
                let dims = if axis.is_some() {
                    vec![scales.len() as i64]
                } else {
                    vec![]
                };
                let scale_name = fresh(format!("{name}_scale"));
                let zp_name = fresh(format!("{name}_zero_point"));
                let q_name = fresh(format!("{name}_quantized"));
                graph.initializer.push(TensorProto {
                    name: Some(scale_name.clone()),
                    dims: dims.clone(),
                    data_type: Some(DataType::Float as i32),
                    float_data: scales,
                    ..Default::default()
                });
                graph.initializer.push(TensorProto {
                    name: Some(zp_name.clone()),
                    dims,
                    data_type: Some(dtype as i32),
                    raw_data: Some(integer_bytes(dtype, &zero_points)),
                    ..Default::default()
                });
                let attrs: Vec<AttributeProto> =
                    axis.map(|a| int_attr("axis", a)).into_iter().collect();
                let params = vec![scale_name, zp_name];
                let (q_input, dq_output) = match &regroup {
                    None => (input, output.clone()),
                    Some(r) => {
                        // The weight in its old layout is dead once nothing else reads it.
                        if model.consumers(&input).len() == 1 && !model.is_graph_output(&input) {
                            orphaned.push(input.clone());
                        }
                        let permuted = fresh(format!("{name}_regrouped_weight"));
                        graph.initializer.push(TensorProto {
                            name: Some(permuted.clone()),
                            dims: r.permuted_dims(),
                            data_type: Some(DataType::Float as i32),
                            float_data: r.permuted.clone(),
                            ..Default::default()
                        });
                        (permuted, fresh(format!("{name}_regrouped")))
                    }
                };
                let mut nodes = vec![
                    node(
                        "QuantizeLinear",
                        domain.as_str(),
                        &fresh(format!("{name}_quantize")),
                        [vec![q_input], params.clone()].concat(),
                        &q_name,
                        attrs.clone(),
                    ),
                    node(
                        "DequantizeLinear",
                        domain.as_str(),
                        name,
                        [vec![q_name], params].concat(),
                        &dq_output,
                        attrs,
                    ),
                ];
                if let Some(r) = regroup {
                    let mut shape_init = |base: String, dims: Vec<i64>| {
                        let shape_name = fresh(base);
                        graph.initializer.push(TensorProto {
                            name: Some(shape_name.clone()),
                            dims: vec![dims.len() as i64],
                            data_type: Some(DataType::Int64 as i32),
                            int64_data: dims,
                            ..Default::default()
                        });
                        shape_name
                    };
                    let split = shape_init(format!("{name}_split_shape"), r.split_dims());
                    let original = shape_init(
                        format!("{name}_weight_shape"),
                        r.shape.iter().map(|&d| d as i64).collect(),
                    );
                    let (split_out, swapped) = (
                        fresh(format!("{name}_split")),
                        fresh(format!("{name}_swapped")),
                    );
                    let mut perm: Vec<i64> = (0..r.shape.len() as i64 + 1).collect();
                    perm.swap(0, 1);
                    nodes.extend([
                        node(
                            "Reshape",
                            "",
                            &fresh(format!("{name}_split_groups")),
                            vec![dq_output, split],
                            &split_out,
                            vec![],
                        ),
                        node(
                            "Transpose",
                            "",
                            &fresh(format!("{name}_groups_first")),
                            vec![split_out],
                            &swapped,
                            vec![ints_attr("perm", perm)],
                        ),
                        node(
                            "Reshape",
                            "",
                            &fresh(format!("{name}_merge_groups")),
                            vec![swapped, original],
                            &output,
                            vec![],
                        ),
                    ]);
                }
                nodes
            }
        };
        replacement[id] = Some(nodes);
    }

    let old_nodes = std::mem::take(&mut graph.node);
    for (id, old) in old_nodes.into_iter().enumerate() {
        match replacement[id].take() {
            Some(nodes) => graph.node.extend(nodes),
            None => graph.node.push(old),
        }
    }
    for n in &mut graph.node {
        for v in &mut n.input {
            // A chain of removed nodes renames in several steps.
            while let Some(to) = renames.get(v.as_str()) {
                *v = to.clone();
            }
        }
    }
    graph.value_info.retain(|v| !renames.contains_key(v.name()));
    graph
        .initializer
        .retain(|t| !orphaned.iter().any(|o| o == t.name()));
    graph
        .input
        .retain(|v| !orphaned.iter().any(|o| o == v.name()));

    let horizon_left = graph.node.iter().any(|n| n.domain() == CALIBRATION_DOMAIN);
    if !horizon_left {
        proto
            .opset_import
            .retain(|o| o.domain() != CALIBRATION_DOMAIN);
    }
    if domain == QdqDomain::Microsoft
        && quantized > 0
        && !proto
            .opset_import
            .iter()
            .any(|o| o.domain() == "com.microsoft")
    {
        proto.opset_import.push(OperatorSetIdProto {
            domain: Some("com.microsoft".into()),
            version: Some(1),
        });
    }
    // Last, so that the conversions see the final graph; the QDQ nodes written above
    // need no conversion.
    let raised = if domain == QdqDomain::Standard && quantized > 0 && opset < standard_needs {
        let raised = raise_opset(&mut proto, standard_needs).map_err(|source| QdqError::Opset {
            opset,
            needed: standard_needs,
            source,
        })?;
        Some(raised)
    } else {
        None
    };
    let model = Model::from_proto(proto, model.base_dir().map(Into::into))?;
    Ok(QdqExport {
        model,
        domain,
        opset,
        standard_needs,
        raised,
        quantized,
        cast,
        removed,
    })
}

fn plan_node(model: &Model, id: NodeId) -> Result<Plan, QdqError> {
    let cal = model.calibration(id).expect("a calibration node");
    let unsupported = |message: String| QdqError::Unsupported {
        node: cal.name().to_string(),
        message,
    };
    if let Some(extra) = cal
        .node()
        .output
        .iter()
        .skip(1)
        .find(|o| !o.is_empty() && (!model.consumers(o).is_empty() || model.is_graph_output(o)))
    {
        return Err(unsupported(format!(
            "its extra output '{extra}' is used; a QDQ pair has one output"
        )));
    }
    if !cal.switch_on() {
        return Ok(Plan::Remove);
    }
    let qtype = cal.qtype();
    if let Some(dtype) = model.value_type(cal.input()).and_then(|t| t.dtype())
        && dtype != DType::F32
        && qtype != QType::Float32
    {
        return Err(unsupported(format!(
            "input is {dtype}; only float32 tensors are exported"
        )));
    }
    let (bits, signed) = match qtype {
        QType::Float32 => return Ok(Plan::Remove),
        QType::Float16 => return Ok(Plan::Cast),
        QType::Unknown(s) => return Err(unsupported(format!("qtype '{s}' is not supported"))),
        QType::Int { bits, signed } => (bits, signed),
    };
    let dtype = match (bits, signed) {
        (8, true) => DataType::Int8,
        (8, false) => DataType::Uint8,
        (16, true) => DataType::Int16,
        (16, false) => DataType::Uint16,
        (4, true) => DataType::Int4,
        (4, false) => DataType::Uint4,
        _ => {
            return Err(unsupported(format!(
                "{qtype} has no QuantizeLinear type (int4/8/16, uint4/8/16)"
            )));
        }
    };
    cal.validate()?;
    let scales = cal.scales();
    let zero_points = cal.zero_point();
    let axis = cal.is_per_channel().then(|| cal.axis().unwrap_or(1));
    let groups = crate::conv_transpose_groups(model, cal.output());
    let regroup = if cal.is_per_channel() && groups > 1 {
        let weight = model.constant_tensor(cal.input())?.ok_or_else(|| {
            unsupported("per-channel weight of a grouped ConvTranspose is not a constant".into())
        })?;
        if axis != Some(1) {
            return Err(unsupported(format!(
                "per-channel weight of a grouped ConvTranspose along axis {}, not 1",
                axis.unwrap_or_default()
            )));
        }
        let regroup = Regroup::new(&weight, groups).ok_or_else(|| {
            unsupported(format!(
                "{} weight of shape {:?} cannot be split into {groups} groups",
                weight.dtype(),
                weight.shape()
            ))
        })?;
        if scales.len() != groups * regroup.shape[1] {
            return Err(unsupported(format!(
                "{} scales for {groups} groups of {} output channels",
                scales.len(),
                regroup.shape[1]
            )));
        }
        Some(regroup)
    } else {
        None
    };
    if axis.is_none() && (scales.len() != 1 || zero_points.len() != 1) {
        return Ok(Plan::Qdq {
            dtype,
            bits,
            scales: scales[..1].to_vec(),
            zero_points: zero_points[..1.min(zero_points.len())].to_vec(),
            axis,
            regroup: None,
        });
    }
    if zero_points.len() != scales.len() {
        return Err(unsupported(format!(
            "{} zero points for {} scales",
            zero_points.len(),
            scales.len()
        )));
    }
    Ok(Plan::Qdq {
        dtype,
        bits,
        scales,
        zero_points,
        axis,
        regroup,
    })
}

/// Little-endian raw data of integer tensors; 4-bit values two to a byte, low
/// nibble first, as ONNX packs them.
fn integer_bytes(dtype: DataType, values: &[i64]) -> Vec<u8> {
    match dtype {
        DataType::Int16 | DataType::Uint16 => values
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        DataType::Int4 | DataType::Uint4 => values
            .chunks(2)
            .map(|pair| {
                let lo = (pair[0] as u8) & 0x0f;
                let hi = pair.get(1).map_or(0, |&v| (v as u8) & 0x0f);
                lo | (hi << 4)
            })
            .collect(),
        _ => values.iter().map(|&v| v as u8).collect(),
    }
}

fn node(
    op: &str,
    domain: &str,
    name: &str,
    inputs: Vec<String>,
    output: &str,
    attribute: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        domain: (!domain.is_empty()).then(|| domain.into()),
        name: Some(name.into()),
        input: inputs,
        output: vec![output.into()],
        attribute,
        ..Default::default()
    }
}
