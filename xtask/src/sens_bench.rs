//! `cargo xtask sensitivity-bench [MODEL [DATA]] [-d 8] [--threads 2]`: times
//! `hmct-debugger get-sensitivity-of-nodes` against the onnxruntime way of computing
//! the same ranking (`tools/ort_sensitivity.py`: one model variant and one
//! onnxruntime session per candidate) on the same calibrated model, data and thread
//! count, checks that the two rankings agree, and prints both times, the time split
//! of ours and the ratio.
//!
//! MODEL defaults to the PP-OCRv4 detector of ../shared/models; DATA to the
//! `calibration_data` folder next to the model. A model without calibration nodes is
//! calibrated first with `hmct-debugger calibrate` (into target/sens-bench/). The two
//! sides run one after the other, ours first; the machine should be otherwise idle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model (calibrated, or float to be calibrated first). Default: the PP-OCRv4
    /// detector of ../shared/models.
    model: Option<PathBuf>,
    /// Calibration-data folder (default: `calibration_data` next to the model).
    data: Option<PathBuf>,
    /// Samples.
    #[arg(short = 'd', long = "data-num", default_value_t = 8)]
    data_num: usize,
    /// Threads, for both sides.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// node, weight or activation.
    #[arg(short = 'n', long = "node-type", default_value = "node")]
    node_type: String,
    /// Python with onnx and onnxruntime (default: target/ort-venv, created with pinned
    /// versions on first use).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Largest difference of a metric value between the two sides that still counts
    /// as agreeing (values, and the order of entries further apart than this).
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
}

fn detector(root: &Path) -> PathBuf {
    root.join("../shared/models/rapidocr_ppocrv4_det/ch_PP-OCRv4_det_infer.onnx")
}

/// Runs a command, failing with its stderr when it fails; returns (stderr, seconds).
fn timed(cmd: &mut Command, what: &str) -> Result<(String, f64)> {
    let start = Instant::now();
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    let secs = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!("{what} failed ({}):\n{stderr}", out.status);
    }
    Ok((stderr, secs))
}

/// (name, first metric value) of each entry, in ranking order.
fn ranking(path: &Path) -> Result<(String, Vec<(String, f64)>)> {
    let v: Value = serde_json::from_slice(&std::fs::read(path)?)
        .with_context(|| format!("reading {}", path.display()))?;
    let metric = v["metrics"][0]
        .as_str()
        .context("no metrics in the result")?
        .to_string();
    let entries = v["entries"]
        .as_array()
        .context("no entries in the result")?;
    let rows = entries
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let value = e["values"][&metric].as_f64().unwrap_or(f64::NAN);
            (name, value)
        })
        .collect();
    Ok((metric, rows))
}

