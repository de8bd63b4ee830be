//! Running one kernel the way the planner builds it: attributes, then `build_kernel`
//! on a node whose inputs are all present and none constant.

use hmct_proto::onnx::AttributeProto;
use hmct_proto::onnx::attribute_proto::AttributeType;
use hmct_quant::ops::{Attrs, NodeSpec, build_kernel};
use hmct_tensor::Tensor;

/// An INTS attribute.
pub fn ints<T: Copy + TryInto<i64>>(name: &str, v: &[T]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v
            .iter()
            .map(|&x| {
                x.try_into()
                    .unwrap_or_else(|_| panic!("{name} fits in i64"))
            })
            .collect(),
        ..Default::default()
    }
}

/// An INT attribute.
pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

/// Runs `op_type` (standard domain, `opset`) with `attrs` on `inputs` and returns its
/// first output.
pub fn run_kernel(
    op_type: &str,
    opset: i64,
    attrs: &[AttributeProto],
    inputs: &[&Tensor],
) -> Tensor {
    let present = vec![true; inputs.len()];
    let consts = vec![None; inputs.len()];
    let spec = NodeSpec {
        name: op_type,
        op_type,
        domain: "",
        opset,
        attrs: Attrs::new(attrs),
        num_inputs: inputs.len(),
        inputs_present: &present,
        num_outputs: 1,
        const_inputs: &consts,
        stable_inputs: &consts.iter().map(Option::is_some).collect::<Vec<_>>(),
    };
    let inputs: Vec<Option<&Tensor>> = inputs.iter().map(|&t| Some(t)).collect();
    build_kernel(&spec).unwrap().run(&inputs).unwrap().remove(0)
}

/// Runs `f` on a rayon pool of `threads` threads.
pub fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// The bits of every value of an f32 tensor, to compare results exactly.
pub fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}
