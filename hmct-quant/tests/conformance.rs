//! ONNX's own operator conformance cases (../shared/onnx-node-tests), run through the
//! interpreter. Each case is `model.onnx` + `test_data_set_*/{input,output}_N.pb`.
//!
//! A case is *unsupported* when planning rejects it (an op, attribute value or dtype
//! the interpreter does not implement: reported before anything runs), *pass* when
//! every output matches within the case's tolerances, and *fail* otherwise. The test
//! fails on any failing case (what the interpreter accepts, it must compute right)
//! except the few of [`KNOWN_FAILURES`], which are printed as `KNOWN` with their
//! reason, and on any case of `tests/fixtures/conformance_pass.txt` that does not pass,
//! so a case going from pass to unsupported fails too. Cases that pass and are not on
//! that list are named; `HMCT_UPDATE_PASS_LIST=1` rewrites the list from the run.
//!
//! `HMCT_CASES=substring` restricts the run to matching case names;
//! `HMCT_CONFORMANCE_VERBOSE=1` lists every unsupported case with its reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use hmct_proto::Message;
use hmct_proto::onnx::{ModelProto, TensorProto};
use hmct_quant::plan::normalize_domain;
use hmct_quant::{Config, Plan, PlanError, PlanOptions, Session};
use hmct_tensor::{Tensor, tensor_from_proto};

enum Outcome {
    Pass,
    Unsupported(String),
    Fail(String),
}

struct Tolerance {
    rtol: f64,
    atol: f64,
}

fn run_case(dir: &Path, tol: &Tolerance) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Fail(format!("read model: {e}")),
    };
    let model = match ModelProto::decode(bytes.as_slice()) {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("decode model: {e}")),
    };
    let graph = model.graph.clone().unwrap_or_default();
    let opsets: HashMap<String, i64> = model
        .opset_import
        .iter()
        .map(|o| (normalize_domain(o.domain()).to_string(), o.version()))
        .collect();
    let options = PlanOptions {
        opsets,
        base_dir: Some(dir),
        calibration: None,
    };
    let plan = match Plan::build(&graph, &options) {
        Ok(p) => p,
        Err(e @ PlanError::Node { .. }) | Err(e @ PlanError::Initializer { .. }) => {
            let msg = hmct_ir::error_chain(&e);
            // Invalid attributes in a conformance case are our bug, not a gap.
            if let PlanError::Node {
                source: hmct_quant::ops::OpError::Invalid(_),
                ..
            } = e
            {
                return Outcome::Fail(format!("plan: {msg}"));
            }
            return Outcome::Unsupported(msg);
        }
        Err(e) => return Outcome::Fail(format!("plan: {}", hmct_ir::error_chain(&e))),
    };
    let session = Session::new(plan, 1).expect("thread pool");

    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set"))
                })
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    if sets.is_empty() {
        return Outcome::Unsupported("no test data".into());
    }
    for set in sets {
        let read = |prefix: &str, n: usize| -> Result<Option<Tensor>, String> {
            let p = set.join(format!("{prefix}_{n}.pb"));
            if !p.exists() {
                return Ok(None);
            }
            let b = std::fs::read(&p).map_err(|e| e.to_string())?;
            let tp =
                TensorProto::decode(b.as_slice()).map_err(|e| format!("{}: {e}", p.display()))?;
            if tp.data_type.is_none() && tp.dims.is_empty() {
                // Sequences, maps and optionals decode as empty tensors.
                return Err("non-tensor value".into());
            }
            tensor_from_proto(&tp, None)
                .map(Some)
                .map_err(|e| e.to_string())
        };
        let inputs_info = session.plan().inputs().to_vec();
        let mut inputs = Vec::new();
        for (i, info) in inputs_info.iter().enumerate() {
            match read("input", i) {
                Ok(Some(t)) => inputs.push((info.name.as_str(), t)),
                Ok(None) => return Outcome::Fail(format!("missing input_{i}.pb")),
                Err(e) => return Outcome::Unsupported(format!("input {i}: {e}")),
            }
        }
        let outputs = match session.run(&inputs, &Config::float()) {
            Ok(o) => o,
            // A kernel that meets a dtype or form it does not implement only at run
            // time (types are not inferred at plan time) says so explicitly.
            Err(hmct_quant::RunError::Node {
                source: hmct_quant::ops::OpError::Unsupported(why),
                ..
            }) => return Outcome::Unsupported(format!("at run time: {why}")),
            Err(e) => return Outcome::Fail(format!("run: {}", hmct_ir::error_chain(&e))),
        };
        for (i, got) in outputs.iter().enumerate() {
            let want = match read("output", i) {
                Ok(Some(t)) => t,
                Ok(None) => return Outcome::Fail(format!("missing output_{i}.pb")),
                Err(e) => return Outcome::Unsupported(format!("output {i}: {e}")),
            };
            if let Err(e) = compare(got, &want, tol) {
                return Outcome::Fail(format!("output {i}: {e}"));
            }
        }
    }
    Outcome::Pass
}

