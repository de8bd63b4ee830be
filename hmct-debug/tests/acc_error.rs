//! plot-acc-error on calibrated pnet against the direct computation (its own session,
//! a full forward run per configuration and sample capturing every value, every
//! point compared here), for every mode; the files written; the argument errors.
//! Needs ../shared/models; skips with a note without it.

use std::path::{Path, PathBuf};

use hmct_debug::acc_error::{
    AccError, AccErrorCurves, AccErrorOptions, FigureFile, FigureKind, NodeList, plot_acc_error,
    running_mean, write_acc_error,
};
use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_ir::{Model, TensorType};
use hmct_metrics::Metric;
use hmct_plot::Format;
use hmct_quant::{Capture, Config, Override, Session, Slot, plan_model};
use hmct_tensor::{Dataset, Tensor};

fn pnet() -> Option<(Model, PathBuf)> {
    let model = hmct_ir::testing::calibrated_pnet().unwrap()?;
    let data = hmct_ir::testing::shared_dir()?.join("models/mtcnn_pnet/calibration_data");
    Some((model, data))
}

fn engine(model: &Model, data: &Path) -> Engine {
    Engine::new(model.clone(), data, &EngineOptions::default()).unwrap()
}

fn no_progress(_: usize, _: usize) {}

fn flat(names: &[&str]) -> NodeList {
    NodeList::Flat(names.iter().map(|s| s.to_string()).collect())
}

fn nested(groups: &[&[&str]]) -> NodeList {
    NodeList::Nested(
        groups
            .iter()
            .map(|g| g.iter().map(|s| s.to_string()).collect())
            .collect(),
    )
}

/// The direct computation: full runs from the inputs, every value kept.
struct Reference {
    model: Model,
    session: Session,
    samples: Vec<Vec<(String, Tensor)>>,
}

impl Reference {
    fn new(model: &Model, data: &Path) -> Reference {
        let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
        let specs = session.plan().input_specs();
        let ds = Dataset::open(data, &specs).unwrap();
        let samples = (0..ds.len()).map(|i| ds.sample(i).unwrap()).collect();
        Reference {
            model: model.clone(),
            session,
            samples,
        }
    }

    /// Every output of the quantized regular nodes, graph order.
    fn points(&self) -> Vec<(String, Slot)> {
        let mut points = Vec::new();
        for id in hmct_ir::quantized_nodes(&self.model) {
            for out in &self.model.node(id).output {
                if let Some(slot) = self.session.plan().value(out) {
                    points.push((out.clone(), slot));
                }
            }
        }
        points
    }

    fn run_all(&self, s: usize, config: &Config) -> Vec<Tensor> {
        let refs: Vec<(&str, Tensor)> = self.samples[s]
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = self.session.bind_inputs(&refs).unwrap();
        let slots: Vec<Slot> = self.points().iter().map(|p| p.1).collect();
        let values = self
            .session
            .run_from(&bound, None, config, &slots, Capture::All)
            .unwrap();
        slots
            .iter()
            .map(|&s| (*self.session.value(&values, s).unwrap()).clone())
            .collect()
    }

    /// The metric at every point, averaged over the first `samples` samples.
    fn curve(&self, config: &Config, metric: Metric, samples: usize) -> Vec<f64> {
        let n = self.points().len();
        let mut per_point = vec![Vec::new(); n];
        for s in 0..samples {
            let float = self.run_all(s, &Config::float());
            let probe = self.run_all(s, config);
            for i in 0..n {
                let x = float[i]
                    .as_f32()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect::<Vec<_>>();
                let y = probe[i]
                    .as_f32()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect::<Vec<_>>();
                per_point[i].push(hmct_metrics::compute(metric, &x, &y).unwrap());
            }
        }
        per_point
            .iter()
            .map(|v| hmct_metrics::nan_mean(v))
            .collect()
    }

    fn index(&self, calibration: hmct_ir::NodeId) -> usize {
        let name = self.model.node_name(calibration);
        self.session.plan().calibration(name).unwrap()
    }

