//! `sensitivity-analysis`, `precision-table` and `outliers` through the built
//! binary: flags, printed tables, the files and JSON written, and the mistakes
//! (exit status, one line, nothing left behind). Needs ../shared/models.

mod common;

use common::{fixture, json, ok};
use std::path::Path;
use std::process::Output;

/// Exit status `code`, a single `error:` line on stderr, returned.
fn fails(out: &Output, code: i32) -> String {
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

#[test]
fn sensitivity_analysis_writes_figure_json_and_prints_the_series() {
    let Some(f) = fixture() else { return };
    let sd = f.path_str("out/sa");
    let js = f.path_str("sa.json");
    let stdout = ok(&f.run(
        "sensitivity-analysis",
        &["-p", "0.9999", "-d", "2", "-sd", &sd, "--json", &js],
    ));
    let png = f.path("out/sa/partial_quantization.png");
    let saved = json(&f.path("out/sa/partial_quantization.json"));
    assert_eq!(saved, json(Path::new(&js)));
    let img = image::open(&png).unwrap().to_rgb8();
    assert!(img.width() >= 640 && img.height() >= 400);
    assert!(
        img.pixels().any(|p| p[0] > 200 && p[1] < 60 && p[2] < 60),
        "no red line"
    );

    assert_eq!(saved["data_num"], 2);
    assert_eq!(saved["pick_threshold"], 0.9999);
    let nodes = saved["nodes"].as_array().unwrap();
    assert!(nodes.len() >= 2);
    // Printed: title, header, rule, `none`, one row per node, then the paths.
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("partial quantization"), "{stdout}");
    assert!(lines[3].starts_with("none"), "{stdout}");
    for (line, node) in lines[4..].iter().zip(nodes) {
        assert!(line.starts_with(node["name"].as_str().unwrap()), "{line}");
    }
    assert!(
        stdout.contains(&format!("wrote {}", png.display())),
        "{stdout}"
    );

    // Given nodes, int16, mse; the long spellings.
    let first = nodes[0]["name"].as_str().unwrap().to_string();
    let list = format!("['{first}']");
    ok(&f.run(
        "sensitivity-analysis",
        &[
            "--sensitive_nodes",
            &list,
            "--save-dir",
            &sd,
            "-q",
            "int16",
            "-m",
            "mse",
        ],
    ));
    let saved = json(&f.path("out/sa/partial_quantization.json"));
    assert_eq!(saved["qtype"], "int16");
    assert_eq!(saved["metric"], "mse");
    assert_eq!(saved["pick_threshold"], serde_json::Value::Null);
    assert_eq!(saved["nodes"][0]["name"], first.as_str());
}

#[test]
fn sensitivity_analysis_mistakes_leave_nothing() {
    let Some(f) = fixture() else { return };
    let model = hmct_ir::load_model(&f.model).unwrap();
    let conv = model
        .node_name(hmct_ir::quantized_nodes(&model)[0])
        .to_string();
    let sd = f.path_str("never");
    let cases: Vec<(Vec<String>, i32, Vec<String>)> = vec![
        // Unknown node: named, with a close match.
        (
            vec!["-sn".into(), format!("[{conv}x]")],
            2,
            vec![format!("'{conv}x'"), format!("'{conv}'")],
        ),
        // A regular node without input calibration nodes.
        (
            vec![
                "--sn".into(),
                format!(
                    "[{}]",
                    (0..model.nodes().len())
                        .find(|&id| !model.is_calibration(id) && !hmct_ir::is_quantized(&model, id))
                        .map(|id| model.node_name(id).to_string())
                        .unwrap()
                ),
            ],
            2,
            vec!["not quantized".into()],
        ),
        (vec!["-q".into(), "int4".into()], 2, vec!["int16".into()]),
        (
            vec!["-m".into(), "cosine".into()],
            2,
            vec!["cosine-similarity".into()],
        ),
        (vec!["-d".into(), "0".into()], 2, vec!["data_num".into()]),
        (vec!["-d".into(), "99".into()], 2, vec!["99".into()]),
    ];
    for (args, code, needles) in cases {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(["--sd", &sd]);
        let err = fails(&f.run("sensitivity-analysis", &all), code);
        for n in needles {
            assert!(err.contains(&n), "{args:?}: {err} lacks {n}");
        }
        assert!(!Path::new(&sd).exists(), "{args:?} left {sd}");
    }
    // A save folder that cannot be created (under a file): exit 1, one line.
    let file = f.path("a_file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("sub");
    let err = fails(
        &f.run(
            "sensitivity-analysis",
            &["--sd", bad.to_str().unwrap(), "--sn", &conv],
        ),
        1,
    );
    assert!(err.contains("a_file"), "{err}");
}

#[test]
fn precision_table_prints_every_quantized_node_and_writes_json() {
    let Some(f) = fixture() else { return };
    let js = f.path_str("pt.json");
    let stdout = ok(&f.run("precision-table", &["-d", "2", "--json", &js]));
    let saved = json(Path::new(&js));
    assert_eq!(saved["data_num"], 2);
    let rows = saved["rows"].as_array().unwrap();
    let model = hmct_ir::load_model(&f.model).unwrap();
    assert_eq!(rows.len(), hmct_ir::quantized_nodes(&model).len());
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[1].contains("cosine(e2e)") && lines[1].contains("amp(mse)"));
    for (line, row) in lines[3..].iter().zip(rows) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[0], row["node"].as_str().unwrap());
        let cos: f64 = cells[2].parse().unwrap();
        assert!((cos - row["end_to_end"]["cosine"].as_f64().unwrap()).abs() < 1e-6);
    }
    assert!(lines[3 + rows.len()].starts_with("amp = "), "{stdout}");
    let err = fails(&f.run("precision-table", &["-d", "50"]), 2);
    assert!(err.contains("50"), "{err}");
}

#[test]
fn outliers_prints_the_ratio_table_and_writes_json() {
    let Some(f) = fixture() else { return };
    let js = f.path_str("out.json");
    let stdout = ok(&f.run(
        "outliers",
        &["-d", "2", "--flag-ratio", "0.2", "--json", &js],
    ));
    let saved = json(Path::new(&js));
    assert_eq!(saved["data_num"], 2);
    assert_eq!(saved["axis"], 1);
    let rows = saved["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[1].contains("sparse channel ratio") && lines[1].contains("level>=6 ratio"));
    for (line, row) in lines[3..].iter().zip(rows) {
        assert!(line.starts_with(row["name"].as_str().unwrap()), "{line}");
        assert_eq!(
            line.trim_end().ends_with('*'),
            row["flagged"].as_bool().unwrap()
        );
    }
    // A negative axis is a value, not a flag; beyond every rank it skips all.
    let stdout = ok(&f.run("outliers", &["-a", "-9"]));
    assert!(stdout.contains("skipped "), "{stdout}");
    fails(&f.run("outliers", &["--flag_ratio", "2"]), 2);
}
