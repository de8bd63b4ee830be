//! Element-wise chains run as one pass give the node-by-node results bit for bit: on
//! chains of every fusable op with scalar and per-channel constants, on special values,
//! serial and parallel; and a chain whose operands do not fit, or whose intermediate
//! value is wanted, runs node by node.

use std::sync::Arc;

use hmct_ir::Model;
use hmct_ir::testing::build::{
    float_attr, float_value, int_attr, ints_attr, model, named_value, node,
};
use hmct_quant::{Capture, Config, Session, Values, plan_model};

use hmct_tensor::{Tensor, tensor_to_proto};

const C: usize = 3;

fn constant(name: &str, shape: &[usize], values: Vec<f32>) -> hmct_proto::onnx::TensorProto {
    tensor_to_proto(&Tensor::from_f32(shape, values).unwrap(), name)
}

/// Chains on one input `x` of `C` channels:
/// - `ya`: BatchNormalization then the Add/Clip/Mul/Div of a hard-swish;
/// - `yb`: per-channel Mul/Add, constants on the left of Sub/Div, Relu, LeakyRelu,
///   HardSigmoid, and a Mul of a value by itself;
/// - `yc`: a Mul by a constant along the last axis (as a transformer's bias), then
///   the Div, Erf, Add, Mul and Mul of a GELU;
/// - `yd`: Add, a Clip without bounds, Mul; the Clip's output `d2` is a graph output;
/// - `ye`: a hard-swish with the operands of its Add and Mul the other way round;
/// - `yf`: a SiLU (Sigmoid, and a Mul by the chain's input), Exp, a per-channel Mul;
/// - `yg`: a Mul by a constant along axis 2, which the chain cannot take, and an Add;
/// - `yh`: a SiLU with the Mul's operands the other way round, and an Add;
/// - `yi`: a GELU scaled by a Mul, with the operands of its Mul, Add and Muls the
///   other way round.
fn session(shape: &[usize], threads: usize) -> Session {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let w = *shape.last().unwrap();
    let h = shape[2];
    let per_channel = |seed: f32| (0..C).map(|c| seed + 0.37 * c as f32).collect::<Vec<_>>();
    let inits = vec![
        constant("scale", &[C], per_channel(0.8)),
        constant("bias", &[C], per_channel(-0.3)),
        constant("mean", &[C], per_channel(0.1)),
        constant("var", &[C], per_channel(1.7)),
        constant("three", &[], vec![3.0]),
        constant("zero", &[], vec![0.0]),
        constant("six", &[], vec![6.0]),
        constant("s", &[C, 1, 1], per_channel(1.3)),
        constant("b", &[1, C, 1, 1], per_channel(-0.7)),
        constant("two_and_a_half", &[1], vec![2.5]),
        constant("one_and_a_half", &[], vec![1.5]),
        constant("along_w", &[w], (0..w).map(|i| 0.5 + i as f32).collect()),
        constant("along_h", &[h, 1], (0..h).map(|i| 1.5 - i as f32).collect()),
        constant("one", &[], vec![1.0]),
        constant("sqrt2", &[], vec![std::f32::consts::SQRT_2]),
        constant("half", &[], vec![0.5]),
        constant("inv_sqrt2", &[1], vec![std::f32::consts::FRAC_1_SQRT_2]),
    ];
    let nodes = vec![
        node(
            "bn",
            "BatchNormalization",
            &["x", "scale", "bias", "mean", "var"],
            &["h"],
        ),
        node("hs_add", "Add", &["h", "three"], &["t"]),
        node("hs_clip", "Clip", &["t", "zero", "six"], &["u"]),
        node("hs_mul", "Mul", &["h", "u"], &["v"]),
        node("hs_div", "Div", &["v", "six"], &["ya"]),
        node("scale_mul", "Mul", &["s", "x"], &["b1"]),
        node("shift_add", "Add", &["b1", "b"], &["b2"]),
        node("sub_from", "Sub", &["two_and_a_half", "b2"], &["b3"]),
        node("div_into", "Div", &["one_and_a_half", "b3"], &["b4"]),
        node("relu", "Relu", &["b4"], &["b5"]),
        node("leaky", "LeakyRelu", &["b3"], &["b6"]),
        node("add_both", "Add", &["b5", "b6"], &["b7"]),
        node("hsig", "HardSigmoid", &["b7"], &["b8"]),
        node("square", "Mul", &["b8", "b8"], &["yb"]),
        node("mul_w", "Mul", &["x", "along_w"], &["c1"]),
        node("g_div", "Div", &["c1", "sqrt2"], &["c2"]),
        node("g_erf", "Erf", &["c2"], &["c3"]),
        node("g_add", "Add", &["c3", "one"], &["c4"]),
        node("g_mul", "Mul", &["c1", "c4"], &["c5"]),
        node("g_half", "Mul", &["c5", "half"], &["yc"]),
        node("d_add", "Add", &["x", "one"], &["d1"]),
        node("d_clip", "Clip", &["d1"], &["d2"]),
        node("d_mul", "Mul", &["d2", "s"], &["yd"]),
        node("e_add", "Add", &["three", "x"], &["e1"]),
        node("e_clip", "Clip", &["e1", "zero", "six"], &["e2"]),
        node("e_mul", "Mul", &["e2", "x"], &["e3"]),
        node("e_div", "Div", &["e3", "six"], &["ye"]),
        node("f_sig", "Sigmoid", &["x"], &["f1"]),
        node("f_mul", "Mul", &["x", "f1"], &["f2"]),
        node("f_exp", "Exp", &["f2"], &["f3"]),
        node("f_scale", "Mul", &["f3", "s"], &["yf"]),
        node("s_sig", "Sigmoid", &["x"], &["s1"]),
        node("s_mul", "Mul", &["s1", "x"], &["s2"]),
        node("s_add", "Add", &["s2", "three"], &["yh"]),
        node("h_mul", "Mul", &["x", "along_h"], &["g1"]),
        node("h_add", "Add", &["g1", "one"], &["yg"]),
        node("i_scale", "Mul", &["inv_sqrt2", "x"], &["i1"]),
        node("i_erf", "Erf", &["i1"], &["i2"]),
        node("i_add", "Add", &["one", "i2"], &["i3"]),
        node("i_mul", "Mul", &["i3", "x"], &["i4"]),
        node("i_half", "Mul", &["half", "i4"], &["yi"]),
    ];
    let outputs = ["ya", "yb", "yc", "yd", "d2", "ye", "yf", "yg", "yh", "yi"]
        .map(named_value)
        .to_vec();
    let proto = model(vec![float_value("x", &dims)], nodes, inits, outputs);
    let model = Model::from_proto(proto, None).unwrap();
    Session::new(plan_model(&model).unwrap(), threads).unwrap()
}

