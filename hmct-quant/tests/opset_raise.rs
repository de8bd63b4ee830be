//! `hmct_ir::raise_opset` keeps what a model computes: float models at opsets 9 and
//! 10 using every operator whose signature changed up to 21 (attributes that became
//! inputs, Upsample and Resize-10, the 2-D coercion of Softmax, Split sizes, ...) run
//! bit for bit the same in our interpreter, which implements each version's meaning,
//! after raising to 13 and to 21. (onnxruntime on raised exports:
//! hmct-cli/tests/export_qdq.rs.) Also the refusals: too old a model, and an op with
//! no conversion, named.

use hmct_ir::testing::build::{
    self, float_attr as float, float_value, int_attr as int, ints_attr, named_value, node,
    string_attr as string,
};
use hmct_ir::{Model, OpsetError, raise_opset};
use hmct_proto::onnx::{AttributeProto, ModelProto, NodeProto, TensorProto};
use hmct_quant::{Config, Session, plan_model};
use hmct_tensor::Tensor;

fn with(mut n: NodeProto, attrs: Vec<AttributeProto>) -> NodeProto {
    n.attribute = attrs;
    n
}

fn floats(name: &str, dims: &[i64], v: Vec<f32>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: v,
        ..Default::default()
    }
}

fn at_opset(mut m: ModelProto, opset: i64) -> ModelProto {
    m.opset_import[0].version = Some(opset);
    m.ir_version = Some(4);
    m
}

/// x [1, 2, 4, 4] through BatchNormalization, Clip, Pad, Upsample (Resize-10 at
/// opset 10), Slice, Split, Softmax (axis 1 of a 4-D tensor), ReduceMean/ReduceSum,
/// Squeeze, Unsqueeze, TopK and Dropout, all written as `opset` has them.
fn legacy(opset: i64) -> ModelProto {
    let upsample = if opset < 10 { "Upsample" } else { "Resize" };
    let nodes = vec![
        node(
            "bn",
            "BatchNormalization",
            &["x", "s", "b", "m", "v"],
            &["x1"],
        ),
        with(
            node("clip", "Clip", &["x1"], &["x2"]),
            vec![float("min", -1.0), float("max", 1.5)],
        ),
        with(
            node("pad", "Pad", &["x2"], &["x3"]),
            vec![
                ints_attr("pads", vec![0, 0, 1, 1, 0, 0, 1, 1]),
                float("value", 0.25),
            ],
        ),
        with(
            node("up", upsample, &["x3", "scales"], &["x4"]),
            vec![string("mode", "nearest")],
        ),
        with(
            node("up_linear", upsample, &["x3", "scales"], &["lin"]),
            vec![string("mode", "linear")],
        ),
        if opset < 10 {
            with(
                node("slice", "Slice", &["x4"], &["x5"]),
                vec![
                    ints_attr("starts", vec![1, 2]),
                    ints_attr("ends", vec![9, 10]),
                    ints_attr("axes", vec![2, 3]),
                ],
            )
        } else {
            node("slice", "Slice", &["x4", "starts", "ends", "axes"], &["x5"])
        },
        with(
            node("split", "Split", &["x5"], &["s1", "s2"]),
            vec![int("axis", 1), ints_attr("split", vec![1, 1])],
        ),
        node("add", "Add", &["s1", "s2"], &["x6"]),
        node("soft", "Softmax", &["x6"], &["o1"]),
        with(
            node("logsoft", "LogSoftmax", &["x5"], &["o2"]),
            vec![int("axis", 2)],
        ),
        with(
            node("mean", "ReduceMean", &["x5"], &["r1"]),
            vec![ints_attr("axes", vec![2, 3]), int("keepdims", 1)],
        ),
        with(
            node("squeeze", "Squeeze", &["r1"], &["r2"]),
            vec![ints_attr("axes", vec![2, 3])],
        ),
        with(
            node("unsqueeze", "Unsqueeze", &["r2"], &["r3"]),
            vec![ints_attr("axes", vec![0])],
        ),
        with(
            node("sum", "ReduceSum", &["x5"], &["r4"]),
            vec![ints_attr("axes", vec![1]), int("keepdims", 0)],
        ),
        if opset < 10 {
            with(
                node("topk", "TopK", &["r4"], &["top", "top_i"]),
                vec![int("k", 3)],
            )
        } else {
            node("topk", "TopK", &["r4", "k"], &["top", "top_i"])
        },
        with(
            node("drop", "Dropout", &["x6"], &["d"]),
            vec![float("ratio", 0.3)],
        ),
        with(
            node("halves", "Split", &["d"], &["h1", "h2"]),
            vec![int("axis", 2)],
        ),
    ];
    let int64s = |name: &str, v: &[i64]| TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let inits = vec![
        int64s("starts", &[1, 2]),
        int64s("ends", &[9, 10]),
        int64s("axes", &[2, 3]),
        int64s("k", &[3]),
        floats("s", &[2], vec![1.5, 0.5]),
        floats("b", &[2], vec![0.1, -0.2]),
        floats("m", &[2], vec![0.3, -0.1]),
        floats("v", &[2], vec![2.0, 0.5]),
        floats("scales", &[4], vec![1.0, 1.0, 2.0, 2.0]),
    ];
    let outputs = ["lin", "o1", "o2", "r3", "top", "top_i", "h1", "h2"];
    at_opset(
        build::model(
            vec![float_value("x", &[1, 2, 4, 4])],
            nodes,
            inits,
            outputs.iter().map(|o| named_value(o)).collect(),
        ),
        opset,
    )
}

