//! The node-case runner shared by ops_node_cases.rs and kernels_node_cases.rs: ONNX
//! conformance cases (../shared/onnx-node-tests) made only of a given list of ops, run
//! straight through `ops::build_kernel` without the planner; the graph's nodes run in
//! file order (ONNX graphs are topologically sorted).
//!
//! A case is *unsupported* when a kernel refuses to build (or an input cannot be
//! read), *pass* when every output matches within the case's tolerances (integers and
//! bools exactly), *fail* otherwise. [`check`] fails on any failing case, and on any
//! case of `model_op_cases.txt` that onnxruntime passes but that is not a pass here.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use hmct_proto::Message;
use hmct_proto::onnx::{ModelProto, TensorProto};
use hmct_quant::ops::{Attrs, NodeSpec, OpError, build_kernel};
use hmct_tensor::{Tensor, tensor_from_proto};

enum Outcome {
    Pass,
    Unsupported(String),
    Fail(String),
}

fn read_tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let proto = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    tensor_from_proto(&proto, None).map_err(|e| e.to_string())
}

fn close(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("type {} != expected {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?} != expected {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if let (Tensor::String(g), Tensor::String(w)) = (got, want) {
        return if g == w {
            Ok(())
        } else {
            Err("strings differ".into())
        };
    }
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    // Integers and bools must match exactly; floats within tolerance.
    let exact = !want.dtype().is_float();
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan())
            || a == b
            || (!exact && (a - b).abs() <= atol + rtol * b.abs());
        if !ok {
            return Err(format!("element {i}: {a} != expected {b}"));
        }
    }
    Ok(())
}

fn run_case(dir: &Path, rtol: f64, atol: f64) -> Outcome {
    let model = match std::fs::read(dir.join("model.onnx"))
        .map_err(|e| e.to_string())
        .and_then(|b| ModelProto::decode(b.as_slice()).map_err(|e| e.to_string()))
    {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("load: {e}")),
    };
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
        .map(|o| o.version())
        .unwrap_or(1);
    let graph = model.graph.unwrap_or_default();
    // Sequences, maps and optionals are not tensors; the interpreter has no such values.
    let non_tensor = graph.input.iter().chain(&graph.output).find(|v| {
        !matches!(
            v.r#type.as_ref().and_then(|t| t.value.as_ref()),
            Some(hmct_proto::onnx::type_proto::Value::TensorType(_))
        )
    });
    if let Some(v) = non_tensor {
        return Outcome::Unsupported(format!("'{}' is not a tensor", v.name()));
    }
    let mut values: HashMap<String, Tensor> = HashMap::new();
    for init in &graph.initializer {
        match tensor_from_proto(init, None) {
            Ok(t) => values.insert(init.name().to_string(), t),
            Err(e) => return Outcome::Unsupported(format!("initializer: {e}")),
        };
    }
    let data_dir = dir.join("test_data_set_0");
    let feeds: Vec<_> = graph
        .input
        .iter()
        .filter(|i| !values.contains_key(i.name()))
        .collect();
    for (k, inp) in feeds.iter().enumerate() {
        match read_tensor(&data_dir.join(format!("input_{k}.pb"))) {
            Ok(t) => values.insert(inp.name().to_string(), t),
            Err(e) => return Outcome::Unsupported(format!("input {k}: {e}")),
        };
    }
    for node in &graph.node {
        let domain = match node.domain() {
            "ai.onnx" => "",
            d => d,
        };
        let present: Vec<bool> = node.input.iter().map(|n| !n.is_empty()).collect();
        let consts: Vec<Option<&Tensor>> = node
            .input
            .iter()
            .map(|n| {
                graph
                    .initializer
                    .iter()
                    .any(|i| i.name() == n)
                    .then(|| &values[n])
            })
            .collect();
        let spec = NodeSpec {
            name: node.name(),
            op_type: node.op_type(),
            domain,
            opset,
            attrs: Attrs::new(&node.attribute),
            num_inputs: node.input.len(),
            inputs_present: &present,
            num_outputs: node.output.len(),
            const_inputs: &consts,
            stable_inputs: &consts.iter().map(Option::is_some).collect::<Vec<_>>(),
        };
        let kernel = match build_kernel(&spec) {
            Ok(k) => k,
            Err(OpError::Unsupported(m)) => {
                return Outcome::Unsupported(format!("{}: {m}", node.op_type()));
            }
            Err(e) => return Outcome::Fail(format!("{} build: {e}", node.op_type())),
        };
        let mut args = Vec::new();
        for n in &node.input {
            if n.is_empty() {
                args.push(None);
            } else {
                match values.get(n) {
                    Some(t) => args.push(Some(t)),
                    None => {
                        return Outcome::Fail(format!(
                            "{}: input {n} never produced",
                            node.op_type()
                        ));
                    }
                }
            }
        }
        let outs = match kernel.run(&args) {
            Ok(o) => o,
            Err(OpError::Unsupported(m)) => {
                return Outcome::Unsupported(format!("{}: {m}", node.op_type()));
            }
            Err(e) => return Outcome::Fail(format!("{} run: {e}", node.op_type())),
        };
        for (name, t) in node.output.iter().zip(outs) {
            let layout_ok = hmct_tensor::map_tensor!(&t, a => a.is_standard_layout());
            if !layout_ok {
                return Outcome::Fail(format!("{}: output not in standard layout", node.op_type()));
            }
            if !name.is_empty() {
                values.insert(name.clone(), t);
            }
        }
    }
    for (k, out) in graph.output.iter().enumerate() {
        let want = match read_tensor(&data_dir.join(format!("output_{k}.pb"))) {
            Ok(t) => t,
            Err(e) => return Outcome::Unsupported(format!("output {k}: {e}")),
        };
        let Some(got) = values.get(out.name()) else {
            return Outcome::Fail(format!("output {} not produced", out.name()));
        };
        if let Err(e) = close(got, &want, rtol, atol) {
            return Outcome::Fail(format!("output {k}: {e}"));
        }
    }
    Outcome::Pass
}

