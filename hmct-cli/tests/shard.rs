//! `--shard I/N` and `merge` through the built binary: shards run as separate
//! processes at the same time, merged, give byte for byte the unsharded JSON, `.log`
//! table and printed table; mismatched parts, a missing or duplicated shard are
//! refused with status 2 and nothing written. Needs ../shared/models.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Fixture, fixture, ok};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
}

/// Runs `command MODEL DATA args... --shard i/n --json DIR/part<i>.json` for every
/// shard at once, each with one thread; the part files in shard order.
fn run_shards(f: &Fixture, command: &str, args: &[&str], count: usize, tag: &str) -> Vec<PathBuf> {
    let parts: Vec<PathBuf> = (1..=count)
        .map(|i| f.path(&format!("{tag}-part{i}.json")))
        .collect();
    let children: Vec<_> = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            bin()
                .arg(command)
                .arg(&f.model)
                .arg(&f.data)
                .args(args)
                .args(["--threads", "1", "--shard", &format!("{}/{count}", i + 1)])
                .arg("--json")
                .arg(part)
                .current_dir(f.dir.path())
                .output()
        })
        .collect();
    for child in children {
        ok(&child.unwrap());
    }
    parts
}

fn merge(parts: &[PathBuf], extra: &[&str]) -> Output {
    bin().arg("merge").args(parts).args(extra).output().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn refused(out: &Output, message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(message), "wanted '{message}' in: {stderr}");
}

