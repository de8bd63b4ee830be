//! plot-distribution and get-channelwise-data-distribution on calibrated pnet: the
//! values, statistics and histogram counts against a direct computation (a full run,
//! sorting, fake quantization written out here), the files written, and the argument
//! errors. Needs ../shared/models; skips with a note without it.

use std::path::{Path, PathBuf};

use hmct_debug::channelwise::{
    ChannelwiseError, ChannelwiseKind, ChannelwiseOptions, get_channelwise_data_distribution,
    write_channelwise,
};
use hmct_debug::distribution::{
    DistributionError, DistributionKind, DistributionOptions, plot_distribution, write_distribution,
};
use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_ir::Model;
use hmct_metrics::Metric;
use hmct_plot::Format;
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

fn pnet() -> Option<(Model, PathBuf)> {
    let model = hmct_ir::testing::calibrated_pnet().unwrap()?;
    let data = hmct_ir::testing::shared_dir()?.join("models/mtcnn_pnet/calibration_data");
    Some((model, data))
}

fn engine(model: &Model, data: &Path) -> Engine {
    Engine::new(model.clone(), data, &EngineOptions::default()).unwrap()
}

/// A value by full runs of `config` on every sample, the samples' tensors concatenated
/// along axis 0 (P-Net's samples have batch 1).
fn full_run_value(model: &Model, data: &Path, config: &Config, value: &str) -> Tensor {
    let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
    let specs = session.plan().input_specs();
    let ds = Dataset::open(data, &specs).unwrap();
    let slot = session.plan().value(value).unwrap();
    let mut parts = Vec::new();
    for i in 0..ds.len() {
        let sample = ds.sample(i).unwrap();
        let refs: Vec<(&str, Tensor)> = sample
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = session.bind_inputs(&refs).unwrap();
        let values = session
            .run_from(&bound, None, config, &[slot], Capture::All)
            .unwrap();
        parts.push(
            session
                .value(&values, slot)
                .unwrap()
                .as_f32()
                .unwrap()
                .to_owned(),
        );
    }
    let views: Vec<_> = parts.iter().map(|a| a.view()).collect();
    Tensor::from(hmct_tensor::ndarray::concatenate(hmct_tensor::ndarray::Axis(0), &views).unwrap())
}

/// The samples of the P-Net data.
const SAMPLES: usize = 8;

fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().iter().copied().collect()
}

/// numpy.histogram's counts of `values` on `edges` (last bin closed).
fn counts(values: &[f32], edges: &[f64]) -> Vec<u64> {
    let bins = edges.len() - 1;
    let mut c = vec![0u64; bins];
    for &v in values {
        let v = f64::from(v);
        let k = edges[..bins].iter().rposition(|e| v >= *e).unwrap();
        c[k] += 1;
    }
    c
}

fn is_picture(path: &Path, min_w: u32, min_h: u32) {
    let img = image::open(path).unwrap().to_rgb8();
    assert!(
        img.width() >= min_w && img.height() >= min_h,
        "{}: {:?}",
        path.display(),
        img.dimensions()
    );
    let ink = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    assert!(
        ink > 5_000,
        "{}: only {ink} non-white pixels",
        path.display()
    );
    let mut colours: Vec<[u8; 3]> = img.pixels().map(|p| p.0).collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(
        colours.len() > 8,
        "{}: {} colours",
        path.display(),
        colours.len()
    );
}

const ACT: &str = "p_re_lu/add:0_pooling0_HzCalibration";
const WEIGHT: &str = "conv2d_1/kernel:0_HzCalibration";
const NODE: &str = "conv2d_1";

