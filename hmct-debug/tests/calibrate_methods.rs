//! The four threshold methods on synthetic data with known answers: a Gaussian with a
//! few far outliers (percentile, mse and kl must cut them, max must not), a uniform
//! distribution (nothing to cut), and the exact quantiles and errors computed here by
//! brute force. Also the group > 1 ConvTranspose refusal, on a hand-built model.

use hmct_debug::calibrate::{
    AbsHistogram, CalibrateError, CalibrateOptions, Method, calibrate_samples, kl_threshold,
    max_abs, mse_threshold, percentile_threshold,
};
use hmct_ir::testing::build::{self, float_value, named_value, node};
use hmct_ir::{Model, QType};
use hmct_proto::onnx::{
    AttributeProto, NodeProto, TensorProto, ValueInfoProto, attribute_proto::AttributeType,
};
use hmct_tensor::Tensor;

/// SplitMix64 and Box-Muller: deterministic data without a dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (((z ^ (z >> 31)) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

const N: usize = 1_000_000;
const OUTLIER: f32 = 40.0;

/// A standard Gaussian with two outliers at ±40 (1 in 500 000).
fn gaussian_with_outliers() -> Vec<f32> {
    let mut rng = Rng(7);
    let mut v: Vec<f32> = (0..N).map(|_| rng.normal() as f32).collect();
    v[1234] = OUTLIER;
    v[777_777] = -OUTLIER;
    v
}

fn histogram(data: &[f32], bins: usize) -> AbsHistogram {
    let mut h = AbsHistogram::new(max_abs(data), bins);
    h.add(data);
    h
}

/// The p-quantile of |x| by sorting.
fn exact_quantile(data: &[f32], p: f64) -> f32 {
    let mut a: Vec<f32> = data.iter().map(|v| v.abs()).collect();
    a.sort_by(f32::total_cmp);
    let rank = ((p * a.len() as f64).ceil() as usize).clamp(1, a.len());
    a[rank - 1]
}

/// Mean squared error of symmetric int8 fake quantization with threshold `t`, on the
/// data itself.
fn true_mse(data: &[f32], t: f32) -> f64 {
    let s = t / 127.0;
    data.iter()
        .map(|&x| {
            let q = (x / s).round_ties_even().clamp(-128.0, 127.0) * s;
            f64::from(x - q).powi(2)
        })
        .sum::<f64>()
        / data.len() as f64
}

#[test]
fn max_keeps_the_outliers() {
    let data = gaussian_with_outliers();
    assert_eq!(max_abs(&data), OUTLIER);
}

#[test]
fn percentile_is_the_quantile_and_cuts_the_outliers() {
    let data = gaussian_with_outliers();
    let h = histogram(&data, 2048);
    let width = OUTLIER / 2048.0;
    for p in [0.9, 0.99, 0.999, 0.99995] {
        let got = percentile_threshold(&h, p);
        let want = exact_quantile(&data, p);
        assert!((got - want).abs() <= width, "p = {p}: {got} vs {want}");
    }
    let t = percentile_threshold(&h, 0.99995);
    assert!(t > 3.5 && t < 6.0, "{t}");
}

#[test]
fn mse_finds_the_brute_force_optimum_and_cuts_the_outliers() {
    let data = gaussian_with_outliers();
    let t = mse_threshold(&histogram(&data, 2048), 127);
    assert!(t < OUTLIER / 2.0 && t > 3.0, "{t}");
    // The best threshold by direct search on the data, on a grid finer than the bins.
    let best = (1..=400)
        .map(|k| k as f32 * OUTLIER / 400.0)
        .map(|c| (true_mse(&data, c), c))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    let ours = true_mse(&data, t);
    eprintln!(
        "mse threshold {t}: {ours:e}; best on the grid {} at {}",
        best.0, best.1
    );
    assert!(
        ours <= best.0 * 1.02,
        "mse at {t}: {ours}, best {} at {}",
        best.0,
        best.1
    );
    assert!(ours < true_mse(&data, OUTLIER) / 3.0);
}

#[test]
fn kl_cuts_the_outliers_and_keeps_a_uniform_range() {
    let data = gaussian_with_outliers();
    let t = kl_threshold(&histogram(&data, 2048), 128);
    eprintln!("kl threshold on the gaussian: {t}");
    assert!(t > 2.5 && t < 10.0, "{t}");
    let mut rng = Rng(3);
    let uniform: Vec<f32> = (0..N).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect();
    let t = kl_threshold(&histogram(&uniform, 2048), 128);
    assert!(t >= 0.95, "{t}");
    // int16 has more levels than the histogram has bins: nothing is cut.
    assert_eq!(kl_threshold(&histogram(&data, 2048), 32768), OUTLIER);
}