pub fn run(root: &Path, args: &Args) -> Result<()> {
    let model = args.model.clone().unwrap_or_else(|| detector(root));
    let dir = model.parent().context("model path has no folder")?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| dir.join("calibration_data"));
    let out_dir = root.join("target/sens-bench");
    std::fs::create_dir_all(&out_dir)?;

    eprintln!("building hmct-debugger (release)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    timed(
        Command::new(cargo)
            .current_dir(root)
            .args(["build", "--release", "-q", "-p", "hmct-cli"]),
        "cargo build",
    )?;
    let ours = root.join("target/release/hmct-debugger");
    let python = match &args.python {
        Some(p) => p.clone(),
        None => crate::bench_ort::venv_python(root)?,
    };

    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let calibrated = if hmct_ir::load_model(&model)?.calibration_nodes().is_empty() {
        let cal = out_dir.join(format!("{stem}_calibrated.onnx"));
        if !cal.exists() {
            eprintln!("calibrating {} -> {}", model.display(), cal.display());
            timed(
                Command::new(&ours)
                    .arg("calibrate")
                    .arg(&model)
                    .arg(&data)
                    .arg("-o")
                    .arg(&cal),
                "hmct-debugger calibrate",
            )?;
        }
        cal
    } else {
        model.clone()
    };

    let (d, t) = (args.data_num.to_string(), args.threads.to_string());
    let ours_json = out_dir.join(format!("{stem}_ours.json"));
    let ort_json = out_dir.join(format!("{stem}_ort.json"));
    eprintln!(
        "ours: get-sensitivity-of-nodes -n {} -d {d} --threads {t}",
        args.node_type
    );
    let (ours_err, ours_secs) = timed(
        Command::new(&ours)
            .arg("get-sensitivity-of-nodes")
            .arg(&calibrated)
            .arg(&data)
            .args([
                "-n",
                &args.node_type,
                "-d",
                &d,
                "--threads",
                &t,
                "--timings",
            ])
            .arg("--json")
            .arg(&ours_json),
        "hmct-debugger get-sensitivity-of-nodes",
    )?;
    // Printed before the slow side starts, so an interrupted run still reports it.
    println!("model      {}", calibrated.display());
    println!(
        "setting    node_type {}, {} sample(s), {} thread(s)",
        args.node_type, args.data_num, args.threads
    );
    println!("ours       {ours_secs:8.1} s");
    for line in ours_err.lines().filter(|l| l.starts_with("timings:")) {
        println!("           {line}");
    }
    eprintln!("onnxruntime: tools/ort_sensitivity.py (this is the slow side)");
    let (_, ort_secs) = timed(
        Command::new(&python)
            .arg(root.join("tools/ort_sensitivity.py"))
            .arg(&calibrated)
            .arg(&data)
            .args(["-n", &args.node_type, "-d", &d, "--threads", &t])
            .arg("--json")
            .arg(&ort_json),
        "tools/ort_sensitivity.py",
    )?;

    let (metric, ours_rank) = ranking(&ours_json)?;
    let (_, ort_rank) = ranking(&ort_json)?;
    let agreement = compare(&ours_rank, &ort_rank, &metric, args.tolerance);

    println!("candidates {}", ours_rank.len());
    println!("onnxruntime{ort_secs:8.1} s");
    println!("speedup    {:8.1}x", ort_secs / ours_secs);
    match agreement {
        Ok(summary) => {
            println!("rankings   agree: {summary}");
            Ok(())
        }
        Err(problem) => bail!("rankings disagree: {problem}"),
    }
}

/// Same candidates, values within `tol`, and no pair of entries ordered differently
/// whose values differ by more than `tol` (closer ones are ties within float noise).
fn compare(
    ours: &[(String, f64)],
    ort: &[(String, f64)],
    metric: &str,
    tol: f64,
) -> std::result::Result<String, String> {
    let theirs: HashMap<&str, (usize, f64)> = ort
        .iter()
        .enumerate()
        .map(|(i, (n, v))| (n.as_str(), (i, *v)))
        .collect();
    if ours.len() != ort.len() {
        return Err(format!("{} entries vs {}", ours.len(), ort.len()));
    }
    let mut max_diff = 0.0f64;
    let mut pos = Vec::with_capacity(ours.len());
    for (name, v) in ours {
        let Some(&(p, w)) = theirs.get(name.as_str()) else {
            return Err(format!("'{name}' is missing from onnxruntime's result"));
        };
        let diff = (v - w).abs();
        if !(diff <= tol) {
            return Err(format!("'{name}': {metric} {v} vs {w}"));
        }
        max_diff = max_diff.max(diff);
        pos.push((p, w));
    }
    let mut swaps = 0;
    for i in 0..pos.len() {
        for j in i + 1..pos.len() {
            if pos[i].0 > pos[j].0 {
                if (pos[i].1 - pos[j].1).abs() > tol {
                    return Err(format!(
                        "'{}' and '{}' are ranked the other way round",
                        ours[i].0, ours[j].0
                    ));
                }
                swaps += 1;
            }
        }
    }
    Ok(format!(
        "largest {metric} difference {max_diff:.2e}, {swaps} swapped pair(s) of near-ties"
    ))
}