#[test]
fn distributions_match_a_direct_computation() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let options = DistributionOptions {
        nodes: vec![ACT.into(), WEIGHT.into(), NODE.into()],
        ..DistributionOptions::default()
    };
    let result = plot_distribution(&engine, &options).unwrap();
    assert_eq!(result.items.len(), 3);
    assert_eq!(result.samples, SAMPLES);

    // Activation: the float model's input of the node, threshold 4 (the stand-in
    // calibration's), max |x|.
    let act = &result.items[0];
    assert_eq!(act.kind, DistributionKind::Activation);
    assert_eq!(
        act.file_stem,
        "activation_p_re_lu_add_0_pooling0_HzCalibration"
    );
    let x = f32s(&full_run_value(
        &model,
        &data,
        &Config::float(),
        "p_re_lu/add:0_pooling0",
    ));
    assert_eq!(act.samples, SAMPLES);
    assert!(act.title.contains("8 samples"), "{}", act.title);
    let p = &act.panels[0];
    assert_eq!(p.threshold, Some(4.0));
    let max_abs = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert_eq!(p.max_abs, Some(f64::from(max_abs)));
    let s = &p.series[0];
    let zeros = x.iter().filter(|v| **v == 0.0).count();
    assert_eq!(s.summary.elements, x.len());
    assert_eq!(s.summary.zeros, zeros);
    assert_eq!(s.left_out, zeros);
    let non_zero: Vec<f32> = x.iter().copied().filter(|v| *v != 0.0).collect();
    assert_eq!(s.values, non_zero);
    assert_eq!(p.edges.len(), 101);
    assert_eq!(s.counts, counts(&non_zero, &p.edges));
    assert_eq!(s.counts.iter().sum::<u64>() as usize, non_zero.len());
    let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / x.len() as f64;
    assert!((s.summary.mean - mean).abs() < 1e-9);

    // Weight: per-channel symmetric int8 on axis 0, written out here.
    let w = &result.items[1];
    assert_eq!(w.kind, DistributionKind::Weight);
    let cal = model.calibration_by_name(WEIGHT).unwrap();
    let weight = model.constant_tensor(cal.input()).unwrap().unwrap();
    let wv = f32s(&weight);
    let thresholds = cal.thresholds();
    let per_channel = wv.len() / thresholds.len();
    let quantized: Vec<f32> = wv
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = thresholds[i / per_channel] / 127.0;
            (v / s).round_ties_even().clamp(-128.0, 127.0) * s
        })
        .collect();
    let p = &w.panels[0];
    let want_q: Vec<f32> = quantized.iter().copied().filter(|v| *v != 0.0).collect();
    assert_eq!(p.series[1].values.len(), want_q.len());
    for (g, e) in p.series[1].values.iter().zip(&want_q) {
        assert!((g - e).abs() <= 1e-6 * e.abs().max(1e-3), "{g} vs {e}");
    }
    let cosine = hmct_metrics::compute(Metric::CosineSimilarity, &wv, &quantized).unwrap();
    assert!((w.cosine.unwrap() - cosine).abs() < 1e-9);
    assert!(w.title.contains("cosine 0.99"), "{}", w.title);

    // Regular node: float and calibrated outputs by full runs, and their difference.
    let n = &result.items[2];
    assert_eq!(n.kind, DistributionKind::Node);
    assert_eq!(n.tensor, "convolution_output3");
    assert_eq!(n.file_stem, "node_output_convolution_output3_of_conv2d_1");
    let fx = f32s(&full_run_value(
        &model,
        &data,
        &Config::float(),
        "convolution_output3",
    ));
    let cx = f32s(&full_run_value(
        &model,
        &data,
        &Config::calibrated(),
        "convolution_output3",
    ));
    let cosine = hmct_metrics::compute(Metric::CosineSimilarity, &fx, &cx).unwrap();
    assert_eq!(n.cosine, Some(cosine));
    assert_eq!(n.panels.len(), 2);
    assert!(n.title.contains("8 samples"), "{}", n.title);
    assert_eq!(n.panels[0].series[0].summary.elements, fx.len());
    let diff: Vec<f32> = fx.iter().zip(&cx).map(|(x, y)| y - x).collect();
    let errors = &n.panels[1];
    assert_eq!(errors.series[0].values, diff);
    assert_eq!(errors.series[0].counts, counts(&diff, &errors.edges));
    let max_err = diff.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert_eq!(errors.series[0].summary.max_abs, f64::from(max_err));

    // Files: one per item, real pictures.
    let dir = tempfile::tempdir().unwrap();
    let written = write_distribution(&result, dir.path(), Format::Png).unwrap();
    assert_eq!(
        written,
        vec![
            dir.path()
                .join("activation_p_re_lu_add_0_pooling0_HzCalibration.png"),
            dir.path()
                .join("weight_conv2d_1_kernel_0_HzCalibration.png"),
            dir.path()
                .join("node_output_convolution_output3_of_conv2d_1.png"),
        ]
    );
    for p in &written[..2] {
        is_picture(p, 800, 450);
    }
    // Two panels side by side.
    is_picture(&written[2], 1400, 450);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);

    // The JSON form carries counts, not the raw values.
    let json = serde_json::to_value(&result).unwrap();
    let series = &json["items"][0]["panels"][0]["series"][0];
    assert!(series.get("values").is_none());
    assert_eq!(series["counts"].as_array().unwrap().len(), 100);
}

