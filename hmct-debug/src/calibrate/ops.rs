//! Which operators are quantized, which of their inputs are activations and weights,
//! and the channel axis of each kind of weight.

/// Operators whose float inputs get activation calibration nodes by default.
///
/// The set follows what integer accelerators run natively: convolutions and matrix
/// products, elementwise arithmetic, concatenation, pooling, resizing, padding, the
/// activation functions, softmax, mean reductions and the normalizations that are not
/// usually folded away. Deliberately left out:
/// - `Relu` and `Clip`: toolchains fuse them into the producing Conv, and the
///   calibration search (HZCALIBRATION.md §5) looks through them, so the consumer
///   after them is what gets quantized;
/// - `BatchNormalization`: folded into the preceding Conv before calibration;
/// - layout and indexing ops (`Reshape`, `Transpose`, `Flatten`, `Slice`, `Gather`,
///   `Split`, `Squeeze`, ...): they move values without computing new ones;
/// - `GlobalMaxPool`, `ReduceMax`: skippable like MaxPool but with no arithmetic.
///   (MaxPool itself is in the set because accelerators run it on int8 data.)
pub const DEFAULT_OP_TYPES: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sum",
    "Mean",
    "Concat",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Resize",
    "Upsample",
    "Pad",
    "Softmax",
    "LogSoftmax",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Swish",
    "Tanh",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Selu",
    "Celu",
    "ThresholdedRelu",
    "Softplus",
    "Softsign",
    "Mish",
    "Gelu",
    "Erf",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
];

/// Every operator of the standard ONNX domain (onnx 1.23), for checking user input.
#[rustfmt::skip]
pub const ONNX_OP_TYPES: &[&str] = &[
    "Abs", "Acos", "Acosh", "Add", "AffineGrid", "And", "ArgMax", "ArgMin", "Asin",
    "Asinh", "Atan", "Atanh", "Attention", "AveragePool", "BatchNormalization",
    "Bernoulli", "BitCast", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr",
    "BitwiseXor", "BlackmanWindow", "Cast", "CastLike", "CausalConvWithState", "Ceil",
    "Celu", "CenterCropPad", "Clip", "Col2Im", "Compress", "Concat", "ConcatFromSequence",
    "Constant", "ConstantOfShape", "Conv", "ConvInteger", "ConvTranspose", "Cos", "Cosh",
    "CumProd", "CumSum", "DFT", "DeformConv", "DepthToSpace", "DequantizeLinear", "Det",
    "Div", "Dropout", "DynamicQuantizeLinear", "Einsum", "Elu", "Equal", "Erf", "Exp",
    "Expand", "EyeLike", "Flatten", "Floor", "GRU", "Gather", "GatherElements", "GatherND",
    "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "GridSample", "GroupNormalization", "HammingWindow", "HannWindow",
    "HardSigmoid", "HardSwish", "Hardmax", "Identity", "If", "ImageDecoder",
    "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LSTM", "LayerNormalization",
    "LeakyRelu", "Less", "LessOrEqual", "LinearAttention", "Log", "LogSoftmax", "Loop",
    "LpNormalization", "LpPool", "MatMul", "MatMulInteger", "Max", "MaxPool", "MaxRoiPool",
    "MaxUnpool", "Mean", "MeanVarianceNormalization", "MelWeightMatrix", "Min", "Mish",
    "Mod", "Mul", "Multinomial", "Neg", "NegativeLogLikelihoodLoss", "NonMaxSuppression",
    "NonZero", "Not", "OneHot", "Optional", "OptionalGetElement", "OptionalHasElement",
    "Or", "PRelu", "Pad", "Pow", "QLinearConv", "QLinearMatMul", "QuantizeLinear",
    "RMSNormalization", "RNN", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "RegexFullMatch", "Relu", "Reshape", "Resize", "ReverseSequence",
    "RoiAlign", "RotaryEmbedding", "Round", "STFT", "Scan", "Scatter", "ScatterElements",
    "ScatterND", "Selu", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
    "SequenceErase", "SequenceInsert", "SequenceLength", "SequenceMap", "Shape", "Shrink",
    "Sigmoid", "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax",
    "SoftmaxCrossEntropyLoss", "Softplus", "Softsign", "SpaceToDepth", "Split",
    "SplitToSequence", "Sqrt", "Squeeze", "StringConcat", "StringNormalizer",
    "StringSplit", "Sub", "Sum", "SwiGLU", "Swish", "Tan", "Tanh", "TensorScatter",
    "TfIdfVectorizer", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unique",
    "Unsqueeze", "Upsample", "Where", "Xor",
];

