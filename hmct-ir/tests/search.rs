//! HZCALIBRATION.md §5 on hand-built graphs.

mod common;

use common::{calib, f32_init, model, node};
use hmct_ir::{
    Model, SKIPPABLE_OPS, consumer_label, find_input_calibration, find_output_calibration,
    input_calibrations, is_quantized, quantized_consumers, quantized_nodes,
};
use hmct_proto::onnx::NodeProto;

fn build(inputs: &[&str], nodes: Vec<NodeProto>, outputs: &[&str]) -> Model {
    let inits = vec![f32_init("w", &[4, 4, 1, 1], vec![0.5; 16])];
    Model::from_proto(model(inputs, inits, nodes, outputs), None).unwrap()
}

fn id(m: &Model, name: &str) -> usize {
    m.node_id(name).unwrap()
}

/// x → calib → <op> → Conv: the Conv's input calibration is found through the op.
#[test]
fn each_skippable_op_is_passed_through() {
    for op in SKIPPABLE_OPS {
        // The op's extra inputs come from the graph so the data input is input 0.
        let op_node = node("op", op, &["xc", "aux"], &["y"]);
        let m = build(
            &["x", "aux"],
            vec![
                calib("cx", "x", "xc"),
                op_node,
                node("conv", "Conv", &["y", "w"], &["out"]),
            ],
            &["out"],
        );
        assert_eq!(
            find_input_calibration(&m, id(&m, "conv"), Some(0)),
            Some(id(&m, "cx")),
            "{op}"
        );
        assert_eq!(
            find_input_calibration(&m, id(&m, "conv"), Some(1)),
            None,
            "{op}"
        );
        // Searching from the calibration node's side reaches the Conv through the op.
        assert_eq!(consumer_label(&m, id(&m, "cx")), "op;conv", "{op}");
    }
    // Ops that change values stop the search.
    for op in ["Sigmoid", "Add", "Conv", "AveragePool", "Mul"] {
        let m = build(
            &["x"],
            vec![
                calib("cx", "x", "xc"),
                node("op", op, &["xc"], &["y"]),
                node("conv", "Conv", &["y", "w"], &["out"]),
            ],
            &["out"],
        );
        assert_eq!(
            find_input_calibration(&m, id(&m, "conv"), Some(0)),
            None,
            "{op}"
        );
        assert_eq!(consumer_label(&m, id(&m, "cx")), "op", "{op}");
    }
}

#[test]
fn chains_of_skippable_ops() {
    let m = build(
        &["x", "shape"],
        vec![
            calib("cx", "x", "xc"),
            node("relu", "Relu", &["xc"], &["a"]),
            node("reshape", "Reshape", &["a", "shape"], &["b"]),
            node("transpose", "Transpose", &["b"], &["c"]),
            node("pool", "MaxPool", &["c"], &["d"]),
            node("conv", "Conv", &["d", "w"], &["out"]),
        ],
        &["out"],
    );
    assert_eq!(
        find_input_calibration(&m, id(&m, "conv"), None),
        Some(id(&m, "cx"))
    );
    assert_eq!(find_output_calibration(&m, id(&m, "relu"), None), None);
    assert_eq!(
        consumer_label(&m, id(&m, "cx")),
        "relu;reshape;transpose;pool;conv"
    );
}

/// Only the first input of a skippable op leads further up.
#[test]
fn search_follows_first_input_only() {
    let m = build(
        &["x", "idx"],
        vec![
            calib("ci", "idx", "idxc"),
            node("gather", "Gather", &["x", "idxc"], &["g"]),
            node("conv", "Conv", &["g", "w"], &["out"]),
        ],
        &["out"],
    );
    assert_eq!(find_input_calibration(&m, id(&m, "conv"), Some(0)), None);
    assert_eq!(
        find_input_calibration(&m, id(&m, "gather"), Some(1)),
        Some(id(&m, "ci"))
    );
    assert_eq!(consumer_label(&m, id(&m, "ci")), "gather");
}

#[test]
fn scatternd_without_index_looks_at_data_only() {
    let m = build(
        &["data", "indices", "updates"],
        vec![
            calib("cu", "updates", "uc"),
            node("scatter", "ScatterND", &["data", "indices", "uc"], &["s"]),
            node("conv", "Conv", &["s", "w"], &["out"]),
        ],
        &["out"],
    );
    let scatter = id(&m, "scatter");
    assert_eq!(find_input_calibration(&m, scatter, None), None);
    assert_eq!(
        find_input_calibration(&m, scatter, Some(2)),
        Some(id(&m, "cu"))
    );
    // A regular node's input calibrations look at every input, ScatterND included.
    assert_eq!(input_calibrations(&m, scatter), vec![id(&m, "cu")]);
    // The updates do not reach the Conv: the search only follows the data input.
    assert_eq!(find_input_calibration(&m, id(&m, "conv"), Some(0)), None);

    let m = build(
        &["data", "indices", "updates"],
        vec![
            calib("cd", "data", "dc"),
            calib("cu", "updates", "uc"),
            node("scatter", "ScatterND", &["dc", "indices", "uc"], &["s"]),
            node("conv", "Conv", &["s", "w"], &["out"]),
        ],
        &["out"],
    );
    assert_eq!(
        find_input_calibration(&m, id(&m, "scatter"), None),
        Some(id(&m, "cd"))
    );
    assert_eq!(
        find_input_calibration(&m, id(&m, "conv"), Some(0)),
        Some(id(&m, "cd"))
    );
    assert_eq!(
        input_calibrations(&m, id(&m, "scatter")),
        vec![id(&m, "cd"), id(&m, "cu")]
    );
}

