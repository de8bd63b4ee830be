//! `hmct-debugger get-sensitivity-of-nodes` through the built binary: the seeds'
//! flags, the table per node type, the .log and JSON files, and the argument
//! mistakes (exit status 2, one line, nothing written). Needs ../shared/models.

mod common;

use common::{Fixture, fixture, json, ok};
use std::ffi::OsStr;
use std::process::{Command, Output};

fn bin(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

/// `get-sensitivity-of-nodes MODEL DATA args...`
fn sensitivity(f: &Fixture, args: &[&str]) -> Output {
    f.run("get-sensitivity-of-nodes", args)
}

fn collapsed(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The table of each node type: title, header, rule, one row per JSON entry in the
/// JSON's order with the JSON's values at 5 decimals.
#[test]
fn verbose_table_per_node_type_matches_the_json() {
    let Some(f) = fixture() else { return };
    for (node_type, header, keys) in [
        ("node", "node cosine-similarity mse", 1),
        ("weight", "weight node cosine-similarity mse", 2),
        (
            "activation",
            "activation node threshold bit cosine-similarity mse",
            4,
        ),
    ] {
        let json_path = f.path(&format!("{node_type}.json"));
        let stdout = ok(&sensitivity(
            &f,
            &[
                "-m",
                "['cosine-similarity','mse']",
                "-n",
                node_type,
                "-v",
                "True",
                "--json",
                json_path.to_str().unwrap(),
            ],
        ));
        let lines: Vec<&str> = stdout.lines().collect();
        let width = lines[2].chars().count();
        assert_eq!(lines[2], "-".repeat(width), "{stdout}");
        assert_eq!(lines[0].chars().count(), width);
        assert!(lines[0].contains("=node sensitivity="), "{stdout}");
        assert_eq!(collapsed(lines[1]), header);

        let result = json(&json_path);
        assert_eq!(result["node_type"], node_type);
        let entries = result["entries"].as_array().unwrap();
        assert!(!entries.is_empty());
        assert_eq!(lines.len(), 3 + entries.len(), "{stdout}");
        for (line, e) in lines[3..].iter().zip(entries) {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells.len(), keys + 2, "{line}");
            assert_eq!(cells[0], e["name"].as_str().unwrap());
            let cos = e["values"]["cosine-similarity"].as_f64().unwrap();
            let mse = e["values"]["mse"].as_f64().unwrap();
            assert_eq!(cells[keys], hmct_metrics::format_value(cos), "{line}");
            assert_eq!(cells[keys + 1], hmct_metrics::format_value(mse), "{line}");
            match node_type {
                "weight" => assert_eq!(cells[1], e["node"].as_str().unwrap()),
                "activation" => {
                    assert_eq!(cells[1], e["node"].as_str().unwrap());
                    assert_eq!(cells[2], "4.0");
                    assert_eq!(cells[3], "8");
                    assert_eq!(e["threshold"], 4.0);
                    assert_eq!(e["bit"], 8);
                }
                _ => assert!(e.get("node").is_none()),
            }
        }
        // Worst first by cosine.
        let cos: Vec<f64> = entries
            .iter()
            .map(|e| e["values"]["cosine-similarity"].as_f64().unwrap())
            .collect();
        assert!(cos.windows(2).all(|w| w[0] <= w[1]), "{cos:?}");
    }
}

#[test]
fn save_dir_log_and_quiet_run() {
    let Some(f) = fixture() else { return };
    let save = f.path("debug_result/nested");
    // Not verbose: nothing on stdout, the table in the log.
    let out = sensitivity(
        &f,
        &["-n", "weight", "-s", save.to_str().unwrap(), "-d", "2"],
    );
    assert_eq!(ok(&out), "");
    let log = std::fs::read_to_string(save.join("sensitivity_of_weight.log")).unwrap();
    assert!(log.lines().nth(1).unwrap().starts_with("weight"), "{log}");
    // Verbose prints exactly what the log holds; long flag spellings with '_' and '-'.
    for flags in [
        [
            "--node_type",
            "activation",
            "--save_dir",
            "--data_num",
            "--verbose",
        ],
        [
            "--node-type",
            "activation",
            "--save-dir",
            "--data-num",
            "--verbose",
        ],
    ] {
        let out = sensitivity(
            &f,
            &[
                flags[0],
                flags[1],
                flags[2],
                save.to_str().unwrap(),
                flags[3],
                "2",
                flags[4],
            ],
        );
        let stdout = ok(&out);
        let log = std::fs::read_to_string(save.join("sensitivity_of_activation.log")).unwrap();
        assert_eq!(stdout, log);
        assert!(log.lines().nth(1).unwrap().starts_with("activation"));
    }
    // Nothing else was written there.
    let mut files: Vec<String> = std::fs::read_dir(&save)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["sensitivity_of_activation.log", "sensitivity_of_weight.log"]
    );
    // -v False is quiet too.
    assert_eq!(ok(&sensitivity(&f, &["-d", "1", "-v", "False"])), "");
}