/// True for an operator of the standard ONNX domain.
pub fn is_onnx_op(op_type: &str) -> bool {
    ONNX_OP_TYPES.binary_search(&op_type).is_ok()
}

/// Inputs of `op_type` that are data to quantize, among `n` inputs. Other inputs
/// (biases, shapes, scales, slopes, normalization parameters) stay float.
pub fn data_inputs(op_type: &str, n: usize) -> Vec<usize> {
    match op_type {
        // Variadic or binary ops: every operand is data.
        "Add" | "Sub" | "Mul" | "Div" | "Sum" | "Mean" | "Concat" | "MatMul" => (0..n).collect(),
        // Input and weight; a weight that is not a constant is quantized as data.
        "Conv" | "ConvTranspose" | "Gemm" => (0..n.min(2)).collect(),
        _ => (0..n.min(1)).collect(),
    }
}

/// How a constant weight input is calibrated: one threshold per output channel along
/// `axis` (`None`: one threshold for the whole tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightLayout {
    pub axis: Option<usize>,
    pub group: i64,
    /// A grouped ConvTranspose: output channels spread over axes 0 and 1.
    pub conv_transpose: bool,
}

impl WeightLayout {
    /// The group count the channels are regrouped by (1: they are one axis).
    pub fn regrouped(&self) -> usize {
        if self.conv_transpose && self.group > 1 {
            self.group as usize
        } else {
            1
        }
    }
}

/// The weight layout of input `index` of a node, when that input is a weight
/// position (`rank` is the weight's rank). `trans_b` and `group` are the node's
/// attributes (`transB` of Gemm, `group` of Conv/ConvTranspose).
pub fn weight_layout(
    op_type: &str,
    index: usize,
    rank: usize,
    trans_b: bool,
    group: i64,
) -> Option<WeightLayout> {
    if index != 1 {
        return None;
    }
    let axis = match op_type {
        // [M, C/group, k...]: output channels first.
        "Conv" => 0,
        // [C, M/group, k...]: output channels (per group) second.
        "ConvTranspose" => 1,
        // B is [K, N], or [N, K] with transB.
        "Gemm" => usize::from(!trans_b),
        // B is [..., K, N]; a vector B has no channel axis.
        "MatMul" if rank >= 2 => rank - 1,
        "MatMul" => {
            return Some(WeightLayout {
                axis: None,
                group: 1,
                conv_transpose: false,
            });
        }
        _ => return None,
    };
    (axis < rank).then_some(WeightLayout {
        axis: Some(axis),
        group: if matches!(op_type, "Conv" | "ConvTranspose") {
            group
        } else {
            1
        },
        conv_transpose: op_type == "ConvTranspose",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmct_ir::close_matches;

    #[test]
    fn op_list_is_sorted_and_covers_the_defaults() {
        assert!(ONNX_OP_TYPES.windows(2).all(|w| w[0] < w[1]));
        for op in DEFAULT_OP_TYPES {
            assert!(is_onnx_op(op), "{op}");
        }
        assert!(!is_onnx_op("Convv"));
    }

    #[test]
    fn weight_axes() {
        let l = |op, rank, t, g| weight_layout(op, 1, rank, t, g).and_then(|w| w.axis);
        assert_eq!(l("Conv", 4, false, 1), Some(0));
        assert_eq!(l("ConvTranspose", 4, false, 1), Some(1));
        assert_eq!(l("Gemm", 2, false, 1), Some(1));
        assert_eq!(l("Gemm", 2, true, 1), Some(0));
        assert_eq!(l("MatMul", 2, false, 1), Some(1));
        assert_eq!(l("MatMul", 3, false, 1), Some(2));
        assert_eq!(l("MatMul", 1, false, 1), None);
        assert_eq!(weight_layout("Conv", 0, 4, false, 1), None);
        assert_eq!(weight_layout("Add", 1, 4, false, 1), None);
    }

    #[test]
    fn suggestions() {
        assert_eq!(
            close_matches("conv", ONNX_OP_TYPES.iter().copied())[0],
            "Conv"
        );
        assert_eq!(
            close_matches("Sigmod", ONNX_OP_TYPES.iter().copied())[0],
            "Sigmoid"
        );
        assert!(close_matches("Xyzzyplugh", ONNX_OP_TYPES.iter().copied()).is_empty());
    }
}