fn ops_of(dir: &Path) -> Option<Vec<String>> {
    let b = std::fs::read(dir.join("model.onnx")).ok()?;
    let m = ModelProto::decode(b.as_slice()).ok()?;
    Some(
        m.graph?
            .node
            .iter()
            .map(|n| n.op_type().to_string())
            .collect(),
    )
}

/// Runs every case made only of `ops` (space-separated op types). `HMCT_CASES=substring`
/// restricts the run; the environment variable `verbose_var` set lists unsupported
/// cases with their reasons. Skips (with a message) when the suite is absent.
pub fn check(ops: &str, verbose_var: &str) {
    let Some(root) = hmct_ir::testing::shared_path("onnx-node-tests") else {
        return;
    };
    let ours: HashSet<&str> = ops.split_whitespace().collect();
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("summary.json")).unwrap()).unwrap();
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("ort_baseline.json")).unwrap()).unwrap();
    let must: HashSet<String> = std::fs::read_to_string(root.join("model_op_cases.txt"))
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    let filter = std::env::var("HMCT_CASES").ok();
    let verbose = std::env::var(verbose_var).is_ok();

    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for suite in ["node", "pytorch-converted", "pytorch-operator", "simple"] {
        let Ok(rd) = std::fs::read_dir(root.join(suite)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            dirs.push((format!("{suite}/{name}"), e.path()));
        }
    }
    dirs.sort();

    let (mut pass, mut unsup, mut fail) = (0, Vec::new(), Vec::new());
    let mut must_missed = Vec::new();
    for (key, dir) in dirs {
        if filter.as_deref().is_some_and(|f| !key.contains(f)) {
            continue;
        }
        let Some(ops) = ops_of(&dir) else { continue };
        if ops.is_empty() || !ops.iter().all(|o| ours.contains(o.as_str())) {
            continue;
        }
        let case = key.rsplit('/').next().unwrap().to_string();
        let info = &summary["cases"][&case];
        let rtol = info["rtol"].as_f64().unwrap_or(1e-3);
        let atol = info["atol"].as_f64().unwrap_or(1e-7);
        let outcome = run_case(&dir, rtol, atol);
        let ort_pass = baseline[&key].as_str() == Some("pass");
        let required = key.starts_with("node/") && must.contains(&case) && ort_pass;
        match outcome {
            Outcome::Pass => pass += 1,
            Outcome::Unsupported(m) => {
                if required && !m.contains("is not a tensor") {
                    must_missed.push(format!("{key}: unsupported: {m}"));
                }
                unsup.push(format!("{key}: {m}"));
            }
            Outcome::Fail(m) => fail.push(format!("{key}: {m}")),
        }
    }
    if verbose {
        for u in &unsup {
            eprintln!("unsupported {u}");
        }
    }
    for f in &fail {
        eprintln!("FAIL {f}");
    }
    for m in &must_missed {
        eprintln!("REQUIRED {m}");
    }
    eprintln!(
        "{pass} pass, {} fail, {} unsupported",
        fail.len(),
        unsup.len()
    );
    assert!(fail.is_empty(), "{} cases fail", fail.len());
    assert!(
        must_missed.is_empty(),
        "{} required cases not supported",
        must_missed.len()
    );
}