/// Pseudo-random values with NaN, infinities, signed zeros, huge and tiny values, and
/// the hard-swish breakpoints.
fn input(shape: &[usize]) -> Tensor {
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        3.0e38,
        -3.0e38,
        1.0e-40,
        -3.0,
        3.0,
        6.0,
        -2.5,
    ];
    let n: usize = shape.iter().product();
    let mut s = 12345u32;
    let v = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            if i % 7 == 0 {
                special[(s as usize) % special.len()]
            } else {
                (s >> 8) as f32 / (1u32 << 20) as f32 - 8.0
            }
        })
        .collect();
    Tensor::from_f32(shape, v).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn fused_calls(s: &Session, node: &str) -> u32 {
    let i = s.plan().node_index(node).unwrap();
    s.node_times().unwrap().fused_calls[i]
}

/// Runs `proto` on input `x` once fused (a one-thread session with profiling, so
/// that `fused_calls` can be asked) and once node by node; returns the fused session
/// and both sets of outputs.
fn fused_and_plain(
    proto: hmct_proto::onnx::ModelProto,
    x: Tensor,
) -> (Session, Vec<Arc<Tensor>>, Vec<Arc<Tensor>>) {
    let model = Model::from_proto(proto, None).unwrap();
    fused_and_plain_on(&model, &x, 1)
}

/// [`fused_and_plain`] for a loaded model on `threads` threads.
fn fused_and_plain_on(
    model: &Model,
    x: &Tensor,
    threads: usize,
) -> (Session, Vec<Arc<Tensor>>, Vec<Arc<Tensor>>) {
    let fused = Session::new(plan_model(model).unwrap(), threads)
        .unwrap()
        .with_profiling();
    let got = fused.run(&[("x", x.clone())], &Config::float()).unwrap();
    let plain = Session::new(plan_model(model).unwrap(), threads)
        .unwrap()
        .without_fusion();
    let expected = plain.run(&[("x", x.clone())], &Config::float()).unwrap();
    (fused, got, expected)
}

/// An int8 setting with one threshold per channel of axis 1, which keeps a chain's
/// calibration step apart (chains quantize per tensor only).
fn per_channel_int8(thresholds: &[f32]) -> hmct_quant::FakeQuant {
    let int8 = hmct_quant::fake_quant::QType::Int {
        bits: 8,
        signed: true,
    };
    hmct_quant::FakeQuant::from_thresholds(int8, thresholds, Some(1)).unwrap()
}

/// Every value of `s`'s plan that a run computes (not a constant).
fn computed_values(s: &Session) -> Vec<usize> {
    let plan = s.plan();
    (0..plan.num_values())
        .filter(|&v| plan.constant(v).is_none())
        .collect()
}

