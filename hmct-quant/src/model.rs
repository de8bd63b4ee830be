//! Planning an hmct-ir [`Model`]: its calibration nodes become fake-quant steps with
//! the parameters the file gives (HZCALIBRATION.md §2-3).

use std::collections::HashMap;

use hmct_ir::{CalibrationNode, Model, QType as IrQType};

use crate::fake_quant::{FakeQuant, QType};
use crate::plan::{CalibrationSetting, Plan, PlanError, PlanOptions, normalize_domain};

/// Compiles a loaded model. Calibration nodes take their parameters from the file;
/// a node whose parameters cannot run (unknown qtype, bad threshold) is reported here.
pub fn plan_model(model: &Model) -> Result<Plan, PlanError> {
    let opsets: HashMap<String, i64> = model
        .proto()
        .opset_import
        .iter()
        .map(|o| (normalize_domain(o.domain()).to_string(), o.version()))
        .collect();
    let resolver =
        |id: usize, _node: &hmct_proto::onnx::NodeProto| -> Result<CalibrationSetting, String> {
            let cal = model.calibration(id).ok_or("not a calibration node")?;
            Ok(CalibrationSetting {
                switch_on: cal.switch_on(),
                fake_quant: fake_quant_for(model, &cal, None)?,
            })
        };
    let options = PlanOptions {
        opsets,
        base_dir: model.base_dir(),
        calibration: Some(&resolver),
    };
    Plan::build(model.graph_proto(), &options)
}

fn to_kernel_qtype(q: &IrQType) -> Result<QType, String> {
    match q {
        IrQType::Int { bits, signed } => Ok(QType::Int {
            bits: u32::from(*bits),
            signed: *signed,
        }),
        IrQType::Float16 => Ok(QType::Float16),
        IrQType::Float32 => Ok(QType::Float32),
        IrQType::Unknown(s) => Err(format!(
            "qtype '{s}' is not supported, so this node cannot run"
        )),
    }
}

/// The fake quantization a calibration node performs, with its own qtype or with
/// `qtype` instead (the same thresholds at another precision, e.g. int16).
pub fn fake_quant_for(
    model: &Model,
    cal: &CalibrationNode,
    qtype: Option<&IrQType>,
) -> Result<FakeQuant, String> {
    let file_qtype = cal.qtype();
    let target = qtype.unwrap_or(&file_qtype);
    let kernel_qtype = to_kernel_qtype(target)?;
    if matches!(kernel_qtype, QType::Float16 | QType::Float32) {
        return FakeQuant::from_thresholds(kernel_qtype, &[], None).map_err(|e| e.to_string());
    }
    let per_channel = cal.is_per_channel();
    let axis = if per_channel {
        let axis = cal.axis().unwrap_or(1);
        let resolved = if axis >= 0 {
            axis
        } else {
            let rank = model
                .constant_tensor(cal.input())
                .ok()
                .flatten()
                .map(|t| t.shape().len() as i64)
                .ok_or_else(|| format!("negative axis {axis} on a tensor of unknown rank"))?;
            axis + rank
        };
        if resolved < 0 {
            return Err(format!("axis {axis} is out of range"));
        }
        Some(resolved as usize)
    } else {
        None
    };
    let take = |v: Vec<f32>| {
        if per_channel {
            v
        } else {
            v.into_iter().take(1).collect()
        }
    };

    if target == &file_qtype {
        // The file's own parameters: derived scales (authoritative `scales` when
        // `constant == 2`) and zero points.
        let scales = take(cal.scales());
        // Explicit nonzero zero points count on any node, per-channel ones included:
        // a QDQ model's uint8 per-channel weights have them (zero point 128).
        let zero_point = cal.zero_point();
        let zero_points: Vec<i32> = if cal.is_asymmetric() || zero_point.iter().any(|&z| z != 0) {
            zero_point
                .into_iter()
                .take(scales.len())
                .map(|z| z as i32)
                .collect()
        } else {
            Vec::new()
        };
        return FakeQuant::from_scales(kernel_qtype, scales, zero_points, axis)
            .and_then(|fq| fq.regrouped(conv_transpose_groups(model, cal)))
            .map_err(|e| e.to_string());
    }
    // Another precision: keep the float range, re-derive the scales.
    let mut thresholds = cal.thresholds();
    if thresholds.is_empty() || cal.constant() == 2 {
        let (qmin, qmax) = file_qtype
            .qrange()
            .ok_or("no thresholds and no integer range to derive them from")?;
        let zero_point = cal.zero_point();
        thresholds = cal
            .scales()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                // The largest magnitude the file's integers reach around their zero
                // point (int8 with zero point -100 reaches 227 steps, not 127).
                let z = zero_point.get(i).copied().unwrap_or(0);
                let reach = if z == 0 {
                    qmax
                } else {
                    (qmin - z).abs().max((qmax - z).abs())
                };
                s * reach as f32
            })
            .collect();
    }
    let thresholds = if cal.is_asymmetric() && !per_channel {
        thresholds
    } else {
        take(thresholds)
    };
    FakeQuant::from_thresholds(kernel_qtype, &thresholds, axis)
        .and_then(|fq| fq.regrouped(conv_transpose_groups(model, cal)))
        .map_err(|e| e.to_string())
}

/// The group count by which a weight calibration node's channels are regrouped: that
/// of the grouped ConvTranspose it feeds (see [`hmct_ir::conv_transpose_groups`]),
/// unless the node has one scale per entry of axis 1, the literal per-axis reading
/// QDQ files hold (e.g. onnxruntime's quantizer). Only a grouped weight is decoded.
fn conv_transpose_groups(model: &Model, cal: &CalibrationNode) -> usize {
    let groups = hmct_ir::conv_transpose_groups(model, cal.output());
    if groups == 1 {
        return 1;
    }
    let literal = model
        .constant_tensor(cal.input())
        .ok()
        .flatten()
        .is_some_and(|w| w.shape().get(1) == Some(&cal.scales().len()));
    if literal { 1 } else { groups }
}