fn compare(got: &Tensor, want: &Tensor, tol: &Tolerance) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!(
            "dtype {} != expected {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?} != expected {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if let (Tensor::String(a), Tensor::String(b)) = (got, want) {
        return if a == b {
            Ok(())
        } else {
            Err("strings differ".into())
        };
    }
    let a = got.to_f64_vec().ok_or("not numeric")?;
    let b = want.to_f64_vec().ok_or("not numeric")?;
    let exact = !want.dtype().is_float();
    for (k, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let ok = if exact {
            x == y
        } else if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= tol.atol + tol.rtol * y.abs()
        };
        if !ok {
            return Err(format!("element {k}: got {x}, expected {y}"));
        }
    }
    Ok(())
}

/// Cases that fail for a known reason, each with the reason. Anything else failing
/// fails the test.
const KNOWN_FAILURES: &[(&str, &str)] = &[
    (
        "node/test_attention_3d_causal_bf16_expanded",
        "bf16 intermediates: one bf16 ulp off the reference",
    ),
    (
        "node/test_attention_4d_attn_mask_causal_bf16_expanded",
        "bf16 intermediates: one bf16 ulp off the reference",
    ),
    (
        "node/test_attention_4d_causal_bf16_expanded",
        "bf16 intermediates: one bf16 ulp off the reference",
    ),
    (
        "node/test_attention_4d_causal_fp16_expanded",
        "fp16 intermediates: one fp16 ulp off the reference",
    ),
    (
        "node/test_attention_4d_causal_padded_kv_bf16_expanded",
        "bf16 intermediates: one bf16 ulp off the reference",
    ),
    (
        "node/test_attention_4d_padded_kv_bf16_expanded",
        "bf16 intermediates: one bf16 ulp off the reference",
    ),
];