/// Asserts that every value read from `kept` (a capture under `base`, as it is or
/// recomputed where it leaves the value out) is `full`'s bit for bit.
fn assert_reads_match(s: &Session, kept: &Values, full: &Values, base: &Config, what: &str) {
    for v in computed_values(s) {
        assert_eq!(
            bits(&s.value_under(kept, base, v).unwrap()),
            bits(&s.value(full, v).unwrap()),
            "{} under {base:?}, {what}",
            s.plan().value_name(v)
        );
    }
}

/// Asserts that `fused` gives `plain`'s output bit for bit under every config, in full
/// runs on `x` and in probes from the values captured under the float and the
/// calibrated configs; `what` names the case in failures.
fn assert_same_as_node_by_node(
    fused: &Session,
    plain: &Session,
    x: &Tensor,
    configs: &[Config],
    what: &str,
) {
    let run = |s: &Session, cfg: &Config| s.run(&[("x", x.clone())], cfg).unwrap();
    for cfg in configs {
        let (got, want) = (run(fused, cfg), run(plain, cfg));
        assert_eq!(bits(&got[0]), bits(&want[0]), "{cfg:?}, {what}");
    }
    let outputs = fused.plan().outputs().to_vec();
    let bound = fused.bind_inputs(&[("x", x.clone())]).unwrap();
    let every = computed_values(fused);
    for base in [Config::float(), Config::calibrated()] {
        let full = fused
            .run_from(&bound, None, &base, &every, Capture::All)
            .unwrap();
        // A compact capture leaves the chains' intermediate values for the probes
        // and its readers to recompute.
        for capture in [Capture::All, Capture::Compact] {
            let kept = fused
                .run_from(&bound, None, &base, &every, capture)
                .unwrap();
            assert_reads_match(fused, &kept, &full, &base, &format!("{capture:?}, {what}"));
            for cfg in configs {
                let probe = fused
                    .run_from(&kept, Some(&base), cfg, &outputs, Capture::Wanted)
                    .unwrap();
                let got = fused.value(&probe, outputs[0]).unwrap();
                let want = run(plain, cfg);
                assert_eq!(
                    bits(&got),
                    bits(&want[0]),
                    "probe {cfg:?} from {base:?} ({capture:?}), {what}"
                );
            }
        }
    }
}

#[test]
fn fused_chains_match_node_by_node_bit_for_bit() {
    // Small (serial) and large enough to be split into parallel tasks.
    for shape in [[2, C, 4, 5], [1, C, 120, 110]] {
        let x = input(&shape);
        let reference = session(&shape, 1).without_fusion();
        let expected = reference
            .run(&[("x", x.clone())], &Config::float())
            .unwrap();
        for threads in [1, 2] {
            let s = session(&shape, threads).with_profiling();
            let got = s.run(&[("x", x.clone())], &Config::float()).unwrap();
            for (k, (a, b)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(bits(a), bits(b), "{shape:?}, {threads} threads, output {k}");
            }
            let plan = s.plan();
            let chain_len = |n: &str| s.fused_chain(plan.node_index(n).unwrap()).map(<[_]>::len);
            assert_eq!(chain_len("bn"), Some(5));
            assert_eq!(chain_len("scale_mul"), Some(9));
            assert_eq!(chain_len("mul_w"), Some(6));
            assert_eq!(fused_calls(&s, "mul_w"), 1);
            assert_eq!(chain_len("i_scale"), Some(5));
            // d2 is a graph output, so the chain ends with the node writing it.
            assert_eq!(chain_len("d_add"), Some(2));
            assert_eq!(chain_len("e_add"), Some(4));
            assert_eq!(chain_len("f_sig"), Some(4));
            assert_eq!(chain_len("s_sig"), Some(3));
            assert_eq!(fused_calls(&s, "e_add"), 1);
            assert_eq!(fused_calls(&s, "f_sig"), 1);
            assert_eq!(fused_calls(&s, "d_add"), 1);
            assert_eq!(fused_calls(&s, "bn"), 1);
            assert_eq!(fused_calls(&s, "scale_mul"), 1);
            assert_eq!(fused_calls(&s, "i_scale"), 1);
            // Its constant runs along axis 2: the nodes run one by one.
            assert_eq!(chain_len("h_mul"), Some(2));
            assert_eq!(fused_calls(&s, "h_mul"), 0);
        }
    }
}

#[test]
fn a_wanted_intermediate_value_keeps_its_chain_apart() {
    let shape = [1, C, 6, 7];
    let x = input(&shape);
    let s = session(&shape, 1).with_profiling();
    let plan = s.plan();
    let (ya, t) = (plan.value("ya").unwrap(), plan.value("t").unwrap());
    let bound = s.bind_inputs(&[("x", x.clone())]).unwrap();
    let got = s
        .run_from(&bound, None, &Config::float(), &[ya, t], Capture::Wanted)
        .unwrap();
    assert_eq!(fused_calls(&s, "bn"), 0);
    let reference = session(&shape, 1).without_fusion();
    let expected = reference
        .run_from(
            &reference.bind_inputs(&[("x", x)]).unwrap(),
            None,
            &Config::float(),
            &[ya, t],
            Capture::Wanted,
        )
        .unwrap();
    for slot in [ya, t] {
        assert_eq!(
            bits(&s.value(&got, slot).unwrap()),
            bits(&reference.value(&expected, slot).unwrap())
        );
    }
}

