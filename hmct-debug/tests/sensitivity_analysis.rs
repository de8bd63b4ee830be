//! sensitivity-analysis on a calibrated real model (pnet) against a direct
//! computation: a fresh session, one full forward run per configuration and sample
//! from the inputs, the metric computed here, the tool's aggregation. Also the pick
//! by threshold against get-sensitivity-of-nodes, int16 de-quantization, the files
//! written (PNG decoded: size, not blank) and the argument errors. Needs
//! ../shared/models; skips with a note without it.

use std::path::{Path, PathBuf};

use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::sensitivity::{SensitivityOptions, get_sensitivity_of_nodes};
use hmct_debug::sensitivity_analysis::{
    AnalysisError, DequantQType, SensitivityAnalysis, SensitivityAnalysisOptions,
    sensitivity_analysis, write_partial_quantization,
};
use hmct_ir::{Model, QType};
use hmct_metrics::{Metric, PairStats};
use hmct_quant::{Capture, Config, Override, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

fn pnet() -> Option<(Model, PathBuf)> {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return None;
    };
    let data = hmct_ir::testing::shared_dir()?.join("models/mtcnn_pnet/calibration_data");
    Some((model, data))
}

fn engine(model: &Model, data: &Path) -> Engine {
    Engine::new(model.clone(), data, &EngineOptions::default()).unwrap()
}

fn analyse(engine: &Engine, options: &SensitivityAnalysisOptions) -> SensitivityAnalysis {
    sensitivity_analysis(engine, options, &|_, _, _| {}).unwrap()
}

/// Full forward runs on an independent session.
struct Reference<'m> {
    model: &'m Model,
    session: Session,
    samples: Vec<Vec<(String, Tensor)>>,
}

impl<'m> Reference<'m> {
    fn new(model: &'m Model, data: &Path) -> Self {
        let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
        let specs = session.plan().input_specs();
        let ds = Dataset::open(data, &specs).unwrap();
        let samples = (0..ds.len()).map(|i| ds.sample(i).unwrap()).collect();
        Reference {
            model,
            session,
            samples,
        }
    }

    fn outputs(&self, s: usize, config: &Config) -> Vec<Tensor> {
        let inputs: Vec<(&str, Tensor)> = self.samples[s]
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = self.session.bind_inputs(&inputs).unwrap();
        let outs = self.session.plan().outputs().to_vec();
        let values = self
            .session
            .run_from(&bound, None, config, &outs, Capture::Wanted)
            .unwrap();
        outs.iter()
            .map(|&o| (*self.session.value(&values, o).unwrap()).clone())
            .collect()
    }

    /// The metric of `config` against the float model: mean over samples, then
    /// over outputs.
    fn figure(&self, config: &Config, metric: Metric, samples: usize) -> f64 {
        let mut per_output: Vec<Vec<f64>> = Vec::new();
        for s in 0..samples {
            let float = self.outputs(s, &Config::float());
            let other = self.outputs(s, config);
            for (o, (x, y)) in float.iter().zip(&other).enumerate() {
                let mut stats = PairStats::new();
                let x: Vec<f32> = x.as_f32().unwrap().iter().copied().collect();
                let y: Vec<f32> = y.as_f32().unwrap().iter().copied().collect();
                stats.update(&x, &y).unwrap();
                if per_output.len() <= o {
                    per_output.push(Vec::new());
                }
                per_output[o].push(stats.metric(metric));
            }
        }
        let means: Vec<f64> = per_output
            .iter()
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
            .collect();
        means.iter().sum::<f64>() / means.len() as f64
    }

    fn cal_index(&self, name: &str) -> usize {
        self.session.plan().calibration(name).unwrap()
    }