#[test]
fn sensitivity_shards_merge_into_the_unsharded_result() {
    let Some(f) = fixture() else { return };
    for (node_type, extra, count) in [
        ("node", None, 3),
        ("activation", None, 7),
        (
            "node",
            Some("[['conv2d_1','conv2d_2'],'conv2d_3','conv2d_4',['conv2d_1']]"),
            3,
        ),
    ] {
        let mut args = vec!["-m", "['cosine-similarity','mse']", "-n", node_type];
        if let Some(groups) = extra {
            args.extend(["-i", groups]);
        }
        let tag = format!("{node_type}{count}{}", extra.is_some());
        let whole = f.path(&format!("{tag}-whole.json"));
        let whole_dir = f.path(&format!("{tag}-whole"));
        let mut whole_args = args.clone();
        let (whole_s, whole_d) = (whole.to_str().unwrap(), whole_dir.to_str().unwrap());
        whole_args.extend(["-v", "True", "--json", whole_s, "-s", whole_d]);
        let printed = ok(&f.run("get-sensitivity-of-nodes", &whole_args));

        let parts = run_shards(&f, "get-sensitivity-of-nodes", &args, count, &tag);
        let merged = f.path(&format!("{tag}-merged.json"));
        let merged_dir = f.path(&format!("{tag}-merged"));
        let out = merge(
            &parts,
            &[
                "-v",
                "True",
                "--json",
                merged.to_str().unwrap(),
                "-s",
                merged_dir.to_str().unwrap(),
            ],
        );
        assert_eq!(ok(&out), printed, "{tag}");
        assert_eq!(read(&merged), read(&whole), "{tag}");
        let log = format!("sensitivity_of_{node_type}.log");
        assert_eq!(
            read(&merged_dir.join(&log)),
            read(&whole_dir.join(&log)),
            "{tag}"
        );

        // Every part names its shard and the whole sweep's digests; the entries of
        // the parts are the whole's, each once.
        let whole_json = common::json(&whole);
        let mut indices = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let p = common::json(part);
            assert_eq!(p["shard"]["shard"]["index"], i + 1);
            assert_eq!(p["shard"]["shard"]["count"], count);
            assert_eq!(p["model_digest"], whole_json["model_digest"]);
            assert_eq!(p["data_digest"], whole_json["data_digest"]);
            indices.extend(
                p["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["index"].as_u64().unwrap()),
            );
        }
        indices.sort_unstable();
        let n = whole_json["entries"].as_array().unwrap().len() as u64;
        assert_eq!(indices, (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn the_model_digest_is_the_files_sha256() {
    let Some(f) = fixture() else { return };
    let json = f.path("digest.json");
    ok(&f.run(
        "get-sensitivity-of-nodes",
        &["--json", json.to_str().unwrap()],
    ));
    let Ok(out) = Command::new("sha256sum").arg(&f.model).output() else {
        eprintln!("skipped: no sha256sum");
        return;
    };
    let sum = String::from_utf8(out.stdout).unwrap();
    let want = format!("sha256:{}", sum.split_whitespace().next().unwrap());
    assert_eq!(common::json(&json)["model_digest"], want.as_str());
}

#[test]
fn precision_table_shards_merge_into_the_unsharded_table() {
    let Some(f) = fixture() else { return };
    let whole = f.path("pt-whole.json");
    let printed = ok(&f.run(
        "precision-table",
        &["-d", "2", "--json", whole.to_str().unwrap()],
    ));
    let parts = run_shards(&f, "precision-table", &["-d", "2"], 3, "pt");
    let merged = f.path("pt-merged.json");
    let out = merge(&parts, &["-v", "True", "--json", merged.to_str().unwrap()]);
    assert_eq!(ok(&out), printed);
    assert_eq!(read(&merged), read(&whole));
}

#[test]
fn bad_part_sets_are_refused_and_nothing_is_written() {
    let Some(f) = fixture() else { return };
    let three = run_shards(&f, "get-sensitivity-of-nodes", &[], 3, "three");
    let two = run_shards(&f, "get-sensitivity-of-nodes", &[], 2, "two");
    let mse = run_shards(&f, "get-sensitivity-of-nodes", &["-m", "mse"], 3, "mse");
    let less = run_shards(&f, "get-sensitivity-of-nodes", &["-d", "4"], 3, "less");
    let table = run_shards(&f, "precision-table", &[], 3, "table");
    let out_json = f.path("never.json");
    let out_dir = f.path("never");
    let outputs = [
        "--json",
        out_json.to_str().unwrap(),
        "-s",
        out_dir.to_str().unwrap(),
        "-v",
        "True",
    ];
    let p = |v: &[PathBuf], i: usize| v[i].clone();
    let cases: Vec<(Vec<PathBuf>, &str)> = vec![
        (vec![p(&three, 0), p(&three, 2)], "missing shard(s) 2 of 3"),
        (
            vec![p(&three, 0), p(&three, 1), p(&three, 1), p(&three, 2)],
            "shard 2/3 is given twice",
        ),
        (vec![p(&three, 0), p(&two, 1)], "different shard counts"),
        (
            vec![p(&three, 0), p(&mse, 1), p(&three, 2)],
            "come from different options",
        ),
        (
            vec![p(&three, 0), p(&less, 1), p(&three, 2)],
            "come from different data",
        ),
        (
            vec![p(&three, 0), p(&table, 1), p(&three, 2)],
            "parts of different commands",
        ),
        (vec![f.path("nowhere.json")], "cannot read"),
    ];
    for (parts, message) in cases {
        let out = merge(&parts, &outputs);
        refused(&out, message);
        assert!(out.stdout.is_empty());
        assert!(!out_json.exists() && !out_dir.exists(), "{message}");
    }
    // A part of another model: the same sweep on a copy with one threshold changed.
    let other = f.path("other.onnx");
    let model = hmct_ir::load_model(&f.model).unwrap();
    let name = model.node_name(model.calibration_nodes()[0]).to_string();
    ok(&bin()
        .arg("modify")
        .arg(&f.model)
        .arg("-o")
        .arg(&other)
        .args(["--threshold", &format!("{name}=3.0")])
        .output()
        .unwrap());
    let part = f.path("other-part2.json");
    ok(&bin()
        .arg("get-sensitivity-of-nodes")
        .arg(&other)
        .arg(&f.data)
        .args(["--shard", "2/3", "--json", part.to_str().unwrap()])
        .output()
        .unwrap());
    refused(
        &merge(&[p(&three, 0), part, p(&three, 2)], &outputs),
        "come from different models",
    );
    assert!(!out_json.exists() && !out_dir.exists());
}

#[test]
fn shard_arguments_are_checked() {
    let Some(f) = fixture() else { return };
    let json = f.path("x.json");
    let j = json.to_str().unwrap();
    for (args, message) in [
        (vec!["--shard", "0/3", "--json", j], "is not I/N"),
        (vec!["--shard", "4/3", "--json", j], "is not I/N"),
        (vec!["--shard", "1/3"], "give it with --json"),
        (
            vec!["--shard", "1/3", "--json", j, "-s", "d"],
            "pass it to `merge`",
        ),
        (
            vec!["--exclude-samples", "9"],
            "sample 9 is not among the 8",
        ),
        (vec!["--exclude-samples", "a"], "'a' is not a sample number"),
    ] {
        refused(&f.run("get-sensitivity-of-nodes", &args), message);
        assert!(!json.exists());
    }
    // A whole result is not a part.
    ok(&f.run("get-sensitivity-of-nodes", &["--json", j]));
    refused(
        &merge(std::slice::from_ref(&json), &[]),
        "not a shard's part",
    );
}