#[test]
fn a_compact_capture_leaves_out_chain_intermediates_and_recomputes_them() {
    let shape = [1, C, 6, 7];
    let x = input(&shape);
    for threads in [1, 2] {
        let s = session(&shape, threads);
        let plan = s.plan();
        let every = computed_values(&s);
        let bound = s.bind_inputs(&[("x", x.clone())]).unwrap();
        let base = Config::float();
        let full = s
            .run_from(&bound, None, &base, &every, Capture::All)
            .unwrap();
        let compact = s
            .run_from(&bound, None, &base, &every, Capture::Compact)
            .unwrap();
        // The chain of `bn` and a hard-swish: its input and output stay, the values
        // between them go.
        let slot = |n: &str| plan.value(n).unwrap();
        for kept in ["x", "ya", "d2"] {
            assert!(compact.get(slot(kept)).is_some(), "{kept} kept");
        }
        for left in ["h", "t", "u", "v"] {
            assert!(compact.get(slot(left)).is_none(), "{left} left out");
        }
        assert!(compact.nbytes() < full.nbytes());
        assert_reads_match(&s, &compact, &full, &base, &format!("{threads} threads"));
    }
}

/// The PP-OCR classifier's BatchNormalization + hard-swish chains are found and fused.
#[test]
fn the_classifier_fuses_its_chains() {
    let Some(path) = hmct_ir::testing::shared_path(
        "models/rapidocr_ppocr_cls/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    ) else {
        return;
    };
    let model = hmct_ir::load_model(&path).unwrap();
    let s = Session::new(plan_model(&model).unwrap(), 1)
        .unwrap()
        .with_profiling();
    let x = input(&[1, 3, 48, 192]);
    let fused = s.run(&[("x", x.clone())], &Config::float()).unwrap();
    let times = s.node_times().unwrap();
    // Chains run as a pass of their own or as a conv's tail.
    let chains = (times.fused_calls.iter().zip(&times.tail_calls))
        .filter(|&(&f, &t)| f > 0 || t > 0)
        .count();
    assert!(chains >= 20, "only {chains} chains ran fused");
    let plain = Session::new(plan_model(&model).unwrap(), 1)
        .unwrap()
        .without_fusion();
    let expected = plain.run(&[("x", x)], &Config::float()).unwrap();
    assert_eq!(bits(&fused[0]), bits(&expected[0]));
}

/// A chain that reads its input again at its end may not overwrite it at its start
/// while a node outside the chain, placed in between, still has to read it.
#[test]
fn a_reader_between_the_chain_nodes_keeps_the_input() {
    let shape = [1, C, 8, 8];
    let proto = model(
        vec![float_value("x", &[1, C as i64, 8, 8])],
        vec![
            node("neg", "Neg", &["x"], &["p"]),
            node("add", "Add", &["p", "three"], &["e1"]),
            node("abs", "Abs", &["p"], &["k"]),
            node("mul", "Mul", &["p", "e1"], &["e2"]),
        ],
        vec![constant("three", &[], vec![3.0])],
        ["e2", "k"].map(named_value).to_vec(),
    );
    let (s, got, expected) = fused_and_plain(proto, input(&shape));
    assert_eq!(fused_calls(&s, "add"), 1);
    for (a, b) in got.iter().zip(&expected) {
        assert_eq!(bits(a), bits(b));
    }
}

/// A chain that consumes its input in place and reads it again at its last step
/// (hard swish: `p * hardsigmoid(p)`) reads the input as it was, not the block it overwrites;
/// and a chain in place whose last step does not read the input writes straight into
/// it. Both on one block and on many.
#[test]
fn in_place_chains_read_their_input_before_overwriting_it() {
    for shape in [[1, C, 4, 4], [1, C, 40, 50]] {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let proto = model(
            vec![float_value("x", &dims)],
            vec![
                // The chain's input is made here (by a node that cannot join it), so
                // nobody else holds it.
                node("flip", "Transpose", &["x"], &["p"]),
                node("sig", "HardSigmoid", &["p"], &["q"]),
                node("swish", "Mul", &["p", "q"], &["y1"]),
                node("flip2", "Transpose", &["x"], &["p2"]),
                node("add", "Add", &["p2", "three"], &["s"]),
                node("relu", "Relu", &["s"], &["y2"]),
            ],
            vec![constant("three", &[], vec![3.0])],
            ["y1", "y2"].map(named_value).to_vec(),
        );
        let (s, got, expected) = fused_and_plain(proto, input(&shape));
        assert_eq!(fused_calls(&s, "sig"), 1, "{shape:?}");
        assert_eq!(fused_calls(&s, "add"), 1, "{shape:?}");
        for (k, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(bits(a), bits(b), "{shape:?}, output {k}");
        }
    }
}

