//! `cargo xtask bench-ort`: times our interpreter against onnxruntime on the same model
//! and input, in one run, alternating the two, at 1 and 2 threads, and prints the
//! ratio per model. Ratios, not absolute times: the machine is noisy.
//!
//! onnxruntime runs in a Python process (a venv under `target/ort-venv`, created on
//! first use with pinned versions from PyPI) that, per command it reads on stdin,
//! times a given number of runs in a row, so both sides are timed the same way. Two
//! figures per model:
//! - *single*: the median of N single runs, ours and theirs alternating. Each run
//!   starts after the other engine ran (or this one's thread waited), so caches and
//!   the idle core are cold, as for a model run now and then.
//! - *warm*: N rounds of `WARM_BLOCK` runs in a row per engine, alternating; the first
//!   run of each block is dropped and the median of the rest taken, as for the
//!   back-to-back runs of a sensitivity sweep.
//!
//! With `--repeat K` each model is measured K times, each with a fresh session and a
//! fresh onnxruntime process; times are the medians over the K measurements and each
//! ratio is the median of the K ratios, with their range. On a shared VM one
//! measurement's ratio moves by 0.1-0.3 between invocations, so K of 10 gives the
//! figure to compare.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use hmct_quant::{Config, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

// onnx is for tools/ort_sensitivity.py (sensitivity-bench), which builds model variants.
const PINNED: &[&str] = &["onnxruntime==1.32.0", "numpy==2.4.6", "onnx==1.23.2"];

const ORT_SERVER: &str = r#"
import sys, time, glob, os
import numpy as np, onnxruntime as ort
model, data, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
feeds = {}
for inp in sess.get_inputs():
    d = os.path.join(data, inp.name.replace("/", "_").replace(":", "_"))
    if not os.path.isdir(d):
        d = data
    feeds[inp.name] = np.load(os.path.join(d, "0.npy"))
sess.run(None, feeds)
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    print(" ".join(map(str, times)), flush=True)
"#;

/// Runs in a row per engine and round of the warm figure; the first is dropped.
const WARM_BLOCK: usize = 10;

pub struct Options {
    pub models: Vec<PathBuf>,
    pub runs: usize,
    pub threads: Vec<usize>,
    /// Measurements per model and thread count, each with a fresh session and
    /// onnxruntime process.
    pub repeat: usize,
}

pub(crate) fn venv_python(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/ort-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("pinned.txt");
    if python.exists()
        && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&PINNED.join("\n"))
    {
        return Ok(python);
    }
    eprintln!("creating {} with {}", venv.display(), PINNED.join(" "));
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()?
        .success();
    if !ok {
        bail!("python3 -m venv failed");
    }
    let ok = Command::new(&python)
        .args(["-m", "pip", "install", "-q"])
        .args(PINNED)
        .status()?
        .success();
    if !ok {
        bail!("pip install {} failed", PINNED.join(" "));
    }
    std::fs::write(&stamp, PINNED.join("\n"))?;
    Ok(python)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of one measurement, in seconds: single runs ours and theirs, warm runs
/// ours and theirs.
struct Medians {
    single: (f64, f64),
    warm: (f64, f64),
}

pub fn run(root: &Path, opts: &Options) -> Result<()> {
    let python = venv_python(root)?;
    println!(
        "{:<28} {:>7} {:>16} {:>10} {:>18} {:>16} {:>10} {:>18}",
        "model",
        "threads",
        "single: ours ms",
        "ort ms",
        "ours/ort",
        "warm: ours ms",
        "ort ms",
        "ours/ort"
    );
    for model_path in &opts.models {
        let dir = model_path.parent().context("model path has no folder")?;
        let data_dir = dir.join("calibration_data");
        let model = hmct_ir::load_model(model_path)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for &threads in &opts.threads {
            let all = (0..opts.repeat.max(1))
                .map(|_| measure(&python, model_path, &data_dir, &model, threads, opts.runs))
                .collect::<Result<Vec<_>>>()?;
            // Times: the median over the measurements; ratios: the median of the
            // measurements' ratios, and their range when there are several.
            let time = |f: &dyn Fn(&Medians) -> f64| median(all.iter().map(f).collect()) * 1e3;
            let ratio = |f: &dyn Fn(&Medians) -> f64| {
                let r: Vec<f64> = all.iter().map(f).collect();
                let (lo, hi) = r
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                match r.len() {
                    1 => format!("{:.2}", r[0]),
                    _ => format!("{:.2} ({lo:.2}-{hi:.2})", median(r)),
                }
            };
            println!(
                "{:<28} {:>7} {:>16.3} {:>10.3} {:>18} {:>16.3} {:>10.3} {:>18}",
                name,
                threads,
                time(&|m| m.single.0),
                time(&|m| m.single.1),
                ratio(&|m| m.single.0 / m.single.1),
                time(&|m| m.warm.0),
                time(&|m| m.warm.1),
                ratio(&|m| m.warm.0 / m.warm.1),
            );
        }
    }
    Ok(())
}

/// One measurement of `model` at `threads`: a fresh session of ours and a fresh
/// onnxruntime process, `runs` single runs and `runs` warm rounds each, alternating.
fn measure(
    python: &Path,
    model_path: &Path,
    data_dir: &Path,
    model: &hmct_ir::Model,
    threads: usize,
    runs: usize,
) -> Result<Medians> {
    let session = Session::new(plan_model(model)?, threads)?;
    let specs = session.plan().input_specs();
    let sample = Dataset::open(data_dir, &specs)?.sample(0)?;
    let inputs: Vec<(&str, Tensor)> = sample
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    // The float model: the same graph onnxruntime runs.
    let config = Config::float();
    session.run(&inputs, &config)?;

    let mut child = Command::new(python)
        .args(["-c", ORT_SERVER])
        .arg(model_path)
        .arg(data_dir)
        .arg(threads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to_ort = child.stdin.take().context("ort stdin")?;
    let mut from_ort = BufReader::new(child.stdout.take().context("ort stdout")?);
    let mut line = String::new();
    from_ort.read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("onnxruntime could not load {}", model_path.display());
    }
    // Times `k` runs of onnxruntime in a row.
    let mut ort_runs = |k: usize| -> Result<Vec<f64>> {
        writeln!(to_ort, "{k}")?;
        line.clear();
        from_ort.read_line(&mut line)?;
        line.split_whitespace()
            .map(|t| t.parse::<f64>().context("ort timing"))
            .collect()
    };
    let our_runs = |k: usize| -> Result<Vec<f64>> {
        (0..k)
            .map(|_| {
                let t = Instant::now();
                session.run(&inputs, &config)?;
                Ok(t.elapsed().as_secs_f64())
            })
            .collect()
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.extend(our_runs(1)?);
        theirs.extend(ort_runs(1)?);
    }
    let (mut ours_warm, mut theirs_warm) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours_warm.extend(our_runs(WARM_BLOCK)?.into_iter().skip(1));
        theirs_warm.extend(ort_runs(WARM_BLOCK)?.into_iter().skip(1));
    }
    drop(to_ort);
    child.wait()?;
    Ok(Medians {
        single: (median(ours), median(theirs)),
        warm: (median(ours_warm), median(theirs_warm)),
    })
}
