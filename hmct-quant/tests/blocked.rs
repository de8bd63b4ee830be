//! Values kept channel-blocked between depthwise and pointwise convs change no bit:
//! a session that keeps them gives what a session keeping every value NCHW gives, on
//! the float and calibrated model, for full runs, for incremental runs from captured
//! activations (where conv tails do not run), with per-channel activation
//! calibration (which reads blocked values converted back), for every captured value
//! read back, on 1 and 2 threads.

use std::sync::Arc;

use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, int_attr, ints_attr, model, named_value, node};
use hmct_quant::fake_quant::QType;
use hmct_quant::{Capture, Config, FakeQuant, Override, Session, plan_model};
use hmct_tensor::{Tensor, tensor_to_proto};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// An inverted residual block twice over (pointwise 32 -> 64, depthwise 3x3 with Relu,
/// pointwise 64 -> 32) on a 14x14 map: the first with a SiLU (Sigmoid and Mul, which
/// calibration nodes split) after its first conv and a residual Add of the input; the
/// second with a Clip and a depthwise conv of stride 2. The first block's output is a
/// graph output too.
fn mobile_blocks() -> Model {
    let clip = |name: &str, x: &str, y: &str| node(name, "Clip", &[x, "zero", "six"], &[y]);
    let scalar =
        |name: &str, v: f32| tensor_to_proto(&Tensor::from_f32(&[], vec![v]).unwrap(), name);
    let proto = model(
        vec![float_value("x", &[1, 32, 14, 14])],
        vec![
            conv("e1", "x", "we1", "a1", 1, 1, 0),
            node("s1", "Sigmoid", &["a1"], &["g1"]),
            node("m1", "Mul", &["a1", "g1"], &["b1"]),
            conv("d1", "b1", "wd1", "c1", 64, 1, 1),
            node("q1", "Relu", &["c1"], &["e1o"]),
            conv("p1", "e1o", "wp1", "z1", 1, 1, 0),
            node("res", "Add", &["z1", "x"], &["y1"]),
            conv("e2", "y1", "we2", "a2", 1, 1, 0),
            clip("r2", "a2", "b2"),
            conv("d2", "b2", "wd2", "c2", 64, 2, 1),
            conv("p2", "c2", "wp2", "y2", 1, 1, 0),
        ],
        vec![
            weight("we1", &[64, 32, 1, 1], 1),
            weight("wd1", &[64, 1, 3, 3], 2),
            weight("wp1", &[32, 64, 1, 1], 3),
            weight("we2", &[64, 32, 1, 1], 4),
            weight("wd2", &[64, 1, 3, 3], 5),
            weight("wp2", &[32, 64, 1, 1], 6),
            scalar("zero", 0.0),
            scalar("six", 6.0),
        ],
        vec![named_value("y1"), named_value("y2")],
    );
    Model::from_proto(proto, None).unwrap()
}

/// A constant f32 weight of `shape` from `values(.., seed)`.
fn weight(name: &str, shape: &[usize], seed: u32) -> hmct_proto::onnx::TensorProto {
    let t = Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap();
    tensor_to_proto(&t, name)
}

/// A Conv with square strides and pads.
fn conv(
    name: &str,
    x: &str,
    w: &str,
    y: &str,
    group: i64,
    stride: i64,
    pad: i64,
) -> hmct_proto::onnx::NodeProto {
    let mut n = node(name, "Conv", &[x, w], &[y]);
    n.attribute.push(ints_attr("pads", vec![pad; 4]));
    n.attribute.push(ints_attr("strides", vec![stride; 2]));
    n.attribute.push(int_attr("group", group));
    n
}

fn bits(t: &Tensor) -> (Vec<usize>, Vec<u32>) {
    let v = t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect();
    (t.shape().to_vec(), v)
}

fn all_bits(ts: &[Arc<Tensor>]) -> Vec<(Vec<usize>, Vec<u32>)> {
    ts.iter().map(|t| bits(t)).collect()
}

/// Two sessions of `m` on `threads` threads: one that keeps values blocked where it
/// may, and one that keeps none.
fn blocked_and_plain(m: &Model, threads: usize) -> (Session, Session) {
    let blocked = Session::new(plan_model(m).unwrap(), threads).unwrap();
    let plain = Session::new(plan_model(m).unwrap(), threads)
        .unwrap()
        .without_blocked_values();
    (blocked, plain)
}

