//! `cargo xtask bench-ort`: times our interpreter against onnxruntime on the same model
//! and input, in one run, alternating the two, at 1 and 2 threads, and prints the
//! ratio per model. Ratios, not absolute times: the machine is noisy.
//!
//! onnxruntime runs in a Python process (a venv under `target/ort-venv`, created on
//! first use with pinned versions from PyPI) that, per command it reads on stdin,
//! times a given number of runs in a row, so both sides are timed the same way. Two
//! figures per model:
//! - *single*: the median of N single runs, ours and theirs alternating, each after
//!   `IDLE_BEFORE` of idle, as for a model run now and then: caches are cold
//!   and the threads asleep. The pause matters at two threads: onnxruntime's worker
//!   spins about 45 ms after each run (`tools/ort_spin.py`), and a run of ours started
//!   right after it shared the two cores with that spin (ResNet-50 at two threads
//!   took 78 ms single against 41 warm, its one-thread time).
//! - *warm*: N rounds of `WARM_BLOCK` runs in a row per engine, alternating, each block
//!   after the same idle; the first run of each block is dropped and the median of the
//!   rest taken, as for the back-to-back runs of a sensitivity sweep. Without the
//!   idle, a block of ours began inside the spin of onnxruntime's worker after its
//!   block, and at two threads a block of runs of a few ms (MobileNetV3-small, MnasNet
//!   0.5, SqueezeNet 1.1) lay wholly inside it.
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
use hmct_quant::{Capture, Config, Session, Slot, plan_model};
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
/// Idle time before each single run and each warm block: longer than onnxruntime's
/// worker threads spin after a run.
const IDLE_BEFORE: std::time::Duration = std::time::Duration::from_millis(100);

pub struct Options {
    pub models: Vec<PathBuf>,
    pub runs: usize,
    pub threads: Vec<usize>,
    /// Measurements per model and thread count, each with a fresh session and
    /// onnxruntime process.
    pub repeat: usize,
}

pub(crate) fn venv_python(root: &Path) -> Result<PathBuf> {
    let pins: Vec<String> = PINNED.iter().map(|p| p.to_string()).collect();
    venv(root, "ort-venv", &PINNED.join("\n"), &pins)
}

/// `target/NAME/bin/python`, creating the venv and installing `pip install ARGS` on
/// first use, or again when `stamp` (what the install is pinned to) changed.
pub(crate) fn venv(root: &Path, name: &str, stamp: &str, args: &[String]) -> Result<PathBuf> {
    let venv = root.join("target").join(name);
    let python = venv.join("bin/python");
    let stamp_path = venv.join("pinned.txt");
    if python.exists() && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp) {
        return Ok(python);
    }
    eprintln!("creating {} with {}", venv.display(), args.join(" "));
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
        .args(args)
        .status()?
        .success();
    if !ok {
        bail!("pip install {} failed", args.join(" "));
    }
    std::fs::write(&stamp_path, stamp)?;
    Ok(python)
}

/// Our median time of one warm run of `model` on the first sample of `data_dir`, in
/// seconds, in this process (`runs` runs after one that packs the weights).
pub(crate) fn warm_run_secs(
    model: &hmct_ir::Model,
    data_dir: &Path,
    threads: usize,
    runs: usize,
) -> Result<f64> {
    let (session, sample) = warm_session(model, data_dir, threads)?;
    let inputs = named(&sample);
    let config = Config::float();
    // Outputs go back to the buffer pool outside the timed run, as `run` and the
    // probes of the analyses give theirs back.
    let times = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            let outputs = session.run(&inputs, &config)?;
            let time = start.elapsed().as_secs_f64();
            session.recycle(outputs);
            Ok(time)
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok(median(times))
}