#[test]
fn distribution_errors() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let e = plot_distribution(&engine, &DistributionOptions::default()).unwrap_err();
    assert!(
        matches!(e, DistributionError::NoNodes) && e.is_usage(),
        "{e}"
    );
    let e = plot_distribution(
        &engine,
        &DistributionOptions {
            nodes: vec!["conv2d_1".into(), "conv2d_l".into()],
            ..DistributionOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(&e, DistributionError::Engine(EngineError::UnknownNodes(u)) if u[0].name == "conv2d_l"),
        "{e}"
    );
    assert!(e.is_usage());
    assert!(e.to_string().contains("did you mean"), "{e}");
}

#[test]
fn channel_statistics_match_a_direct_computation() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let result = get_channelwise_data_distribution(
        &engine,
        &ChannelwiseOptions {
            nodes: vec![WEIGHT.into(), ACT.into()],
            ..ChannelwiseOptions::default()
        },
    )
    .unwrap();

    // numpy's linear quantile.
    fn quantile(sorted: &[f32], q: f64) -> f64 {
        let pos = q * (sorted.len() - 1) as f64;
        let (i, f) = (pos.floor() as usize, pos.fract());
        let a = f64::from(sorted[i]);
        if f == 0.0 {
            a
        } else {
            a + (f64::from(sorted[i + 1]) - a) * f
        }
    }
    let check = |values: &[f32],
                 shape: &[usize],
                 axis: usize,
                 got: &[hmct_debug::channelwise::ChannelStats]| {
        assert_eq!(got.len(), shape[axis]);
        let inner: usize = shape[axis + 1..].iter().product();
        for (c, stats) in got.iter().enumerate() {
            let mut xs: Vec<f32> = values
                .iter()
                .enumerate()
                .filter(|(i, _)| (i / inner) % shape[axis] == c)
                .map(|(_, v)| *v)
                .collect();
            xs.sort_by(f32::total_cmp);
            assert_eq!(stats.channel, c);
            assert_eq!(stats.count, xs.len());
            assert_eq!(stats.min, f64::from(xs[0]));
            assert_eq!(stats.max, f64::from(xs[xs.len() - 1]));
            assert_eq!(stats.median, quantile(&xs, 0.5));
            assert_eq!(stats.q1, quantile(&xs, 0.25));
            assert_eq!(stats.q3, quantile(&xs, 0.75));
            let mean = xs.iter().map(|v| f64::from(*v)).sum::<f64>() / xs.len() as f64;
            assert!((stats.mean - mean).abs() < 1e-9);
            let max_abs = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(stats.max_abs, f64::from(max_abs));
        }
    };

    // Weight: axis 0 (the node's axis), output channels.
    let w = &result.items[0];
    assert_eq!(w.kind, ChannelwiseKind::Weight);
    assert_eq!(w.axis, 0);
    let cal = model.calibration_by_name(WEIGHT).unwrap();
    let weight = model.constant_tensor(cal.input()).unwrap().unwrap();
    assert_eq!(w.shape, weight.shape());
    check(&f32s(&weight), &w.shape, 0, &w.channels);

    // Activation: axis 1 of the float input, over every sample.
    let a = &result.items[1];
    assert_eq!(a.kind, ChannelwiseKind::Activation);
    assert_eq!(a.axis, 1);
    assert_eq!(
        (a.samples, w.samples, result.samples),
        (SAMPLES, 1, SAMPLES)
    );
    let x = full_run_value(&model, &data, &Config::float(), "p_re_lu/add:0_pooling0");
    assert_eq!(a.shape[0] * SAMPLES, x.shape()[0]);
    assert_eq!(a.shape[1..], x.shape()[1..]);
    check(&f32s(&x), x.shape(), 1, &a.channels);
    let title = hmct_debug::channelwise::item_spec(a).figure.title;
    assert!(title.contains("over 8 samples"), "{title}");

    // An explicit axis, counted from the end.
    let last = get_channelwise_data_distribution(
        &engine,
        &ChannelwiseOptions {
            nodes: vec![ACT.into()],
            axis: Some(-1),
            ..ChannelwiseOptions::default()
        },
    )
    .unwrap();
    let item = &last.items[0];
    assert_eq!(item.axis, x.shape().len() - 1);
    check(&f32s(&x), x.shape(), item.axis, &item.channels);

    // Files: the box plot and the CSV, which holds the same numbers.
    let dir = tempfile::tempdir().unwrap();
    let written = write_channelwise(&result, dir.path(), Format::Png).unwrap();
    assert_eq!(
        written,
        vec![
            dir.path()
                .join("conv2d_1_kernel_0_HzCalibration_boxplot.png"),
            dir.path()
                .join("conv2d_1_kernel_0_HzCalibration_channel_stats.csv"),
            dir.path()
                .join("p_re_lu_add_0_pooling0_HzCalibration_boxplot.png"),
            dir.path()
                .join("p_re_lu_add_0_pooling0_HzCalibration_channel_stats.csv"),
        ]
    );
    is_picture(&written[0], 600, 400);
    is_picture(&written[2], 600, 400);
    let csv = std::fs::read_to_string(&written[1]).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("channel,count,min,q1,median,mean,q3,max,max_abs")
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|c| c.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), w.channels.len());
    for (row, c) in rows.iter().zip(&w.channels) {
        assert_eq!(
            row,
            &vec![
                c.channel as f64,
                c.count as f64,
                c.min,
                c.q1,
                c.median,
                c.mean,
                c.q3,
                c.max,
                c.max_abs
            ]
        );
    }
}

#[test]
fn channelwise_errors() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let run = |nodes: &[&str], axis: Option<i64>| {
        get_channelwise_data_distribution(
            &engine,
            &ChannelwiseOptions {
                nodes: nodes.iter().map(|s| s.to_string()).collect(),
                axis,
                ..ChannelwiseOptions::default()
            },
        )
        .unwrap_err()
    };
    let e = run(&["conv2d_1"], None);
    assert!(
        matches!(e, ChannelwiseError::NotCalibration(_)) && e.is_usage(),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("'conv2d_1'") && msg.contains(WEIGHT), "{msg}");
    let e = run(&["p_re_lu"], None);
    assert!(e.to_string().contains("without calibration nodes"), "{e}");
    let e = run(&[ACT], Some(4));
    assert!(
        matches!(e, ChannelwiseError::AxisOutOfRange { .. }) && e.is_usage(),
        "{e}"
    );
    let e = run(&[ACT], Some(-5));
    assert!(matches!(e, ChannelwiseError::AxisOutOfRange { .. }), "{e}");
    let e = run(&["nope_HzCalibration"], None);
    assert!(e.is_usage(), "{e}");
    let e = run(&[], None);
    assert!(matches!(e, ChannelwiseError::NoNodes), "{e}");
}