/// Smooth pseudo-random values in [-1, 1) (no NaN: a conv would spread it everywhere).
fn smooth(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Convs of every kernel path, each followed by an element-wise chain that alone reads
/// its output, so that the conv runs the chain as it stores (its tail): the outputs
/// are those of node-by-node runs bit for bit, serial and parallel, on plane sizes
/// that take the channel-lanes, packed-GEMM, direct, depthwise-block and per-plane
/// depthwise kernels. A conv whose output is also a graph output keeps its Relu apart.
#[test]
fn conv_tails_match_node_by_node_bit_for_bit() {
    let conv = |name: &str, io: [&str; 3], k: i64, stride: i64, dil: i64, group: i64| {
        let mut n = node(
            name,
            "Conv",
            &[io[0], io[1], &format!("{}_b", io[1])],
            &[io[2]],
        );
        let pad = k / 2 * dil;
        n.attribute.push(ints_attr("pads", vec![pad; 4]));
        n.attribute.push(ints_attr("strides", vec![stride; 2]));
        n.attribute.push(ints_attr("dilations", vec![dil; 2]));
        n.attribute.push(int_attr("group", group));
        n
    };
    let weight = |name: &str, shape: &[usize], seed: u32| {
        let n: usize = shape.iter().product();
        let scale = 1.0 / (n / shape[0]) as f32;
        let w = smooth(n, seed).iter().map(|v| v * scale * 3.0).collect();
        [
            constant(name, shape, w),
            constant(
                &format!("{name}_b"),
                &[shape[0]],
                smooth(shape[0], seed + 1),
            ),
        ]
    };
    let mut leaky = node("lk", "LeakyRelu", &["f"], &["y"]);
    leaky.attribute.push(float_attr("alpha", 0.1));
    let nodes = vec![
        conv("c3", ["x", "w3", "a"], 3, 1, 1, 1),
        node("relu", "Relu", &["a"], &["a1"]),
        conv("c1", ["a1", "w1", "b"], 1, 1, 1, 1),
        node("clip", "Clip", &["b", "zero", "six"], &["b1"]),
        conv("c2", ["b1", "w2", "c"], 1, 1, 1, 1),
        node("sig", "Sigmoid", &["c"], &["c1"]),
        node("silu", "Mul", &["c", "c1"], &["c2"]),
        conv("dw", ["c2", "wd", "d"], 3, 1, 1, 128),
        node(
            "bn",
            "BatchNormalization",
            &["d", "bn_s", "bn_b", "bn_m", "bn_v"],
            &["d1"],
        ),
        node("hs_add", "Add", &["d1", "three"], &["d2"]),
        node("hs_clip", "Clip", &["d2", "zero", "six"], &["d3"]),
        node("hs_mul", "Mul", &["d1", "d3"], &["d4"]),
        node("hs_div", "Div", &["d4", "six"], &["d5"]),
        conv("c4", ["d5", "w4", "e"], 3, 2, 1, 1),
        node("pc_mul", "Mul", &["e", "per40"], &["e1"]),
        node("pc_add", "Add", &["e1", "one"], &["e2"]),
        conv("dw5", ["e2", "w5", "f0"], 5, 1, 1, 40),
        node("relu5", "Relu", &["f0"], &["f1"]),
        conv("c6", ["f1", "w6", "f"], 3, 1, 2, 1),
        leaky,
        conv("c7", ["y", "w7", "g"], 1, 1, 1, 1),
        node("relu7", "Relu", &["g"], &["z"]),
        // Unpadded: the direct kernel sums positions over the input's rows (wide).
        conv("c9", ["z", "w9", "v0"], 3, 1, 1, 1),
        node("relu9", "Relu", &["v0"], &["v"]),
    ];
    let mut nodes = nodes;
    let c9 = nodes.len() - 2;
    nodes[c9].attribute[0] = ints_attr("pads", vec![0; 4]);
    let mut inits: Vec<_> = [
        weight("w3", &[64, 32, 3, 3], 1),
        weight("w1", &[64, 64, 1, 1], 2),
        weight("w2", &[128, 64, 1, 1], 3),
        weight("wd", &[128, 1, 3, 3], 4),
        weight("w4", &[40, 128, 3, 3], 5),
        weight("w5", &[40, 1, 5, 5], 6),
        weight("w6", &[24, 40, 3, 3], 7),
        weight("w7", &[8, 24, 1, 1], 8),
        weight("w9", &[16, 8, 3, 3], 14),
    ]
    .into_iter()
    .flatten()
    .collect();
    inits.extend([
        constant("zero", &[], vec![0.0]),
        constant("three", &[], vec![3.0]),
        constant("six", &[], vec![6.0]),
        constant("one", &[], vec![1.0]),
        constant("per40", &[1, 40, 1, 1], smooth(40, 9)),
        constant("bn_s", &[128], smooth(128, 10)),
        constant("bn_b", &[128], smooth(128, 11)),
        constant("bn_m", &[128], smooth(128, 12)),
        constant(
            "bn_v",
            &[128],
            smooth(128, 13).iter().map(|v| v + 1.5).collect(),
        ),
    ]);
    let tails = ["c3", "c1", "c2", "dw", "c4", "dw5", "c6", "c7", "c9"];
    for (h, w) in [(32, 32), (56, 56), (7, 7), (13, 9), (112, 40)] {
        let x = Tensor::from_f32(&[1, 32, h, w], smooth(32 * h * w, h as u32)).unwrap();
        let proto = model(
            vec![float_value("x", &[1, 32, h as i64, w as i64])],
            nodes.clone(),
            inits.clone(),
            // `y`, c6's tail's output, is read by c7 and is a graph output: fine. c7's
            // own output `g` as a graph output keeps its Relu apart.
            vec![named_value("y"), named_value("v"), named_value("g")],
        );
        let model = Model::from_proto(proto, None).unwrap();
        for threads in [1, 2] {
            let (fused, got, want) = fused_and_plain_on(&model, &x, threads);
            for (a, b) in got.iter().zip(&want) {
                assert_eq!(bits(a), bits(b), "{h}x{w}, {threads} thread(s)");
            }
            let times = fused.node_times().unwrap();
            for name in tails {
                let i = fused.plan().node_index(name).unwrap();
                let ran = times.tail_calls[i] > 0;
                assert_eq!(ran, name != "c7", "{name}'s tail at {h}x{w}");
            }
        }
    }
}

/// A transformer's bias along the last axis joins the chain after it: the bias Add and
/// a GELU's five nodes, a bias and a layer scale, a bias and a Relu on a 2-D product;
/// on 3-D and 2-D values, serial and parallel, the outputs are those of node-by-node
/// runs bit for bit. Operands along axis 1 and along the last axis in one chain of a
/// 3-D value are not walked: its nodes run one by one.
#[test]
fn chains_take_operands_along_the_last_axis() {
    let gelu = |x: &str, y: &str| {
        vec![
            node("g_div", "Div", &[x, "sqrt2"], &["g1"]),
            node("g_erf", "Erf", &["g1"], &["g2"]),
            node("g_add", "Add", &["g2", "one"], &["g3"]),
            node("g_mul", "Mul", &[x, "g3"], &["g4"]),
            node("g_half", "Mul", &["g4", "half"], &[y]),
        ]
    };
    // Rows of 96 and 40 values: blocks start anywhere in a row. 300 rows take
    // parallel tasks.
    for rows in [7, 300] {
        let (k, n1, n2) = (24, 96, 40);
        let mut nodes = vec![
            node("mm1", "MatMul", &["x", "w1"], &["a"]),
            node("bias1", "Add", &["a", "b1"], &["a1"]),
        ];
        nodes.extend(gelu("a1", "h"));
        nodes.extend([
            node("mm2", "MatMul", &["h", "w2"], &["c"]),
            node("bias2", "Add", &["b2", "c"], &["c1"]),
            node("scale2", "Mul", &["c1", "gamma"], &["y"]),
            node("flat", "Reshape", &["x", "flat_shape"], &["xf"]),
            node("mm4", "MatMul", &["xf", "w1"], &["e"]),
            node("bias4", "Add", &["e", "b1"], &["e1"]),
            node("relu4", "Relu", &["e1"], &["v"]),
            // Along axis 1 (the rows) and along the last axis.
            node("mm5", "MatMul", &["x", "w1"], &["f"]),
            node("bias5", "Add", &["f", "b1"], &["f1"]),
            node("rows5", "Mul", &["f1", "per_row"], &["u"]),
        ]);
        let flat_shape = Tensor::I64(
            hmct_tensor::ndarray::ArrayD::from_shape_vec(vec![2], vec![rows as i64, k as i64])
                .unwrap(),
        );
        let scaled = |n: usize, seed: u32| smooth(n, seed).iter().map(|v| v / 8.0).collect();
        let inits = vec![
            constant("w1", &[k, n1], scaled(k * n1, 1)),
            constant("b1", &[n1], smooth(n1, 2)),
            constant("w2", &[n1, n2], scaled(n1 * n2, 3)),
            constant("b2", &[1, 1, n2], smooth(n2, 4)),
            constant("gamma", &[n2], smooth(n2, 5)),
            constant("per_row", &[rows, 1], smooth(rows, 6)),
            constant("one", &[], vec![1.0]),
            constant("sqrt2", &[], vec![std::f32::consts::SQRT_2]),
            constant("half", &[], vec![0.5]),
            tensor_to_proto(&flat_shape, "flat_shape"),
        ];
        let x = Tensor::from_f32(&[1, rows, k], smooth(rows * k, rows as u32)).unwrap();
        let proto = model(
            vec![float_value("x", &[1, rows as i64, k as i64])],
            nodes,
            inits,
            ["y", "v", "u"].map(named_value).to_vec(),
        );
        let model = Model::from_proto(proto, None).unwrap();
        for threads in [1, 2] {
            let (fused, got, want) = fused_and_plain_on(&model, &x, threads);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "{rows} rows, {threads} thread(s), output {i}"
                );
            }
            let chain_len = |n: &str| {
                fused
                    .fused_chain(fused.plan().node_index(n).unwrap())
                    .map(<[_]>::len)
            };
            assert_eq!(chain_len("bias1"), Some(6));
            assert_eq!(chain_len("bias2"), Some(2));
            assert_eq!(chain_len("bias4"), Some(2));
            assert_eq!(chain_len("bias5"), Some(2));
            for (name, calls) in [("bias1", 1), ("bias2", 1), ("bias4", 1), ("bias5", 0)] {
                assert_eq!(fused_calls(&fused, name), calls, "{name}, {rows} rows");
            }
        }
    }
}