#[test]
fn uniform_data_is_not_cut_by_mse() {
    let mut rng = Rng(5);
    let uniform: Vec<f32> = (0..N).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect();
    let t = mse_threshold(&histogram(&uniform, 2048), 127);
    assert!(t >= 0.98, "{t}");
}

// ---- end to end, through a model ----

fn model(
    inputs: Vec<ValueInfoProto>,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    outputs: &[&str],
) -> Model {
    let outputs = outputs.iter().map(|o| named_value(o)).collect();
    Model::from_proto(build::model(inputs, nodes, inits, outputs), None).unwrap()
}

/// x → Sigmoid: the graph input is the only tensor to calibrate.
fn sigmoid_model(n: usize) -> Model {
    model(
        vec![float_value("x", &[1, n as i64])],
        vec![node("sig", "Sigmoid", &["x"], &["y"])],
        Vec::new(),
        &["y"],
    )
}

/// The data split into four samples: thresholds must come out as if it were one.
fn samples(data: &[f32]) -> Vec<Vec<(String, Tensor)>> {
    data.chunks(N / 4)
        .map(|c| {
            vec![(
                "x".to_string(),
                Tensor::from_f32(&[1, c.len()], c.to_vec()).unwrap(),
            )]
        })
        .collect()
}

fn threshold_of(method: Method, data: &[f32]) -> f32 {
    let options = CalibrateOptions {
        method,
        ..Default::default()
    };
    let out =
        calibrate_samples(&sigmoid_model(N / 4), &samples(data), &options, &|_, _| {}).unwrap();
    assert_eq!(out.report.nodes.len(), 1);
    assert_eq!(out.report.nodes[0].input, "x");
    out.report.nodes[0].thresholds[0]
}

#[test]
fn methods_through_a_model_streamed_over_samples() {
    let data = gaussian_with_outliers();
    assert_eq!(threshold_of(Method::Max, &data), OUTLIER);
    let h = histogram(&data, 2048);
    assert_eq!(
        threshold_of(Method::Percentile, &data),
        percentile_threshold(&h, 0.99995)
    );
    assert_eq!(threshold_of(Method::Mse, &data), mse_threshold(&h, 127));
    assert_eq!(threshold_of(Method::Kl, &data), kl_threshold(&h, 128));
}

#[test]
fn progress_counts_every_run() {
    let data = gaussian_with_outliers();
    let calls = std::sync::Mutex::new(Vec::new());
    let options = CalibrateOptions {
        method: Method::Percentile,
        data_num: Some(3),
        ..Default::default()
    };
    let out = calibrate_samples(&sigmoid_model(N / 4), &samples(&data), &options, &|d, t| {
        calls.lock().unwrap().push((d, t))
    })
    .unwrap();
    assert_eq!(out.report.samples, 3);
    assert_eq!(out.report.samples_available, 4);
    // Two passes over three samples.
    assert_eq!(
        *calls.lock().unwrap(),
        (1..=6).map(|d| (d, 6)).collect::<Vec<_>>()
    );
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn weight(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: (0..n).map(|k| (k % 7) as f32 - 3.0).collect(),
        ..Default::default()
    }
}