fn run(m: &ModelProto, x: &Tensor) -> Vec<std::sync::Arc<Tensor>> {
    let model = Model::from_proto(m.clone(), None).unwrap();
    let session = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    session.run(&[("x", x.clone())], &Config::float()).unwrap()
}

fn bits(t: &Tensor) -> (Vec<usize>, Vec<u64>) {
    let values = match t.as_f32() {
        Some(a) => a.iter().map(|v| u64::from(v.to_bits())).collect(),
        None => t.as_i64().unwrap().iter().map(|&v| v as u64).collect(),
    };
    (t.shape().to_vec(), values)
}

#[test]
fn raising_the_opset_changes_no_output_bit() {
    let x = Tensor::from_f32(
        &[1, 2, 4, 4],
        (0..32).map(|k| ((k * 7) % 13) as f32 / 4.0 - 1.5).collect(),
    )
    .unwrap();
    for from in [9, 10] {
        let model = legacy(from);
        let want: Vec<_> = run(&model, &x).iter().map(|t| bits(t)).collect();
        for to in [13, 21] {
            let mut raised = model.clone();
            let r = raise_opset(&mut raised, to).unwrap();
            assert_eq!((r.from, r.to), (from, to));
            assert_eq!(raised.opset_import[0].version, Some(to));
            assert!(raised.ir_version() >= if to == 13 { 7 } else { 10 });
            let converted: Vec<&str> = r
                .converted
                .iter()
                .map(|c| c.split(' ').next().unwrap())
                .collect();
            let mut expected = vec![
                "clip",
                "pad",
                "up",
                "up_linear",
                "split",
                "soft",
                "logsoft",
                "squeeze",
                "unsqueeze",
                "sum",
                "drop",
            ];
            if from < 10 {
                expected.extend(["slice", "topk"]);
            }
            if to >= 18 {
                expected.extend(["mean", "halves"]);
            }
            for name in &expected {
                assert!(
                    converted.contains(name),
                    "{from}->{to}: {name} in {converted:?}"
                );
            }
            assert_eq!(converted.len(), expected.len(), "{converted:?}");
            let got: Vec<_> = run(&raised, &x).iter().map(|t| bits(t)).collect();
            assert_eq!(got, want, "{from} -> {to}");
        }
    }
}

#[test]
fn softmax_along_the_last_axis_keeps_one_node() {
    let model = at_opset(
        build::model(
            vec![float_value("x", &[2, 5])],
            vec![node("soft", "Softmax", &["x"], &["y"])],
            vec![],
            vec![named_value("y")],
        ),
        11,
    );
    let mut raised = model.clone();
    raise_opset(&mut raised, 13).unwrap();
    let nodes = &raised.graph.as_ref().unwrap().node;
    assert_eq!(nodes.len(), 1);
    let x = Tensor::from_f32(&[2, 5], (0..10).map(|k| k as f32 / 3.0).collect()).unwrap();
    assert_eq!(
        run(&raised, &x).iter().map(|t| bits(t)).collect::<Vec<_>>(),
        run(&model, &x).iter().map(|t| bits(t)).collect::<Vec<_>>()
    );
}

#[test]
fn what_cannot_be_converted_is_refused_by_name() {
    let mut old = legacy(9);
    old.opset_import[0].version = Some(6);
    assert!(matches!(
        raise_opset(&mut old, 13),
        Err(OpsetError::TooOld { from: 6 })
    ));

    let mut bn = legacy(9);
    old = bn.clone();
    let graph = bn.graph.as_mut().unwrap();
    graph.node[0].output.push("saved_mean".into());
    graph
        .node
        .push(node("use", "Identity", &["saved_mean"], &["sm"]));
    let err = raise_opset(&mut bn, 21).unwrap_err();
    assert!(
        matches!(&err, OpsetError::Node { node, op, .. } if node == "bn" && op == "BatchNormalization"),
        "{err}"
    );
    assert!(err.to_string().contains("saved_mean"), "{err}");

    // An unused training output is dropped instead.
    let graph = old.graph.as_mut().unwrap();
    graph.node[0].output.push("unused_mean".into());
    raise_opset(&mut old, 21).unwrap();
    assert_eq!(old.graph.as_ref().unwrap().node[0].output, ["x1"]);
}