/// Residual blocks as calibrated models have them: a conv's Relu and the calibration
/// node of the next conv's input, which the conv runs as its tail; a residual Add of
/// the block's input behind the calibration node of the conv's output, then a Relu;
/// and a downsampling shortcut, where the Add reads two convs' outputs, each behind
/// its calibration node (the first conv runs its node as its tail). The Adds, with
/// their Relus and calibration nodes, run as one pass that reads the Add's other
/// operand beside the chain's input. The outputs are those of node-by-node runs bit
/// for bit with the calibration nodes off, on, one of them off or on, in float16,
/// and per channel (which a chain does not take: its nodes run one by one); full
/// runs and probes from captured values, serial and parallel.
#[test]
fn residual_adds_and_calibration_nodes_join_conv_tails() {
    use hmct_quant::{FakeQuant, Override};
    let c = 16usize;
    let conv = |name: &str, x: &str, w: &str, y: &str, k: i64| {
        let mut n = node(name, "Conv", &[x, w], &[y]);
        n.attribute.push(ints_attr("pads", vec![k / 2; 4]));
        n
    };
    let nodes = vec![
        conv("c1", "x", "w1", "a", 3),
        node("relu1", "Relu", &["a"], &["a1"]),
        conv("c2", "a1", "w2", "b", 3),
        node("res", "Add", &["b", "x"], &["s"]),
        node("relu2", "Relu", &["s"], &["t"]),
        conv("c3", "t", "w3", "d", 1),
        conv("c4", "t", "w4", "e", 1),
        node("add2", "Add", &["d", "e"], &["u"]),
        node("relu3", "Relu", &["u"], &["y"]),
    ];
    let weight = |name: &str, k: usize, seed: u32| {
        let n = c * c * k * k;
        let w = smooth(n, seed)
            .into_iter()
            .map(|v| v * 3.0 / (c * k * k) as f32);
        constant(name, &[c, c, k, k], w.collect())
    };
    let inits = vec![
        weight("w1", 3, 1),
        weight("w2", 3, 2),
        weight("w3", 1, 3),
        weight("w4", 1, 4),
    ];
    for (h, w) in [(14, 14), (40, 36)] {
        let proto = model(
            vec![float_value("x", &[1, c as i64, h as i64, w as i64])],
            nodes.clone(),
            inits.clone(),
            vec![named_value("y")],
        );
        let m = Model::from_proto(proto, None).unwrap();
        let m = hmct_ir::testing::calibrate_for_tests(m, 2.0).unwrap();
        // The calibration nodes of the Adds' inputs.
        let inserts = [("b", "res", 0), ("d", "add2", 0), ("e", "add2", 1)]
            .map(|(value, reader, input)| {
                hmct_ir::testing::feature_calibration(&m, value, reader, input, 3.0).unwrap()
            })
            .to_vec();
        let m = m.insert_calibrations(inserts).unwrap();
        let x = Tensor::from_f32(&[1, c, h, w], smooth(c * h * w, h as u32)).unwrap();
        for threads in [1, 2] {
            let fused = Session::new(plan_model(&m).unwrap(), threads)
                .unwrap()
                .with_profiling();
            let plain = Session::new(plan_model(&m).unwrap(), threads)
                .unwrap()
                .without_fusion();
            let plan = fused.plan();
            let activations: Vec<usize> = (0..plan.calibrations().len())
                .filter(|&k| !plan.calibrations()[k].is_weight)
                .collect();
            assert_eq!(activations.len(), 6);
            let thresholds: Vec<f32> = (0..c).map(|i| 1.0 + 0.2 * i as f32).collect();
            let per_channel = per_channel_int8(&thresholds);
            let mut configs = vec![Config::float(), Config::calibrated()];
            for &k in &activations {
                configs.push(Config::calibrated().with(k, Override::Off));
                configs.push(Config::float().with(k, Override::On));
                configs.push(Config::calibrated().with(k, Override::Set(FakeQuant::Float16)));
                configs.push(Config::calibrated().with(k, Override::Set(per_channel.clone())));
            }
            assert_same_as_node_by_node(
                &fused,
                &plain,
                &x,
                &configs,
                &format!("{h}x{w}, {threads} threads"),
            );
            // The tails and chains ran (in the runs without a per-channel setting on
            // them).
            let times = fused.node_times().unwrap();
            let index = |n: &str| plan.node_index(n).unwrap();
            for name in ["c1", "c3"] {
                assert!(times.tail_calls[index(name)] > 0, "{name}'s tail");
            }
            let tail_has = |conv: &str, member: &str| {
                fused
                    .fused_tail(index(conv))
                    .unwrap()
                    .contains(&index(member))
            };
            assert!(tail_has("c1", "relu1") && tail_has("c1", "a1_HzCalibration"));
            assert!(tail_has("c3", "d_HzCalibration"));
            for (head, members) in [
                ("b_HzCalibration", ["res", "relu2"]),
                ("e_HzCalibration", ["add2", "relu3"]),
            ] {
                let chain = fused.fused_chain(index(head)).unwrap();
                assert!(members.iter().all(|m| chain.contains(&index(m))), "{head}");
                assert!(times.fused_calls[index(head)] > 0, "{head}");
            }
        }
    }
}