/// ConvTranspose with group 2, weight [C_in=4, C_out/g=3, 2, 2]: six output
/// channels, element [i, j, ..] in channel (i / 2) * 3 + j (HZCALIBRATION §3). The
/// thresholds are those channels' max |w| and the calibrated model plans and runs.
#[test]
fn grouped_conv_transpose_weights_are_per_output_channel() {
    let mut ct = node("up", "ConvTranspose", &["x", "w"], &["y"]);
    ct.attribute = vec![int_attr("group", 2)];
    let dims = [4i64, 3, 2, 2];
    let m = model(
        vec![float_value("x", &[1, 4, 3, 3])],
        vec![ct],
        vec![weight("w", &dims)],
        &["y"],
    );
    let w: Vec<f32> = (0..48).map(|k| (k % 7) as f32 - 3.0).collect();
    let mut expected = vec![0f32; 6];
    for i in 0..4 {
        for j in 0..3 {
            let c = (i / 2) * 3 + j;
            for k in 0..4 {
                expected[c] = expected[c].max(w[(i * 3 + j) * 4 + k].abs());
            }
        }
    }
    let x = Tensor::from_f32(&[1, 4, 3, 3], vec![0.5; 36]).unwrap();
    let samples = vec![vec![("x".to_string(), x.clone())]];
    let out = calibrate_samples(&m, &samples, &CalibrateOptions::default(), &|_, _| {}).unwrap();
    let wn = out.report.nodes.iter().find(|n| n.input == "w").unwrap();
    assert_eq!(wn.axis, Some(1));
    assert_eq!(wn.thresholds, expected);
    let plan = hmct_quant::plan_model(&out.model).unwrap();
    let session = hmct_quant::Session::new(plan, 1).unwrap();
    let outputs = session
        .run(&[("x", x)], &hmct_quant::Config::calibrated())
        .unwrap();
    assert_eq!(outputs[0].shape(), &[1, 6, 4, 4]);

    // A weight whose first dimension the groups do not divide: one clear error.
    let mut ct = node("up", "ConvTranspose", &["x", "w"], &["y"]);
    ct.attribute = vec![int_attr("group", 3)];
    let m = model(
        vec![float_value("x", &[1, 4, 3, 3])],
        vec![ct],
        vec![weight("w", &dims)],
        &["y"],
    );
    let x = Tensor::from_f32(&[1, 4, 3, 3], vec![0.5; 36]).unwrap();
    let err = calibrate_samples(
        &m,
        &[vec![("x".to_string(), x)]],
        &CalibrateOptions::default(),
        &|_, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(err, CalibrateError::BadGroups { group: 3, .. }),
        "{err}"
    );
}

/// Gemm with transB: the weight is [N, K], per output channel along axis 0; a
/// ConvTranspose with group 1 along axis 1; int16 thresholds are the same maxima.
#[test]
fn weight_axes_of_gemm_and_conv_transpose() {
    let mut gemm = node("fc", "Gemm", &["x", "wg"], &["g"]);
    gemm.attribute = vec![int_attr("transB", 1)];
    let ct = node("up", "ConvTranspose", &["r", "wt"], &["y"]);
    let m = model(
        vec![float_value("x", &[1, 6])],
        vec![
            gemm,
            node("shape", "Constant", &[], &["shape"]),
            node("reshape", "Reshape", &["g", "shape"], &["r"]),
            ct,
        ],
        vec![weight("wg", &[8, 6]), weight("wt", &[2, 5, 2, 2])],
        &["y"],
    );
    // The Constant needs its value: [1, 2, 2, 2].
    let mut proto = m.into_proto();
    let graph = proto.graph.as_mut().unwrap();
    graph.node[1].attribute = vec![AttributeProto {
        name: Some("value".into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(TensorProto {
            dims: vec![4],
            data_type: Some(7),
            int64_data: vec![1, 2, 2, 2],
            ..Default::default()
        }),
        ..Default::default()
    }];
    let m = Model::from_proto(proto, None).unwrap();
    let x = Tensor::from_f32(&[1, 6], vec![1.0, -2.0, 0.5, 3.0, -1.0, 0.25]).unwrap();
    let options = CalibrateOptions {
        weight_qtype: QType::INT16,
        ..Default::default()
    };
    let out = calibrate_samples(&m, &[vec![("x".to_string(), x)]], &options, &|_, _| {}).unwrap();
    let by_input = |name: &str| out.report.nodes.iter().find(|n| n.input == name).unwrap();
    let wg = by_input("wg");
    assert_eq!(
        (wg.axis, wg.thresholds.len(), wg.qtype.as_str()),
        (Some(0), 8, "int16")
    );
    let wt = by_input("wt");
    assert_eq!((wt.axis, wt.thresholds.len()), (Some(1), 5));
    // Per-channel maxima of the (k % 7) - 3 pattern, checked by hand for channel 0 of
    // wg: elements 0..6 are -3..2, so 3.
    assert_eq!(wg.thresholds[0], 3.0);
    // Activations: x for the Gemm and r for the ConvTranspose (Reshape is not
    // quantized, so its output is what the ConvTranspose reads).
    let acts: Vec<&str> = out
        .report
        .nodes
        .iter()
        .filter(|n| n.kind == "activation")
        .map(|n| n.input.as_str())
        .collect();
    assert_eq!(acts, ["x", "r"]);
}