    /// The configurations of the two series, built from the calibration-node names
    /// (hmct-ir's input-calibration search, not the engine's).
    fn check(&self, result: &SensitivityAnalysis, samples: usize, qtype: DequantQType) {
        let close = |a: f64, b: f64, what: &str| {
            assert!(
                a == b || (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                "{what}: analysis {a} vs direct {b}"
            );
        };
        let m = result.metric;
        close(
            result.baseline,
            self.figure(&Config::float(), m, samples),
            "baseline",
        );
        close(
            result.calibrated,
            self.figure(&Config::calibrated(), m, samples),
            "none",
        );
        let mut cumulative = Config::calibrated();
        for node in &result.nodes {
            let id = self.model.node_id(&node.name).unwrap();
            let cals: Vec<String> = hmct_ir::input_calibrations(self.model, id)
                .into_iter()
                .map(|c| self.model.node_name(c).to_string())
                .collect();
            assert_eq!(cals, node.calibrations, "{}", node.name);
            let single = cals.iter().fold(Config::float(), |c, n| {
                c.with(self.cal_index(n), Override::On)
            });
            close(node.single, self.figure(&single, m, samples), &node.name);
            for n in &cals {
                let setting = match qtype {
                    DequantQType::Float32 => Override::Off,
                    DequantQType::Int16 => {
                        let cal = self.model.calibration_by_name(n).unwrap();
                        Override::Set(
                            hmct_quant::fake_quant_for(self.model, &cal, Some(&QType::INT16))
                                .unwrap(),
                        )
                    }
                };
                cumulative = cumulative.with(self.cal_index(n), setting);
            }
            close(
                node.cumulative,
                self.figure(&cumulative, m, samples),
                &node.name,
            );
        }
    }
}

#[test]
fn picked_series_match_full_runs() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let options = SensitivityAnalysisOptions {
        pick_threshold: 0.9999,
        data_num: Some(3),
        ..Default::default()
    };
    let result = analyse(&engine, &options);

    // The pick: every regular node at or below the threshold, most sensitive first,
    // with the ranking's values.
    let ranking = get_sensitivity_of_nodes(
        &engine,
        &SensitivityOptions {
            data_num: Some(3),
            ..Default::default()
        },
        &|_, _| {},
    )
    .unwrap();
    let expected: Vec<(&str, f64)> = ranking
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.values.0[0].1))
        .filter(|(_, v)| *v <= 0.9999)
        .collect();
    let got: Vec<(&str, f64)> = result
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.sensitivity.unwrap()))
        .collect();
    assert_eq!(got, expected);
    assert!(result.nodes.len() >= 2, "pick too small to test: {got:?}");
    assert!(got.windows(2).all(|w| w[0].1 <= w[1].1));
    // Single-node quantization on the model outputs is what the ranking measures.
    for n in &result.nodes {
        assert_eq!(Some(n.single), n.sensitivity);
    }
    assert_eq!(result.pick_threshold, Some(0.9999));
    assert_eq!(result.data_num, 3);

    Reference::new(&model, &data).check(&result, 3, DequantQType::Float32);
    // De-quantizing every quantized node leaves no quantized regular node ON.
    let all = analyse(
        &engine,
        &SensitivityAnalysisOptions {
            pick_threshold: 1.0,
            data_num: Some(1),
            ..Default::default()
        },
    );
    assert_eq!(
        all.nodes.len(),
        hmct_ir::quantized_nodes(&model).len(),
        "threshold 1.0 picks every quantized node"
    );
    assert_eq!(all.nodes.last().unwrap().cumulative, all.baseline);
}

#[test]
fn given_nodes_int16_and_mse_match_full_runs() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let names: Vec<String> = hmct_ir::quantized_nodes(&model)
        .into_iter()
        .rev()
        .take(3)
        .map(|id| model.node_name(id).to_string())
        .collect();
    for (metric, qtype) in [
        (Metric::Mse, DequantQType::Int16),
        (Metric::CosineSimilarity, DequantQType::Int16),
        (Metric::Sqnr, DequantQType::Float32),
    ] {
        let mut given = names.clone();
        given.push(names[0].clone()); // a repeat is analysed once
        let result = analyse(
            &engine,
            &SensitivityAnalysisOptions {
                sensitive_nodes: given,
                data_num: Some(2),
                metric,
                qtype,
                ..Default::default()
            },
        );
        let order: Vec<&str> = result.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(order, names.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(result.nodes.iter().all(|n| n.sensitivity.is_none()));
        assert_eq!(result.pick_threshold, None);
        assert_eq!(result.qtype, qtype);
        Reference::new(&model, &data).check(&result, 2, qtype);
        if qtype == DequantQType::Int16 {
            // int16 keeps some error where float32 would have none.
            assert_ne!(result.nodes.last().unwrap().cumulative, result.baseline);
        }
    }
}

