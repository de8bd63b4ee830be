//! A calibration node is an HzCalibration node in the `horizon` domain or in none
//! (hmct_ir::is_calibration_node, the one definition): the bundled calibrated model
//! with every HzCalibration node's domain cleared and the `horizon` opset import
//! dropped, as a user's file may come, is listed by `summary`, runs, and ranks in
//! `get-sensitivity-of-nodes` exactly as the original does. Another domain's
//! HzCalibration is a different op and is refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hmct_proto::Message;
use hmct_proto::onnx::ModelProto;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn debugger(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&Path]) -> String {
    let out = debugger(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The bundled calibrated model with its calibration nodes' domain set to `domain`
/// (and no `horizon` opset import unless it is `horizon`), written byte for byte.
fn with_domain(dir: &Path, domain: Option<&str>) -> PathBuf {
    let original = repo().join("examples/tiny_cnn/calibrated_model.onnx");
    let mut proto = ModelProto::decode(&*std::fs::read(original).unwrap()).unwrap();
    let graph = proto.graph.as_mut().unwrap();
    let mut changed = 0;
    for node in &mut graph.node {
        if node.op_type() == "HzCalibration" {
            node.domain = domain.map(Into::into);
            changed += 1;
        }
    }
    assert!(changed > 10, "the example has calibration nodes");
    proto.opset_import.retain(|o| o.domain() != "horizon");
    if let Some(d) = domain.filter(|d| !d.is_empty()) {
        proto
            .opset_import
            .push(hmct_proto::onnx::OperatorSetIdProto {
                domain: Some(d.into()),
                version: Some(1),
            });
    }
    let path = dir.join(format!("{}.onnx", domain.unwrap_or("none")));
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    path
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.push((path.strip_prefix(dir).unwrap().to_path_buf(), bytes));
        }
    }
    out.sort();
    out
}

#[test]
fn domain_less_calibration_nodes_work_like_horizon_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = repo().join("examples/tiny_cnn/calibration_data");
    let horizon = with_domain(dir.path(), Some("horizon"));
    // Both spellings of "no domain": the field absent, and present but empty.
    let variants = [
        with_domain(dir.path(), None),
        with_domain(dir.path(), Some("")),
    ];
    let summary = |model: &Path| {
        let json = dir.path().join("summary.json");
        ok(&[Path::new("summary"), model, Path::new("--json"), &json]);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        // The file name and the opset imports differ on purpose.
        v.as_object_mut().unwrap().remove("file");
        v.as_object_mut().unwrap().remove("opsets");
        v
    };
    let run = |model: &Path, tag: &str| {
        let out = dir.path().join(format!("run_{tag}"));
        ok(&[
            Path::new("run"),
            model,
            &data,
            Path::new("--calibrated"),
            Path::new("-o"),
            &out,
        ]);
        files(&out)
    };
    let sensitivity = |model: &Path, tag: &str| {
        let json = dir.path().join(format!("sens_{tag}.json"));
        let folder = dir.path().join(format!("sens_{tag}"));
        ok(&[
            Path::new("get-sensitivity-of-nodes"),
            model,
            &data,
            Path::new("-s"),
            &folder,
            Path::new("--json"),
            &json,
        ]);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        // The digest of the model file differs with the file, as it should.
        let digest = v.as_object_mut().unwrap().remove("model_digest");
        assert!(digest.is_some_and(|d| d.as_str().unwrap().starts_with("sha256:")));
        v
    };
    let (want_summary, want_run, want_sens) = (
        summary(&horizon),
        run(&horizon, "horizon"),
        sensitivity(&horizon, "horizon"),
    );
    assert_eq!(
        want_summary["calibration_nodes"].as_array().unwrap().len(),
        17
    );
    for (i, model) in variants.iter().enumerate() {
        assert_eq!(summary(model), want_summary, "{}", model.display());
        let got = run(model, &i.to_string());
        assert!(!got.is_empty());
        assert!(got == want_run, "{}: outputs differ", model.display());
        assert_eq!(
            sensitivity(model, &i.to_string()),
            want_sens,
            "{}",
            model.display()
        );
    }

    // An HzCalibration of some other domain is not ours: refused, with the domain named.
    let other = with_domain(dir.path(), Some("com.example"));
    let out = debugger(&[Path::new("run"), &other, &data]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("com.example"), "{err}");
}