    /// Plan indices of a name's calibration nodes.
    fn calibrations(&self, name: &str) -> Vec<usize> {
        let id = self.model.node_id(name).unwrap();
        if self.model.is_calibration(id) {
            vec![self.index(id)]
        } else {
            hmct_ir::input_calibrations(&self.model, id)
                .into_iter()
                .map(|c| self.index(c))
                .collect()
        }
    }

    fn of_type(&self, t: TensorType) -> Vec<usize> {
        self.model
            .calibration_nodes()
            .into_iter()
            .filter(|&c| self.model.calibration(c).unwrap().tensor_type() == t)
            .map(|c| self.index(c))
            .collect()
    }

    fn float_with_on(&self, names: &[&str]) -> Config {
        names
            .iter()
            .flat_map(|n| self.calibrations(n))
            .fold(Config::float(), |c, i| c.with(i, Override::On))
    }

    fn calibrated_with_off(&self, cals: &[usize]) -> Config {
        cals.iter()
            .fold(Config::calibrated(), |c, &i| c.with(i, Override::Off))
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same =
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-12 * w.abs().max(1.0);
        assert!(same, "{what}: point {i}: got {g}, want {w}");
    }
}

fn run(engine: &Engine, options: &AccErrorOptions) -> AccErrorCurves {
    plot_acc_error(engine, options, &no_progress).unwrap()
}