/// A SiLU whose Sigmoid output goes through a calibration node before the Mul (as in
/// calibrated EfficientNets and YOLOs) runs in the conv's tail as one step: bit for
/// bit the node-by-node outputs with that calibration node off, on, in float16 and
/// per channel (which keeps the chain apart), full runs and probes, 1 and 2 threads.
#[test]
fn a_silu_split_by_a_calibration_node_joins_the_conv_tail() {
    use hmct_quant::{FakeQuant, Override};
    let c = 16usize;
    let nodes = vec![
        node("c1", "Conv", &["x", "w1"], &["a"]),
        node("sig", "Sigmoid", &["a"], &["g"]),
        node("mul", "Mul", &["a", "g"], &["b"]),
        node("c2", "Conv", &["b", "w2"], &["y"]),
    ];
    let weight = |name: &str, seed: u32| {
        let w = smooth(c * c, seed).into_iter().map(|v| v * 3.0 / c as f32);
        constant(name, &[c, c, 1, 1], w.collect())
    };
    let proto = model(
        vec![float_value("x", &[1, c as i64, 12, 10])],
        nodes,
        vec![weight("w1", 1), weight("w2", 2)],
        vec![named_value("y")],
    );
    let m = Model::from_proto(proto, None).unwrap();
    let m = hmct_ir::testing::calibrate_for_tests(m, 2.0).unwrap();
    let g = hmct_ir::testing::feature_calibration(&m, "g", "mul", 1, 1.0).unwrap();
    let m = m.insert_calibrations(vec![g]).unwrap();
    let x = Tensor::from_f32(&[1, c, 12, 10], smooth(c * 120, 5)).unwrap();
    for threads in [1, 2] {
        let fused = Session::new(plan_model(&m).unwrap(), threads)
            .unwrap()
            .with_profiling();
        let plain = Session::new(plan_model(&m).unwrap(), threads)
            .unwrap()
            .without_fusion();
        let plan = fused.plan();
        let index = |n: &str| plan.node_index(n).unwrap();
        let tail = fused.fused_tail(index("c1")).expect("c1 has a tail");
        for member in ["sig", "g_HzCalibration", "mul"] {
            assert!(tail.contains(&index(member)), "{member} in c1's tail");
        }
        let g = plan.calibration("g_HzCalibration").unwrap();
        let thresholds: Vec<f32> = (0..c).map(|i| 0.5 + 0.1 * i as f32).collect();
        let per_channel = per_channel_int8(&thresholds);
        let configs = [
            Config::float(),
            Config::calibrated(),
            Config::calibrated().with(g, Override::Off),
            Config::float().with(g, Override::On),
            Config::calibrated().with(g, Override::Set(FakeQuant::Float16)),
            Config::calibrated().with(g, Override::Set(per_channel)),
        ];
        assert_same_as_node_by_node(&fused, &plain, &x, &configs, &format!("{threads} threads"));
        // The sigmoid's calibration changes the output when on (the test would not
        // see a fused step that skipped it otherwise).
        let run = |cfg: &Config| fused.run(&[("x", x.clone())], cfg).unwrap();
        assert_ne!(bits(&run(&configs[2])[0]), bits(&run(&configs[1])[0]));
    }
}