#[test]
fn conv_add_searches_from_the_add() {
    let nodes = || {
        vec![
            node("conv", "Conv", &["x", "w"], &["c"]),
            node("add", "Add", &["c", "y"], &["s"]),
            calib("cs", "s", "sc"),
            node("relu", "Relu", &["sc"], &["out"]),
        ]
    };
    let m = build(&["x", "y"], nodes(), &["out"]);
    assert_eq!(
        find_output_calibration(&m, id(&m, "conv"), None),
        Some(id(&m, "cs"))
    );
    assert_eq!(
        find_output_calibration(&m, id(&m, "conv"), Some(0)),
        Some(id(&m, "cs"))
    );
    assert_eq!(
        find_output_calibration(&m, id(&m, "add"), None),
        Some(id(&m, "cs"))
    );

    // Not when the Conv output is also a graph output...
    let m = build(&["x", "y"], nodes(), &["out", "c"]);
    assert_eq!(find_output_calibration(&m, id(&m, "conv"), None), None);

    // ...nor when the Add is not the only reader...
    let mut n = nodes();
    n.push(node("other", "Sigmoid", &["c"], &["o2"]));
    let m = build(&["x", "y"], n, &["out", "o2"]);
    assert_eq!(find_output_calibration(&m, id(&m, "conv"), None), None);

    // ...nor for other ops in front of an Add.
    let mut n = nodes();
    n[0] = node("conv", "MatMul", &["x", "w"], &["c"]);
    let m = build(&["x", "y"], n, &["out"]);
    assert_eq!(find_output_calibration(&m, id(&m, "conv"), None), None);
}

#[test]
fn output_search_is_breadth_first_through_skippable_ops() {
    let m = build(
        &["x"],
        vec![
            node("conv", "Conv", &["x", "w"], &["c"]),
            node("relu", "Relu", &["c"], &["r"]),
            calib("deep", "r", "rc"),
            calib("near", "c", "cc"),
            node("sig", "Sigmoid", &["c"], &["s"]),
            calib("behind_sig", "s", "sc"),
            node("add", "Add", &["rc", "cc"], &["a"]),
            node("add2", "Add", &["a", "sc"], &["out"]),
        ],
        &["out"],
    );
    // Relu comes first among the readers, but the direct calibration node is nearer.
    assert_eq!(
        find_output_calibration(&m, id(&m, "conv"), None),
        Some(id(&m, "near"))
    );
    assert_eq!(
        find_output_calibration(&m, id(&m, "relu"), None),
        Some(id(&m, "deep"))
    );
    assert_eq!(find_output_calibration(&m, id(&m, "add"), None), None);
    assert_eq!(
        find_output_calibration(&m, id(&m, "sig"), Some(0)),
        Some(id(&m, "behind_sig"))
    );
    assert_eq!(find_output_calibration(&m, id(&m, "sig"), Some(1)), None);
}

#[test]
fn multiple_consumers_and_dedup() {
    let m = build(
        &["x"],
        vec![
            calib("cx", "x", "xc"),
            calib("cw", "w", "wc"),
            node("conv", "Conv", &["xc", "wc"], &["c"]),
            node("add", "Add", &["xc", "c"], &["a"]),
            node("mul", "Mul", &["xc", "xc"], &["m"]),
            node("out", "Concat", &["a", "m"], &["o"]),
        ],
        &["o"],
    );
    let (cx, cw) = (id(&m, "cx"), id(&m, "cw"));
    assert_eq!(consumer_label(&m, cx), "conv;add;mul");
    assert_eq!(consumer_label(&m, cw), "conv");
    assert_eq!(
        quantized_consumers(&m, cx),
        vec![id(&m, "conv"), id(&m, "add"), id(&m, "mul")]
    );
    assert_eq!(input_calibrations(&m, id(&m, "conv")), vec![cx, cw]);
    assert_eq!(input_calibrations(&m, id(&m, "mul")), vec![cx]);
    assert_eq!(input_calibrations(&m, id(&m, "add")), vec![cx]);
    assert!(is_quantized(&m, id(&m, "add")));
    assert!(!is_quantized(&m, id(&m, "out")));
    assert!(
        !is_quantized(&m, cx),
        "calibration nodes are not regular nodes"
    );
    assert_eq!(
        quantized_nodes(&m),
        vec![id(&m, "conv"), id(&m, "add"), id(&m, "mul")]
    );
    assert_eq!(
        m.calibration(cw).unwrap().tensor_type(),
        hmct_ir::TensorType::Feature,
        "explicit attribute wins"
    );
    // Out-of-range ids are no calibration and find nothing.
    assert_eq!(find_input_calibration(&m, 999, None), None);
    assert_eq!(find_output_calibration(&m, 999, None), None);
    assert!(!is_quantized(&m, 999));
}