#[test]
fn every_mode_matches_full_runs() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let reference = Reference::new(&model, &data);
    let points = reference.points();
    assert_eq!(points.len(), 5, "pnet has five quantized Convs");

    let a = "conv2d_1";
    let b = "conv2d_3";
    let w = "conv2d_2/kernel:0_HzCalibration";
    let weights = reference.of_type(TensorType::Weight);
    let activations = reference.of_type(TensorType::Feature);
    let calibrated = Config::calibrated();

    // (options, expected figure kinds and per figure the reference configurations)
    type Case = (
        Option<NodeList>,
        Option<NodeList>,
        Vec<(FigureKind, Vec<(String, Config)>)>,
    );
    let cases: Vec<Case> = vec![
        (
            Some(flat(&[a, b, w])),
            None,
            vec![(
                FigureKind::QuantizeNode,
                vec![
                    (a.into(), reference.float_with_on(&[a])),
                    (b.into(), reference.float_with_on(&[b])),
                    (w.into(), reference.float_with_on(&[w])),
                ],
            )],
        ),
        (
            Some(nested(&[&[a], &[a, b]])),
            None,
            vec![(
                FigureKind::QuantizePartial,
                vec![
                    ("partial_qmodel_0".into(), reference.float_with_on(&[a])),
                    ("partial_qmodel_1".into(), reference.float_with_on(&[a, b])),
                    ("calibrated_model".into(), calibrated.clone()),
                ],
            )],
        ),
        (
            Some(flat(&["weight"])),
            None,
            vec![(
                FigureKind::Weight,
                vec![
                    (
                        "weight_quantized".into(),
                        reference.calibrated_with_off(&activations),
                    ),
                    ("calibrated_model".into(), calibrated.clone()),
                ],
            )],
        ),
        (
            Some(flat(&["activation"])),
            None,
            vec![(
                FigureKind::Activation,
                vec![
                    (
                        "activation_quantized".into(),
                        reference.calibrated_with_off(&weights),
                    ),
                    ("calibrated_model".into(), calibrated.clone()),
                ],
            )],
        ),
        (
            Some(flat(&["weight", "activation"])),
            Some(nested(&[&[a], &[a, b]])),
            vec![
                (
                    FigureKind::WeightActivation,
                    vec![
                        (
                            "weight_quantized".into(),
                            reference.calibrated_with_off(&activations),
                        ),
                        (
                            "activation_quantized".into(),
                            reference.calibrated_with_off(&weights),
                        ),
                        ("calibrated_model".into(), calibrated.clone()),
                    ],
                ),
                (
                    FigureKind::NonQuantizePartial,
                    vec![
                        (
                            "partial_qmodel_0".into(),
                            reference.calibrated_with_off(&reference.calibrations(a)),
                        ),
                        (
                            "partial_qmodel_1".into(),
                            reference.calibrated_with_off(
                                &[reference.calibrations(a), reference.calibrations(b)].concat(),
                            ),
                        ),
                        ("calibrated_model".into(), calibrated.clone()),
                    ],
                ),
            ],
        ),
        (
            None,
            Some(flat(&[a, b])),
            vec![(
                FigureKind::NonQuantizeNode,
                vec![
                    (
                        a.into(),
                        reference.calibrated_with_off(&reference.calibrations(a)),
                    ),
                    (
                        b.into(),
                        reference.calibrated_with_off(&reference.calibrations(b)),
                    ),
                ],
            )],
        ),
    ];

    for (metric, data_num) in [
        (Metric::CosineSimilarity, 1),
        (Metric::Mse, 3),
        (Metric::Sqnr, 2),
    ] {
        for (q, nq, want) in &cases {
            let options = AccErrorOptions {
                quantize_node: q.clone(),
                non_quantize_node: nq.clone(),
                metric,
                average_mode: metric == Metric::Mse,
                data_num: (data_num > 1).then_some(data_num),
            };
            let got = run(&engine, &options);
            assert_eq!(got.data_num, data_num);
            assert_eq!(
                got.points
                    .iter()
                    .map(|p| p.tensor.as_str())
                    .collect::<Vec<_>>(),
                points.iter().map(|p| p.0.as_str()).collect::<Vec<_>>()
            );
            assert_eq!(got.figures.len(), want.len());
            for (figure, (kind, curves)) in got.figures.iter().zip(want) {
                assert_eq!(figure.kind, *kind);
                let labels: Vec<&str> = figure.curves.iter().map(|c| c.label.as_str()).collect();
                let want_labels: Vec<&str> = curves.iter().map(|c| c.0.as_str()).collect();
                assert_eq!(labels, want_labels, "{kind:?}");
                for (curve, (label, config)) in figure.curves.iter().zip(curves) {
                    let expected = reference.curve(config, metric, data_num);
                    let what = format!("{kind:?} {label} {metric}");
                    assert_close(&curve.values, &expected, &what);
                    match &curve.averaged {
                        Some(avg) => {
                            assert!(options.average_mode);
                            assert_close(avg, &running_mean(&expected), &what);
                        }
                        None => assert!(!options.average_mode),
                    }
                }
            }
        }
    }
}

#[test]
fn curves_have_the_expected_shape() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    // Quantizing only the third Conv leaves the two before it exact.
    let got = run(
        &engine,
        &AccErrorOptions {
            quantize_node: Some(flat(&["conv2d_2"])),
            ..AccErrorOptions::default()
        },
    );
    let v = &got.figures[0].curves[0].values;
    assert!(v[..2].iter().all(|c| (c - 1.0).abs() < 1e-12), "{v:?}");
    assert!(v[2] < 1.0 && v[2] > 0.9, "{v:?}");
    // The calibrated model is never better than the float model.
    let got = run(
        &engine,
        &AccErrorOptions {
            quantize_node: Some(flat(&["weight"])),
            ..AccErrorOptions::default()
        },
    );
    let calibrated = &got.figures[0].curves[1].values;
    assert!(calibrated.iter().all(|c| *c < 1.0), "{calibrated:?}");
}

#[test]
fn running_mean_as_the_manual_says() {
    let got = running_mean(&[1.0, 0.9, 0.9, 0.8]);
    let want = [1.0, 0.95, 2.8 / 3.0, 0.9];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{got:?}");
    }
    let got = running_mean(&[f64::NAN, 1.0, f64::NAN, 0.0]);
    assert!(got[0].is_nan());
    assert_eq!(&got[1..], &[1.0, 1.0, 0.5]);
}