#[test]
fn onnx_conformance_cases() {
    let Some(root) = hmct_ir::testing::shared_path("onnx-node-tests") else {
        return;
    };
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("summary.json")).expect("summary.json"))
            .expect("json");
    let model_cases: Vec<String> = std::fs::read_to_string(root.join("model_op_cases.txt"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let baseline: HashMap<String, String> =
        serde_json::from_slice(&std::fs::read(root.join("ort_baseline.json")).unwrap_or_default())
            .unwrap_or_default();
    let filter = std::env::var("HMCT_CASES").ok();
    let verbose = std::env::var("HMCT_CONFORMANCE_VERBOSE").is_ok();

    let mut cases: Vec<(String, PathBuf)> = Vec::new();
    for group in ["node", "pytorch-converted", "pytorch-operator", "simple"] {
        let Ok(rd) = std::fs::read_dir(root.join(group)) else {
            continue;
        };
        for e in rd.flatten() {
            if e.path().join("model.onnx").exists() {
                cases.push((
                    format!("{group}/{}", e.file_name().to_string_lossy()),
                    e.path(),
                ));
            }
        }
    }
    cases.sort();

    let mut pass = 0;
    let mut unsupported: BTreeMap<String, String> = BTreeMap::new();
    let mut failed: BTreeMap<String, String> = BTreeMap::new();
    let (mut model_pass, mut model_total, mut model_ort_pass_missed) = (0, 0, Vec::new());
    for (name, dir) in &cases {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let short = name.rsplit('/').next().unwrap_or(name);
        let case = &summary["cases"][short];
        let tol = Tolerance {
            rtol: case["rtol"].as_f64().unwrap_or(1e-3),
            atol: case["atol"].as_f64().unwrap_or(1e-7),
        };
        let outcome = std::panic::catch_unwind(|| run_case(dir, &tol))
            .unwrap_or_else(|_| Outcome::Fail("panicked".into()));
        let is_model_case = name.starts_with("node/") && model_cases.iter().any(|c| c == short);
        if is_model_case {
            model_total += 1;
        }
        match outcome {
            Outcome::Pass => {
                pass += 1;
                if is_model_case {
                    model_pass += 1;
                }
            }
            Outcome::Unsupported(why) => {
                if is_model_case && baseline.get(name).is_some_and(|v| v == "pass") {
                    model_ort_pass_missed.push(name.clone());
                }
                unsupported.insert(name.clone(), why);
            }
            Outcome::Fail(why) => {
                if is_model_case && baseline.get(name).is_some_and(|v| v == "pass") {
                    model_ort_pass_missed.push(name.clone());
                }
                failed.insert(name.clone(), why);
            }
        }
    }
    let total = pass + unsupported.len() + failed.len();
    if verbose {
        for (n, why) in &unsupported {
            eprintln!("UNSUPPORTED {n}: {why}");
        }
    }
    for (n, why) in &failed {
        match KNOWN_FAILURES.iter().find(|(k, _)| k == n) {
            Some((_, reason)) => eprintln!("KNOWN {n}: {reason} ({why})"),
            None => eprintln!("FAIL {n}: {why}"),
        }
    }
    eprintln!(
        "conformance: {pass} pass, {} fail, {} unsupported of {total} cases; model-op cases: {model_pass}/{model_total} pass, {} that onnxruntime passes are not passed here",
        failed.len(),
        unsupported.len(),
        model_ort_pass_missed.len()
    );
    if verbose {
        for n in &model_ort_pass_missed {
            eprintln!("  missed model-op case: {n}");
        }
    }
    let passed: BTreeSet<&str> = cases
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| filter.as_deref().is_none_or(|f| n.contains(f)))
        .filter(|n| !unsupported.contains_key(*n) && !failed.contains_key(*n))
        .collect();
    let list_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance_pass.txt");
    if std::env::var("HMCT_UPDATE_PASS_LIST").is_ok_and(|v| v == "1") {
        assert!(
            filter.is_none(),
            "HMCT_UPDATE_PASS_LIST needs the whole suite (no HMCT_CASES)"
        );
        let text: String = passed.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&list_path, text).expect("write the pass list");
    }
    let listed_text =
        std::fs::read_to_string(&list_path).expect("tests/fixtures/conformance_pass.txt");
    let listed: BTreeSet<&str> = listed_text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|n| filter.as_deref().is_none_or(|f| n.contains(f)))
        .collect();
    let regressed: Vec<&str> = listed.difference(&passed).copied().collect();
    for n in &regressed {
        let why = failed
            .get(*n)
            .or(unsupported.get(*n))
            .map_or("not found", String::as_str);
        eprintln!("REGRESSED {n} (listed as passing): {why}");
    }
    let new_passes = passed.difference(&listed).count();
    if new_passes > 0 {
        eprintln!(
            "{new_passes} case(s) pass that tests/fixtures/conformance_pass.txt does not list; HMCT_UPDATE_PASS_LIST=1 adds them"
        );
    }
    assert!(
        regressed.is_empty(),
        "cases listed in tests/fixtures/conformance_pass.txt no longer pass (listed above): {regressed:?}"
    );
    let unexpected: Vec<&String> = failed
        .keys()
        .filter(|n| !KNOWN_FAILURES.iter().any(|(k, _)| k == n))
        .collect();
    assert!(
        unexpected.is_empty(),
        "conformance cases fail (listed above): {unexpected:?}"
    );
}
