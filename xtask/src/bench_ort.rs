//! `cargo xtask bench-ort`: times our interpreter against onnxruntime on the same model
//! and input, in one run, alternating the two, at 1 and 2 threads, and prints the
//! ratio per model. Ratios, not absolute times: the machine is noisy.
//!
//! onnxruntime runs in a Python process (a venv under `target/ort-venv`, created on
//! first use with pinned versions from PyPI) that times one run per command it reads
//! on stdin, so both sides are timed the same way: median of N single runs after a
//! warm-up, alternating ours / theirs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use hmct_quant::{Config, Session, plan_model};
use hmct_tensor::{Dataset, InputSpec, Tensor};

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
    t = time.perf_counter()
    sess.run(None, feeds)
    print(time.perf_counter() - t, flush=True)
"#;

pub struct Options {
    pub models: Vec<PathBuf>,
    pub runs: usize,
    pub threads: Vec<usize>,
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

pub fn run(root: &Path, opts: &Options) -> Result<()> {
    let python = venv_python(root)?;
    println!(
        "{:<28} {:>7} {:>12} {:>12} {:>12}",
        "model", "threads", "ours ms", "ort ms", "ours/ort"
    );
    for model_path in &opts.models {
        let dir = model_path.parent().context("model path has no folder")?;
        let data_dir = dir.join("calibration_data");
        let model = hmct_ir::load_model(model_path)?;
        for &threads in &opts.threads {
            let session = Session::new(plan_model(&model)?, threads)?;
            let specs: Vec<InputSpec> = session
                .plan()
                .inputs()
                .iter()
                .map(|i| InputSpec {
                    name: i.name.clone(),
                    dtype: i.dtype,
                    dims: i.dims.clone(),
                })
                .collect();
            let sample = Dataset::open(&data_dir, &specs)?.sample(0)?;
            let inputs: Vec<(&str, Tensor)> = sample
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            // The float model: the same graph onnxruntime runs.
            let config = Config::float();
            session.run(&inputs, &config)?;

            let mut child = Command::new(&python)
                .args(["-c", ORT_SERVER])
                .arg(model_path)
                .arg(&data_dir)
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
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..opts.runs {
                let t = Instant::now();
                session.run(&inputs, &config)?;
                ours.push(t.elapsed().as_secs_f64());
                writeln!(to_ort, "run")?;
                line.clear();
                from_ort.read_line(&mut line)?;
                theirs.push(line.trim().parse::<f64>().context("ort timing")?);
            }
            drop(to_ort);
            child.wait()?;
            let (a, b) = (median(ours), median(theirs));
            println!(
                "{:<28} {:>7} {:>12.3} {:>12.3} {:>12.2}",
                dir.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                threads,
                a * 1e3,
                b * 1e3,
                a / b
            );
        }
    }
    Ok(())
}