#[test]
fn files_are_named_by_the_spec_and_hold_the_series() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let dir = tempfile::tempdir().unwrap();
    // (-q, -nq, average mode, file stems)
    type Case<'a> = (Option<NodeList>, Option<NodeList>, bool, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            Some(flat(&["conv2d", "conv2d_1"])),
            None,
            false,
            vec!["quantize_node_accumulate_err_of_node_cosine-similarity"],
        ),
        (
            Some(nested(&[&["conv2d"], &["conv2d", "conv2d_1"]])),
            Some(flat(&["conv2d_2"])),
            true,
            vec![
                "average_quantize_node_accumulate_err_of_partial_qmodel_cosine-similarity",
                "average_non_quantize_node_accumulate_err_of_node_cosine-similarity",
            ],
        ),
        (
            None,
            Some(nested(&[&["conv2d_2"]])),
            false,
            vec!["non_quantize_node_accumulate_err_of_partial_qmodel_cosine-similarity"],
        ),
        (
            Some(flat(&["weight"])),
            None,
            false,
            vec!["weight_quantized_cosine-similarity"],
        ),
        (
            Some(flat(&["activation"])),
            None,
            false,
            vec!["activation_quantized_cosine-similarity"],
        ),
        (
            Some(flat(&["activation", "weight"])),
            None,
            false,
            vec!["weight_activation_quantized_separately_cosine-similarity"],
        ),
    ];
    for (q, nq, average_mode, stems) in cases {
        let result = run(
            &engine,
            &AccErrorOptions {
                quantize_node: q,
                non_quantize_node: nq,
                average_mode,
                ..AccErrorOptions::default()
            },
        );
        let written = write_acc_error(&result, dir.path(), Format::Png).unwrap();
        let want: Vec<PathBuf> = stems
            .iter()
            .flat_map(|s| {
                [
                    dir.path().join(format!("{s}.png")),
                    dir.path().join(format!("{s}.json")),
                ]
            })
            .collect();
        assert_eq!(written, want);
        for (stem, figure) in stems.iter().zip(&result.figures) {
            let img = image::open(dir.path().join(format!("{stem}.png")))
                .unwrap()
                .to_rgb8();
            assert!(
                img.width() >= 640 && img.height() >= 400,
                "{stem}: {:?}",
                img.dimensions()
            );
            let ink = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
            assert!(ink > 5_000, "{stem}: only {ink} non-white pixels");
            // Each curve's colour is on the picture.
            let spec = hmct_debug::acc_error::figure_spec(&result, figure);
            for s in &spec.series {
                let c = s.color.unwrap();
                let n = img.pixels().filter(|p| p.0 == [c.0, c.1, c.2]).count();
                assert!(n > 50, "{stem}: curve '{}' not drawn ({n} pixels)", s.label);
            }
            let json: serde_json::Value = serde_json::from_slice(
                &std::fs::read(dir.path().join(format!("{stem}.json"))).unwrap(),
            )
            .unwrap();
            assert_eq!(json["metric"], "cosine-similarity");
            assert_eq!(json["points"].as_array().unwrap().len(), 5);
            let curves = json["curves"].as_array().unwrap();
            assert_eq!(curves.len(), figure.curves.len());
            for (j, c) in curves.iter().zip(&figure.curves) {
                assert_eq!(j["label"], c.label.as_str());
                let values: Vec<f64> = j["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                // serde_json reads floats to within an ulp.
                assert_close(&values, &c.values, &c.label);
                assert_eq!(j.get("averaged").is_some(), average_mode);
            }
        }
    }
    // Nothing else (no temporary files) is left in the folder.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 14, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".png") || n.ends_with(".json"))
    );
}