#[test]
fn interested_nodes_output_node_and_threads() {
    let Some(f) = fixture() else { return };
    // The same analysis, then a setting that must not change its bytes.
    let run = |setting: &[&str], path: &std::path::Path| {
        let mut args = vec![
            "-i",
            "[conv2d_1,['conv2d','conv2d_2']]",
            "-o",
            "[conv2d_3,conv2d_4]",
            "-m",
            "mse",
            "--json",
            path.to_str().unwrap(),
        ];
        args.extend_from_slice(setting);
        ok(&sensitivity(&f, &args));
        std::fs::read(path).unwrap()
    };
    let one = f.path("one.json");
    let a = run(&["--threads", "1"], &one);
    let b = run(&["--threads", "2"], &f.path("two.json"));
    assert_eq!(a, b, "1 vs 2 threads");
    let result = json(&one);
    let mut names: Vec<&str> = result["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["conv2d+conv2d_2", "conv2d_1"]);
    assert_eq!(result["compared"].as_array().unwrap().len(), 2);
    assert_eq!(result["metrics"], serde_json::json!(["mse"]));
    // A small cache changes nothing either.
    assert_eq!(run(&["--cache-mb", "0"], &f.path("small.json")), a);
}

/// Each mistake: exit status 2, one line on stderr naming the problem, nothing on
/// stdout, and neither the save folder nor the JSON file created.
#[test]
fn argument_mistakes_exit_2_with_one_line_and_write_nothing() {
    let Some(f) = fixture() else { return };
    let raw = f.path("raw.onnx");
    let shared = hmct_ir::testing::shared_dir().unwrap();
    std::fs::copy(shared.join("models/mtcnn_pnet/pnet.onnx"), &raw).unwrap();
    let save = f.path("never");
    let json_path = f.path("never.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-o", "conv2d_22"],
            "unknown node 'conv2d_22' (did you mean 'conv2d_2'",
        ),
        (
            vec!["-i", "[conv2d,[conv2d_1,conv_2x]]"],
            "unknown node 'conv_2x'",
        ),
        (
            vec!["-o", "softmax"],
            "'softmax' has no input calibration nodes",
        ),
        (
            vec!["-m", "['cosine-similarity','mse2']"],
            "unknown metric 'mse2' (did you mean 'mse'",
        ),
        (
            vec!["-d", "9"],
            "data_num is 9 but the data has 8 sample(s)",
        ),
        (vec!["-d", "0"], "data_num must be at least 1"),
        (vec!["-n", "activations"], "unknown node type 'activations'"),
        (vec!["-v", "maybe"], "invalid boolean"),
        (vec!["-i", "[conv2d"], "invalid list argument"),
        (vec!["--raw-model"], "no calibration (HzCalibration) nodes"),
    ];
    for (args, want) in cases {
        let mut full: Vec<&str> = Vec::new();
        let raw_model = args == ["--raw-model"];
        if !raw_model {
            full.extend(&args);
        }
        full.extend([
            "-s",
            save.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ]);
        let out = if raw_model {
            let mut all: Vec<&OsStr> = vec![
                "get-sensitivity-of-nodes".as_ref(),
                raw.as_os_str(),
                f.data.as_os_str(),
            ];
            all.extend(full.iter().map(|a| OsStr::new(*a)));
            bin(&all)
        } else {
            sensitivity(&f, &full)
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!save.exists(), "{args:?} created the save folder");
        assert!(!json_path.exists(), "{args:?} wrote the JSON");
    }
}
