//! `cargo xtask zoo`: rebuilds the benchmark zoo in `target/zoo/` from package
//! registries: standard architectures (torchvision's, and a YOLO-style C2f detector
//! and a BERT-base encoder written in `tools/zoo/make_zoo.py`) with random seeded
//! weights, 8 calibration samples each, calibrated with our own `calibrate`:
//!
//! ```text
//! target/zoo/<name>/model.onnx
//! target/zoo/<name>/calibrated_model.onnx
//! target/zoo/<name>/calibration_data/<input>/<i>.npy
//! target/zoo/zoo.json      what make_zoo.py exported (or why it could not)
//! target/zoo/status.json   per model: calibrated, or the error that stopped it
//! ```
//!
//! Nothing of it is committed; the versions are pinned in `tools/zoo/requirements.txt`
//! (a venv in `target/zoo-venv`). A model our interpreter cannot run is kept in the
//! status with the error (the unsupported op), not dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only these models (names as `python tools/zoo/make_zoo.py OUT --list` prints).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Export and calibrate again models that are already there.
    #[arg(long)]
    force: bool,
}

pub fn dir(root: &Path) -> PathBuf {
    root.join("target/zoo")
}

/// One model of the zoo, or why it is not usable.
pub struct Entry {
    pub name: String,
    pub dir: PathBuf,
    /// `Err(reason)` when it failed to export or to calibrate.
    pub state: std::result::Result<(), String>,
}

impl Entry {
    pub fn model(&self) -> PathBuf {
        self.dir.join("model.onnx")
    }
    pub fn calibrated(&self) -> PathBuf {
        self.dir.join("calibrated_model.onnx")
    }
    pub fn data(&self) -> PathBuf {
        self.dir.join("calibration_data")
    }
}

fn read_json(path: &Path) -> Result<BTreeMap<String, Value>> {
    if !path.exists() {
        return Ok(BTreeMap::new());
    }
    serde_json::from_slice(&std::fs::read(path)?)
        .with_context(|| format!("reading {}", path.display()))
}

fn write_json(path: &Path, v: &BTreeMap<String, Value>) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(v)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The zoo as built by `cargo xtask zoo`, in make_zoo.py's order.
pub fn entries(root: &Path) -> Result<Vec<Entry>> {
    let zoo = dir(root);
    let exported = read_json(&zoo.join("zoo.json"))?;
    if exported.is_empty() {
        bail!("no zoo in {}: run `cargo xtask zoo` first", zoo.display());
    }
    let status = read_json(&zoo.join("status.json"))?;
    let order = model_names(root)?;
    let mut out = Vec::new();
    for name in order.iter().filter(|n| exported.contains_key(*n)) {
        let state = if let Some(e) = exported[name]["export_error"].as_str() {
            Err(format!("export: {e}"))
        } else if let Some(e) = status.get(name).and_then(|s| s["error"].as_str()) {
            Err(e.to_string())
        } else if status.get(name).is_none() {
            Err("not calibrated yet (cargo xtask zoo)".into())
        } else {
            Ok(())
        };
        out.push(Entry {
            name: name.clone(),
            dir: zoo.join(name),
            state,
        });
    }
    Ok(out)
}

fn python(root: &Path) -> Result<PathBuf> {
    let req = root.join("tools/zoo/requirements.txt");
    let text =
        std::fs::read_to_string(&req).with_context(|| format!("reading {}", req.display()))?;
    crate::bench_ort::venv(
        root,
        "zoo-venv",
        &text,
        &["-r".into(), req.display().to_string()],
    )
}

/// Every model name of the zoo, in make_zoo.py's order.
fn model_names(root: &Path) -> Result<Vec<String>> {
    // Read from the script itself so the order and names have one source; the venv
    // is only needed to import it.
    let out = Command::new(python(root)?)
        .arg(root.join("tools/zoo/make_zoo.py"))
        .args(["-", "--list"])
        .output()
        .context("running make_zoo.py --list")?;
    if !out.status.success() {
        bail!(
            "make_zoo.py --list failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Whether `a` exists and was written after `b` (a calibration of the current export).
fn newer(a: &Path, b: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((modified(a), modified(b)), (Some(x), Some(y)) if x >= y)
}

/// The last line of a failed command's stderr that says what went wrong.
fn error_line(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("error"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("no message")
        .trim()
        .to_string()
}

pub fn run(root: &Path, args: &Args) -> Result<()> {
    let zoo = dir(root);
    std::fs::create_dir_all(&zoo)?;
    let python = python(root)?;
    let names = model_names(root)?;
    if let Some(bad) = args.only.iter().find(|n| !names.contains(n)) {
        bail!("--only: no model '{bad}' in the zoo ({})", names.join(", "));
    }
    let wanted: Vec<&String> = names
        .iter()
        .filter(|n| args.only.is_empty() || args.only.contains(n))
        .collect();

    let to_export: Vec<&str> = wanted
        .iter()
        .filter(|n| args.force || !zoo.join(n.as_str()).join("model.onnx").exists())
        .map(|n| n.as_str())
        .collect();
    if !to_export.is_empty() {
        eprintln!(
            "exporting {} model(s) with tools/zoo/make_zoo.py",
            to_export.len()
        );
        let ok = Command::new(&python)
            .arg(root.join("tools/zoo/make_zoo.py"))
            .arg(&zoo)
            .arg("--only")
            .arg(to_export.join(","))
            .status()?
            .success();
        if !ok {
            bail!("tools/zoo/make_zoo.py failed");
        }
    }

    let cli = crate::release_cli(root)?;
    let exported = read_json(&zoo.join("zoo.json"))?;
    let status_path = zoo.join("status.json");
    let mut status = read_json(&status_path)?;
    for name in &wanted {
        let d = zoo.join(name.as_str());
        let cal = d.join("calibrated_model.onnx");
        if exported
            .get(name.as_str())
            .is_none_or(|e| e.get("export_error").is_some())
        {
            status.remove(name.as_str());
            continue;
        }
        if !args.force && newer(&cal, &d.join("model.onnx")) {
            status.insert(name.to_string(), json!({ "calibrated": true }));
            continue;
        }
        eprintln!("calibrating {name}");
        let out = Command::new(&cli)
            .arg("calibrate")
            .arg(d.join("model.onnx"))
            .arg(d.join("calibration_data"))
            .arg("-o")
            .arg(&cal)
            .output()
            .context("running hmct-debugger calibrate")?;
        let entry = if out.status.success() {
            json!({ "calibrated": true })
        } else {
            json!({ "error": error_line(&String::from_utf8_lossy(&out.stderr)) })
        };
        status.insert(name.to_string(), entry);
        write_json(&status_path, &status)?;
    }
    write_json(&status_path, &status)?;

    println!("{:<28} {:<8} {:<8} result", "model", "opset", "layout");
    let mut failed = 0;
    for e in entries(root)?.iter().filter(|e| wanted.contains(&&e.name)) {
        let info = &exported[&e.name];
        let opset = info["opset"]
            .as_i64()
            .map(|o| o.to_string())
            .unwrap_or_default();
        let layout = info["layout"].as_str().unwrap_or("");
        let result = match &e.state {
            Ok(()) => format!("ok {}", e.calibrated().display()),
            Err(why) => {
                failed += 1;
                format!("FAILED: {why}")
            }
        };
        println!("{:<28} {opset:<8} {layout:<8} {result}", e.name);
    }
    if failed > 0 {
        println!(
            "{failed} model(s) of the zoo cannot be run; the benchmarks skip them and say why"
        );
    }
    Ok(())
}