#[test]
fn sqnr_infinities_are_strings_in_json() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let result = run(
        &engine,
        &AccErrorOptions {
            quantize_node: Some(flat(&["conv2d_2"])),
            metric: Metric::Sqnr,
            ..AccErrorOptions::default()
        },
    );
    assert_eq!(result.figures[0].curves[0].values[0], f64::INFINITY);
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json["figures"][0]["curves"][0]["values"][0], "inf");
    // The picture leaves the infinite points out but still draws the rest.
    let dir = tempfile::tempdir().unwrap();
    write_acc_error(&result, dir.path(), Format::Png).unwrap();
    assert!(
        dir.path()
            .join("quantize_node_accumulate_err_of_node_sqnr.png")
            .is_file()
    );
    // The report reads the file back with the same type, infinities included.
    let text = std::fs::read(
        dir.path()
            .join("quantize_node_accumulate_err_of_node_sqnr.json"),
    )
    .unwrap();
    let read: FigureFile = serde_json::from_slice(&text).unwrap();
    assert_eq!(read.curves[0].values[0], f64::INFINITY);
    assert_eq!(hmct_debug::json::pretty(&read).unwrap(), text);
}

fn error(engine: &Engine, q: Option<NodeList>, nq: Option<NodeList>) -> AccError {
    plot_acc_error(
        engine,
        &AccErrorOptions {
            quantize_node: q,
            non_quantize_node: nq,
            ..AccErrorOptions::default()
        },
        &no_progress,
    )
    .unwrap_err()
}

#[test]
fn argument_errors() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let e = error(&engine, None, None);
    assert!(matches!(e, AccError::NothingToDo) && e.is_usage(), "{e}");

    let e = error(&engine, None, Some(flat(&["weight"])));
    assert!(
        matches!(e, AccError::SpecialNotAllowed) && e.is_usage(),
        "{e}"
    );
    let e = error(&engine, None, Some(nested(&[&["activation"]])));
    assert!(matches!(e, AccError::SpecialNotAllowed), "{e}");
    let e = error(&engine, Some(flat(&["weight", "conv2d"])), None);
    assert!(matches!(e, AccError::SpecialMixed) && e.is_usage(), "{e}");

    let e = error(&engine, Some(flat(&["conv2d_9", "conv2d"])), None);
    match &e {
        AccError::Engine(EngineError::UnknownNodes(u)) => {
            assert_eq!(u.len(), 1);
            assert_eq!(u[0].name, "conv2d_9");
            assert!(!u[0].suggestions.is_empty());
        }
        other => panic!("{other}"),
    }
    assert!(e.is_usage());
    assert!(e.to_string().contains("did you mean"), "{e}");

    // PRelu reads no calibrated tensor: nothing to switch.
    let e = error(&engine, None, Some(flat(&["p_re_lu"])));
    assert!(
        matches!(e, AccError::NotQuantized { .. }) && e.is_usage(),
        "{e}"
    );
    assert!(e.to_string().contains("'p_re_lu'"), "{e}");

    let e = error(&engine, Some(flat(&[])), None);
    assert!(matches!(e, AccError::EmptyList { .. }), "{e}");
    let e = error(&engine, Some(nested(&[&["conv2d"], &[]])), None);
    assert!(matches!(e, AccError::EmptyGroup { .. }), "{e}");

    let e = plot_acc_error(
        &engine,
        &AccErrorOptions {
            quantize_node: Some(flat(&["conv2d"])),
            data_num: Some(1000),
            ..AccErrorOptions::default()
        },
        &no_progress,
    )
    .unwrap_err();
    assert!(e.is_usage(), "{e}");
}

#[test]
fn unwritable_folder_is_an_error_and_leaves_nothing() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data);
    let result = run(
        &engine,
        &AccErrorOptions {
            quantize_node: Some(flat(&["conv2d"])),
            ..AccErrorOptions::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    // A file where the folder should be.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, b"x").unwrap();
    let e = write_acc_error(&result, &blocked.join("out"), Format::Png).unwrap_err();
    assert!(matches!(e, AccError::CreateDir { .. }), "{e}");
    assert!(!e.is_usage());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