#[test]
fn blocked_values_change_no_bit() {
    let m = hmct_ir::testing::calibrate_for_tests(mobile_blocks(), 4.0).unwrap();
    // A calibration node between the SiLU's Sigmoid and Mul too (as calibrated models
    // have): with per-channel thresholds its output comes NCHW to a Mul whose other
    // input is blocked.
    let g1 = hmct_ir::testing::feature_calibration(&m, "g1", "m1", 1, 1.0).unwrap();
    let m = m.insert_calibrations(vec![g1]).unwrap();
    let x = Tensor::from_f32(&[1, 32, 14, 14], values(32 * 14 * 14, 7)).unwrap();
    for threads in [1, 2] {
        let (blocked, plain) = blocked_and_plain(&m, threads);
        // Blocked values are kept with AVX-512 only (the conv kernels' instruction set,
        // which `HMCT_CONV_ISA` may lower) and unless `HMCT_BLOCKED=off`.
        let env_allows = std::env::var("HMCT_CONV_ISA").as_deref() != Ok("avx2")
            && std::env::var("HMCT_BLOCKED").as_deref() != Ok("off");
        #[cfg(target_arch = "x86_64")]
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        let avx512 = false;
        if !(avx512 && env_allows) {
            assert_eq!(blocked.blocked_values(), 0);
            return;
        }
        assert_eq!(plain.blocked_values(), 0);
        // Stored blocked by convs: the four convs' outputs (the pointwise convs' read
        // by the SiLU and the Clip, the depthwise convs'), and their tails' outputs:
        // the SiLU's and the Relu's chains through their calibration nodes, the Clip's
        // calibration node and the second depthwise conv's.
        assert_eq!(blocked.blocked_values(), 8);
        let plan = blocked.plan();
        let activations: Vec<usize> = (0..plan.calibrations().len())
            .filter(|&c| !plan.calibrations()[c].is_weight)
            .collect();
        assert!(activations.len() >= 4);
        let mut configs = vec![Config::float(), Config::calibrated()];
        let mut per_channel = 0;
        for &c in &activations {
            configs.push(Config::calibrated().with(c, Override::Off));
            configs.push(Config::float().with(c, Override::On));
            // Per-channel thresholds: a reader that does not take blocked values.
            for channels in [32, 64] {
                let thresholds: Vec<f32> = (0..channels).map(|i| 1.0 + 0.1 * i as f32).collect();
                let qtype = QType::Int {
                    bits: 8,
                    signed: true,
                };
                let fq = FakeQuant::from_thresholds(qtype, &thresholds, Some(1)).unwrap();
                let cfg = Config::calibrated().with(c, Override::Set(fq));
                if plain.run(&[("x", x.clone())], &cfg).is_ok() {
                    per_channel += 1;
                    configs.push(cfg);
                }
            }
        }
        assert_eq!(per_channel, activations.len());
        // Full runs.
        for cfg in &configs {
            let got = blocked.run(&[("x", x.clone())], cfg).unwrap();
            let want = plain.run(&[("x", x.clone())], cfg).unwrap();
            assert_eq!(
                all_bits(&got),
                all_bits(&want),
                "{cfg:?}, {threads} threads"
            );
        }
        // Captured activations, every value read back, and probes from them.
        let outputs = plan.outputs().to_vec();
        let bound = blocked.bind_inputs(&[("x", x.clone())]).unwrap();
        let plain_bound = plain.bind_inputs(&[("x", x.clone())]).unwrap();
        for base in [Config::float(), Config::calibrated()] {
            let kept = blocked
                .run_from(&bound, None, &base, &outputs, Capture::All)
                .unwrap();
            let plain_kept = plain
                .run_from(&plain_bound, None, &base, &outputs, Capture::All)
                .unwrap();
            for slot in 0..plan.num_values() {
                if let (Ok(a), Ok(b)) = (blocked.value(&kept, slot), plain.value(&plain_kept, slot))
                {
                    if a.as_f32().is_some() {
                        assert_eq!(bits(&a), bits(&b), "value {}", plan.value_name(slot));
                    }
                }
            }
            for cfg in &configs {
                let probe = blocked
                    .run_from(&kept, Some(&base), cfg, &outputs, Capture::Wanted)
                    .unwrap();
                let got: Vec<Arc<Tensor>> = outputs
                    .iter()
                    .map(|&s| blocked.value(&probe, s).unwrap())
                    .collect();
                let want = plain.run(&[("x", x.clone())], cfg).unwrap();
                assert_eq!(
                    all_bits(&got),
                    all_bits(&want),
                    "probe {cfg:?} from {base:?}"
                );
            }
        }
    }
}

