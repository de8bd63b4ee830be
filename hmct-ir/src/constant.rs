//! The value of a `Constant` node, in any of its attribute forms.

use std::path::Path;

use hmct_proto::onnx::TensorProto;
use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{Tensor, TensorError};

use crate::{IrError, Model, NodeId};

/// [`hmct_tensor::tensor_from_proto`], refusing shapes ndarray cannot represent
/// first: a zero dimension makes the element count 0, but ndarray still rejects
/// (and the conversion would panic on) shapes whose other dimensions multiply past
/// `isize::MAX`, and any bytes may reach here.
pub(crate) fn tensor_from_proto(
    t: &TensorProto,
    base_dir: Option<&Path>,
) -> Result<Tensor, TensorError> {
    let fits = t
        .dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1i64, |acc, &d| acc.checked_mul(d.max(1)))
        .is_some_and(|n| isize::try_from(n).is_ok());
    if !fits {
        return Err(TensorError::Invalid {
            context: format!("tensor '{}'", t.name()),
            message: format!("shape {:?} is too large", t.dims),
        });
    }
    hmct_tensor::tensor_from_proto(t, base_dir)
}

/// Reads the tensor a `Constant` node outputs (`value`, `value_float(s)`,
/// `value_int(s)`, `value_string(s)`; `sparse_value` is not supported).
pub(crate) fn constant_node_value(model: &Model, id: NodeId) -> Result<Tensor, IrError> {
    let node = model.node(id);
    let err = |message: String| IrError::InvalidConstant {
        file: model.file().to_string(),
        node: node.name().to_string(),
        message,
    };
    let [attr] = node.attribute.as_slice() else {
        return Err(err(format!(
            "needs exactly one value attribute, has {}",
            node.attribute.len()
        )));
    };
    let vector = |len: usize| IxDyn(&[len]);
    let tensor = match attr.name() {
        "value" => {
            let t = attr
                .t
                .as_ref()
                .ok_or_else(|| err("attribute 'value' holds no tensor".into()))?;
            tensor_from_proto(t, model.base_dir()).map_err(|error| IrError::Tensor {
                file: model.file().to_string(),
                value: node.output.first().cloned().unwrap_or_default(),
                error,
            })?
        }
        "value_float" => Tensor::scalar_f32(
            attr.f
                .ok_or_else(|| err("'value_float' holds no float".into()))?,
        ),
        "value_floats" => Tensor::F32(
            ArrayD::from_shape_vec(vector(attr.floats.len()), attr.floats.clone())
                .expect("1-D shape matches its length"),
        ),
        "value_int" => Tensor::I64(ArrayD::from_elem(
            IxDyn(&[]),
            attr.i
                .ok_or_else(|| err("'value_int' holds no int".into()))?,
        )),
        "value_ints" => Tensor::I64(
            ArrayD::from_shape_vec(vector(attr.ints.len()), attr.ints.clone())
                .expect("1-D shape matches its length"),
        ),
        "value_string" => {
            let s = attr
                .s
                .as_ref()
                .ok_or_else(|| err("'value_string' holds no string".into()))?;
            Tensor::String(ArrayD::from_elem(
                IxDyn(&[]),
                String::from_utf8_lossy(s).into_owned(),
            ))
        }
        "value_strings" => Tensor::String(
            ArrayD::from_shape_vec(
                vector(attr.strings.len()),
                attr.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )
            .expect("1-D shape matches its length"),
        ),
        other => return Err(err(format!("unsupported value attribute '{other}'"))),
    };
    Ok(tensor)
}