#[test]
fn writes_the_figure_and_its_json() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let result = analyse(
        &engine,
        &SensitivityAnalysisOptions {
            pick_threshold: 0.9999,
            ..Default::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("new/sub");
    let written = write_partial_quantization(&result, &out).unwrap();
    assert_eq!(
        written,
        vec![
            out.join("partial_quantization.png"),
            out.join("partial_quantization.json")
        ]
    );
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["partial_quantization.json", "partial_quantization.png"]
    );

    let img = image::open(&written[0]).unwrap().to_rgb8();
    assert!(
        img.width() >= 640 && img.height() >= 400,
        "{:?}",
        img.dimensions()
    );
    // Not blank: the red cumulative line and the green crosses are drawn.
    let count = |pred: &dyn Fn(&image::Rgb<u8>) -> bool| img.pixels().filter(|p| pred(p)).count();
    assert!(
        count(&|p| p[0] > 200 && p[1] < 60 && p[2] < 60) > 100,
        "no red line"
    );
    assert!(
        count(&|p| p[1] > 120 && p[0] < 60 && p[2] < 60) > 20,
        "no green crosses"
    );
    assert!(
        count(&|p| p[2] > 200 && p[0] < 60 && p[1] < 60) > 100,
        "no blue baseline"
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&written[1]).unwrap()).unwrap();
    assert_eq!(json["metric"], "cosine-similarity");
    assert_eq!(json["qtype"], "float32");
    // serde_json reads floats back to within an ulp.
    let same = |j: &serde_json::Value, v: f64| {
        let j = j.as_f64().unwrap();
        assert!((j - v).abs() <= 1e-15 * v.abs(), "{j} vs {v}");
    };
    same(&json["baseline"], result.baseline);
    same(&json["calibrated"], result.calibrated);
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), result.nodes.len());
    for (j, n) in nodes.iter().zip(&result.nodes) {
        assert_eq!(j["name"], n.name.as_str());
        same(&j["single"], n.single);
        same(&j["cumulative"], n.cumulative);
    }
    // The report reads the file back with the same type: nothing is lost.
    let text = std::fs::read(&written[1]).unwrap();
    let read: SensitivityAnalysis = serde_json::from_slice(&text).unwrap();
    assert_eq!(hmct_debug::json::pretty(&read).unwrap(), text);
    // The series the figure draws.
    assert_eq!(result.x_labels()[0], "none");
    assert!(result.single_series()[0].is_nan());
    assert_eq!(result.cumulative_series()[0], result.calibrated);

    // A folder that cannot be created: an error, nothing written.
    let file = dir.path().join("a_file");
    std::fs::write(&file, b"x").unwrap();
    let err = write_partial_quantization(&result, &file.join("sub")).unwrap_err();
    assert!(matches!(err, AnalysisError::Write { .. }), "{err}");
    assert!(!err.is_usage());
}

#[test]
fn nothing_below_the_threshold_still_gives_the_calibrated_point() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let result = analyse(
        &engine,
        &SensitivityAnalysisOptions {
            pick_threshold: -1.0,
            ..Default::default()
        },
    );
    assert!(result.nodes.is_empty());
    assert_eq!(result.x_labels(), ["none"]);
    let dir = tempfile::tempdir().unwrap();
    let written = write_partial_quantization(&result, dir.path()).unwrap();
    assert_eq!(written.len(), 2);
    assert!(result.chart().figure.title.contains("no node"));
}

#[test]
fn argument_errors() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let run = |nodes: &[&str]| {
        sensitivity_analysis(
            &engine,
            &SensitivityAnalysisOptions {
                sensitive_nodes: nodes.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            &|_, _, _| {},
        )
        .unwrap_err()
    };
    let conv = model
        .node_name(hmct_ir::quantized_nodes(&model)[0])
        .to_string();
    let typo = format!("{conv}x");
    let err = run(&[&typo]);
    assert!(err.is_usage());
    let msg = err.to_string();
    assert!(
        matches!(err, AnalysisError::Engine(EngineError::UnknownNodes(_))),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("'{typo}'")) && msg.contains(&format!("'{conv}'")),
        "{msg}"
    );

    // A regular node without input calibration nodes.
    let plain = (0..model.nodes().len())
        .find(|&id| !model.is_calibration(id) && !hmct_ir::is_quantized(&model, id))
        .map(|id| model.node_name(id).to_string())
        .unwrap();
    let err = run(&[&conv, &plain]);
    assert!(matches!(err, AnalysisError::NotQuantized(_)), "{err}");
    assert!(err.is_usage());
    assert!(err.to_string().contains(&plain), "{err}");

    let err = "int4".parse::<DequantQType>().unwrap_err();
    assert!(err.is_usage() && err.to_string().contains("int16"), "{err}");
    assert_eq!(
        "INT16".parse::<DequantQType>().unwrap(),
        DequantQType::Int16
    );

    let err = sensitivity_analysis(
        &engine,
        &SensitivityAnalysisOptions {
            data_num: Some(1000),
            ..Default::default()
        },
        &|_, _, _| {},
    )
    .unwrap_err();
    assert!(err.is_usage(), "{err}");
}