/// A session of `model` on `threads` threads that has run the first sample of
/// `data_dir` once as a float model (packing its weights), and that sample.
fn warm_session(
    model: &hmct_ir::Model,
    data_dir: &Path,
    threads: usize,
) -> Result<(Session, Vec<(String, Tensor)>)> {
    let session = Session::new(plan_model(model)?, threads)?;
    let sample = Dataset::open(data_dir, &session.plan().input_specs())?.sample(0)?;
    session.run(&named(&sample), &Config::float())?;
    Ok((session, sample))
}

/// A sample as the (name, tensor) pairs `Session::run` takes.
fn named(sample: &[(String, Tensor)]) -> Vec<(&str, Tensor)> {
    sample
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect()
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
    let peaks = opts
        .threads
        .iter()
        .map(|&t| crate::peak::f32_gflops(root, t))
        .collect::<Result<Vec<_>>>()?;
    println!(
        "f32 FMA peak (cargo xtask peak, target/peak.json): {}",
        opts.threads
            .iter()
            .zip(&peaks)
            .map(|(t, p)| format!("{p:.1} GFLOP/s at {t} thread(s)"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{:<28} {:>7} {:>7} {:>16} {:>10} {:>18} {:>16} {:>10} {:>18} {:>8} {:>6}",
        "model",
        "GFLOP",
        "threads",
        "single: ours ms",
        "ort ms",
        "ours/ort",
        "warm: ours ms",
        "ort ms",
        "ours/ort",
        "GFLOP/s",
        "%peak"
    );
    // Per thread count, the (single, warm) ratio of each model, for the geometric mean.
    let mut ratios: Vec<Vec<(f64, f64)>> = vec![Vec::new(); opts.threads.len()];
    for model_path in &opts.models {
        let dir = model_path.parent().context("model path has no folder")?;
        let data_dir = dir.join("calibration_data");
        let model = hmct_ir::load_model(model_path)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let gflop = gflop(&model, &data_dir)?;
        for (ti, &threads) in opts.threads.iter().enumerate() {
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
                let m = median(r.clone());
                match r.len() {
                    1 => (m, format!("{m:.2}")),
                    _ => (m, format!("{m:.2} ({lo:.2}-{hi:.2})")),
                }
            };
            let single = ratio(&|m| m.single.0 / m.single.1);
            let warm = ratio(&|m| m.warm.0 / m.warm.1);
            ratios[ti].push((single.0, warm.0));
            // The rate of our warm runs, the regime of a sensitivity sweep.
            let rate = gflop / (time(&|m| m.warm.0) * 1e-3);
            println!(
                "{:<28} {:>7.2} {:>7} {:>16.3} {:>10.3} {:>18} {:>16.3} {:>10.3} {:>18} {:>8.1} {:>5.0}%",
                name,
                gflop,
                threads,
                time(&|m| m.single.0),
                time(&|m| m.single.1),
                single.1,
                time(&|m| m.warm.0),
                time(&|m| m.warm.1),
                warm.1,
                rate,
                100.0 * rate / peaks[ti],
            );
        }
    }
    if opts.models.len() > 1 {
        for (t, r) in opts.threads.iter().zip(&ratios) {
            let geo = |f: fn(&(f64, f64)) -> f64| {
                (r.iter().map(|x| f(x).ln()).sum::<f64>() / r.len() as f64).exp()
            };
            println!(
                "geometric mean of ours/ort at {t} thread(s): single {:.2}, warm {:.2} ({} models)",
                geo(|x| x.0),
                geo(|x| x.1),
                r.len()
            );
        }
    }
    Ok(())
}

/// GFLOP of one run of `model` on the first sample of `data_dir`: Conv, ConvTranspose,
/// MatMul and Gemm as 2 x multiply-adds, from the shapes a run produces (as
/// tools/cone_flops.py counts them; other nodes are not counted).
pub(crate) fn gflop(model: &hmct_ir::Model, data_dir: &Path) -> Result<f64> {
    let session = Session::new(plan_model(model)?, 1)?;
    let plan = session.plan();
    let sample = Dataset::open(data_dir, &plan.input_specs())?.sample(0)?;
    let inputs: Vec<(&str, Tensor)> = sample
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let bound = session.bind_inputs(&inputs)?;
    let values = session.run_from(&bound, None, &Config::float(), plan.outputs(), Capture::All)?;
    let shape = |slot: Slot| -> Option<Vec<usize>> {
        values
            .get(slot)
            .or_else(|| plan.constant(slot))
            .map(|t| t.shape().to_vec())
    };
    let elems = |s: &[usize]| s.iter().product::<usize>() as f64;
    let mut flops = 0.0;
    for n in plan.nodes() {
        let input = |i: usize| n.inputs.get(i).copied().flatten().and_then(shape);
        let (Some(out), Some(a), Some(b)) = (
            n.outputs.first().and_then(|&s| shape(s)),
            input(0),
            input(1),
        ) else {
            continue;
        };
        flops += match n.op_type.as_str() {
            // Each output sums input channels per group x kernel taps: W is
            // (M, C/group, k...).
            "Conv" => 2.0 * elems(&out) * elems(&b[1..]),
            // Each input element is spread over (M/group x k...) outputs: W is
            // (C, M/group, k...).
            "ConvTranspose" => 2.0 * elems(&a) * elems(&b[1..]),
            "MatMul" => 2.0 * elems(&out) * a.last().copied().unwrap_or(1) as f64,
            // A is M x K or K x M; the output's first axis is M.
            "Gemm" => {
                2.0 * elems(&out) * elems(&a) / out.first().copied().unwrap_or(1).max(1) as f64
            }
            _ => 0.0,
        };
    }
    Ok(flops * 1e-9)
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
    let (session, sample) = warm_session(model, data_dir, threads)?;
    let inputs = named(&sample);
    // The float model: the same graph onnxruntime runs.
    let config = Config::float();

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
                let outputs = session.run(&inputs, &config)?;
                let time = t.elapsed().as_secs_f64();
                session.recycle(outputs);
                Ok(time)
            })
            .collect()
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        std::thread::sleep(IDLE_BEFORE);
        ours.extend(our_runs(1)?);
        std::thread::sleep(IDLE_BEFORE);
        theirs.extend(ort_runs(1)?);
    }
    let (mut ours_warm, mut theirs_warm) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        std::thread::sleep(IDLE_BEFORE);
        ours_warm.extend(our_runs(WARM_BLOCK)?.into_iter().skip(1));
        std::thread::sleep(IDLE_BEFORE);
        theirs_warm.extend(ort_runs(WARM_BLOCK)?.into_iter().skip(1));
    }
    drop(to_ort);
    child.wait()?;
    Ok(Medians {
        single: (median(ours), median(theirs)),
        warm: (median(ours_warm), median(theirs_warm)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bundled example's convs and Gemm, counted by hand from its shapes (see
    /// examples/tiny_cnn): 3x3 convs 3->16 on 32x32, 16->32 stride 2, two 32->32 on
    /// 16x16, a depthwise 3x3 stride 2 on 32 channels, a 1x1 32->64 on 8x8 and a
    /// 64->10 Gemm. Calibration nodes add nothing.
    #[test]
    fn gflop_counts_convs_and_gemms_from_the_run_shapes() {
        let dir = crate::repo_root().join("examples/tiny_cnn");
        let expected = 2.0
            * (16.0 * 32.0 * 32.0 * 27.0
                + 32.0 * 16.0 * 16.0 * 144.0
                + 2.0 * 32.0 * 16.0 * 16.0 * 288.0
                + 32.0 * 8.0 * 8.0 * 9.0
                + 64.0 * 8.0 * 8.0 * 32.0
                + 10.0 * 64.0)
            * 1e-9;
        for file in ["float_model.onnx", "calibrated_model.onnx"] {
            let model = hmct_ir::load_model(&dir.join(file)).unwrap();
            let got = gflop(&model, &dir.join("calibration_data")).unwrap();
            assert!(
                (got - expected).abs() < 1e-15,
                "{file}: {got} vs {expected}"
            );
        }
    }
}