/// Convs of other types than f32 that could read blocked values (a depthwise conv after
/// a pointwise one, in f64) run as they always did: no value of theirs is blocked.
#[test]
fn f64_convs_run_as_before() {
    use hmct_tensor::ndarray::{ArrayD, IxDyn};
    let f64_tensor = |shape: &[usize], seed| {
        let v: Vec<f64> = values(shape.iter().product(), seed)
            .into_iter()
            .map(f64::from)
            .collect();
        Tensor::F64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    };
    let mut x = float_value("x", &[1, 32, 8, 8]);
    if let Some(hmct_proto::onnx::type_proto::Value::TensorType(t)) =
        x.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.elem_type = Some(11);
    }
    let mut dw = node("d", "Conv", &["a", "wd"], &["y"]);
    dw.attribute.push(ints_attr("pads", vec![1; 4]));
    dw.attribute.push(int_attr("group", 64));
    let proto = model(
        vec![x],
        vec![node("e", "Conv", &["x", "we"], &["a"]), dw],
        vec![
            tensor_to_proto(&f64_tensor(&[64, 32, 1, 1], 1), "we"),
            tensor_to_proto(&f64_tensor(&[64, 1, 3, 3], 2), "wd"),
        ],
        vec![named_value("y")],
    );
    let m = Model::from_proto(proto, None).unwrap();
    let input = f64_tensor(&[1, 32, 8, 8], 3);
    let run = |s: Session| s.run(&[("x", input.clone())], &Config::float()).unwrap();
    let (blocked, plain) = blocked_and_plain(&m, 1);
    let (got, want) = (run(blocked), run(plain));
    let Tensor::F64(g) = &*got[0] else {
        panic!("an f64 output")
    };
    let Tensor::F64(w) = &*want[0] else {
        panic!("an f64 output")
    };
    assert_eq!(g.shape(), &[1, 64, 8, 8]);
    assert!(
        g.iter()
            .zip(w.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

/// Three pointwise convs 32 -> 64 on a 28x28 map (larger than the 20x20 planes that
/// convs store blocked for any reader), each with its activation, each read by one
/// depthwise conv: 3x3 of stride 2, 3x3 of stride 1, 5x5 of stride 1; then a pointwise
/// conv 64 -> 32 after each.
fn wide_blocks() -> Model {
    let mut nodes = Vec::new();
    let mut weights = Vec::new();
    for (i, (k, stride)) in [(3, 2), (3, 1), (5, 1)].into_iter().enumerate() {
        let at = |s: &str| format!("{s}{i}");
        nodes.push(conv(&at("e"), "x", &at("we"), &at("a"), 1, 1, 0));
        nodes.push(node(&at("r"), "Relu", &[&at("a")], &[&at("b")]));
        nodes.push(conv(
            &at("d"),
            &at("b"),
            &at("wd"),
            &at("c"),
            64,
            stride,
            k / 2,
        ));
        nodes.push(conv(&at("p"), &at("c"), &at("wp"), &at("y"), 1, 1, 0));
        let seed = 10 * i as u32;
        weights.push(weight(&at("we"), &[64, 32, 1, 1], seed + 1));
        weights.push(weight(
            &at("wd"),
            &[64, 1, k as usize, k as usize],
            seed + 2,
        ));
        weights.push(weight(&at("wp"), &[32, 64, 1, 1], seed + 3));
    }
    let proto = model(
        vec![float_value("x", &[1, 32, 28, 28])],
        nodes,
        weights,
        vec![named_value("y0"), named_value("y1"), named_value("y2")],
    );
    Model::from_proto(proto, None).unwrap()
}

/// A 28x28 value is stored blocked only for depthwise convs that run on the band
/// kernel from it (stride 2, or 25 taps or more), and changes no bit either way.
#[test]
fn wide_values_are_blocked_for_band_kernel_readers_only() {
    let m = wide_blocks();
    let x = Tensor::from_f32(&[1, 32, 28, 28], values(32 * 28 * 28, 11)).unwrap();
    for threads in [1, 2] {
        let (blocked, plain) = blocked_and_plain(&m, threads);
        let want = plain.run(&[("x", x.clone())], &Config::float()).unwrap();
        let got = blocked.run(&[("x", x.clone())], &Config::float()).unwrap();
        assert_eq!(all_bits(&got), all_bits(&want), "{threads} threads");
        if blocked.blocked_values() == 0 {
            // No AVX-512 (or HMCT_BLOCKED=off): nothing more to see.
            continue;
        }
        let plan = blocked.plan();
        let bound = blocked.bind_inputs(&[("x", x.clone())]).unwrap();
        let kept = blocked
            .run_from(&bound, None, &Config::float(), plan.outputs(), Capture::All)
            .unwrap();
        let rank = |name: &str| kept.get(plan.value(name).unwrap()).unwrap().shape().len();
        assert_eq!(rank("b0"), 5, "read by a depthwise conv of stride 2");
        assert_eq!(rank("b1"), 4, "read by a 3x3 depthwise conv of stride 1");
        assert_eq!(rank("b2"), 5, "read by a 5x5 depthwise conv");
        let plain_bound = plain.bind_inputs(&[("x", x.clone())]).unwrap();
        let plain_kept = plain
            .run_from(
                &plain_bound,
                None,
                &Config::float(),
                plan.outputs(),
                Capture::All,
            )
            .unwrap();
        for slot in 0..plan.num_values() {
            let a = blocked.value(&kept, slot).unwrap();
            let b = plain.value(&plain_kept, slot).unwrap();
            assert_eq!(bits(&a), bits(&b), "value {}", plan.value_name(slot));
        }
    }
}
