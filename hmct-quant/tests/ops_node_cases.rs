//! ONNX conformance cases for the element-wise, reduction, shape and misc kernels,
//! through the shared node-case runner (tests/common/node_cases.rs).
//! `HMCT_CASES=substring` restricts the run; `HMCT_OPS_VERBOSE=1` lists unsupported
//! cases with their reasons.

mod common;

const OPS: &str = "Add Sub Mul Div Pow Sqrt Exp Log Abs Neg Reciprocal Floor Ceil Round Sign \
    Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Erf Tanh Sigmoid HardSigmoid \
    HardSwish Relu LeakyRelu PRelu Elu Selu Celu ThresholdedRelu Shrink Gelu Softplus Softsign \
    Mish Clip Min Max Sum Mean Equal Less LessOrEqual Greater GreaterOrEqual Not And Or Xor \
    Where IsNaN IsInf Cast CastLike Mod BitShift ReduceMean ReduceSum ReduceMax ReduceMin \
    ReduceProd ReduceL1 ReduceL2 ReduceSumSquare ReduceLogSumExp ReduceLogSum ArgMax ArgMin \
    TopK CumSum Softmax LogSoftmax Hardmax Reshape Flatten Transpose Squeeze Unsqueeze Concat \
    Split Slice Gather GatherElements GatherND ScatterND ScatterElements Scatter Expand Tile \
    Pad DepthToSpace SpaceToDepth Shape Size ConstantOfShape Range Identity Dropout NonZero \
    Trilu Constant EyeLike OneHot";

#[test]
fn node_cases_of_elementwise_reduce_shape_misc_ops() {
    common::node_cases::check(OPS, "HMCT_OPS_VERBOSE");
}
