//! `cargo xtask sensitivity-bench [MODEL [DATA]] [--zoo] [-d 8] [--threads 1,2]`: times
//! `hmct-debugger get-sensitivity-of-nodes` against the onnxruntime way of computing
//! the same ranking (`tools/ort_sensitivity.py`: one model variant and one
//! onnxruntime session per candidate) on the same calibrated model, data and thread
//! count, checks that the two rankings agree, and prints both times, the time split
//! of ours and the ratio.
//!
//! Models: MODEL, or with `--zoo` every model of the zoo (`cargo xtask zoo`), or by
//! default every model of ../shared/models. DATA defaults to the `calibration_data`
//! folder next to the model. A model without calibration nodes is calibrated first
//! with `hmct-debugger calibrate` (into target/sens-bench/). At each thread count the
//! two sides run one after the other, ours first; the machine should be otherwise
//! idle. The summary also says how each side scales from one thread to more (the
//! probes of ours: their wall time from `--timings`), and how ours scales as that
//! many one-thread processes, each ranking a part of the candidates (`--shard I/N`,
//! then `merge`; the merged ranking must equal the one-process ranking exactly). Each
//! measurement also prints the speed-up our probes would give at onnxruntime's
//! speed per full run and at the measured FMA peak (the cone arithmetic, measured).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model (calibrated, or float to be calibrated first). Default: every model of
    /// ../shared/models.
    model: Option<PathBuf>,
    /// Calibration-data folder (default: `calibration_data` next to the model).
    data: Option<PathBuf>,
    /// Every model of the zoo (`cargo xtask zoo`), calibrated with our `calibrate`.
    #[arg(long, conflicts_with = "model")]
    zoo: bool,
    /// Samples.
    #[arg(short = 'd', long = "data-num", default_value_t = 8)]
    data_num: usize,
    /// Thread counts, for both sides.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
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

/// One model to measure: a short name, the model and its data.
struct Target {
    label: String,
    model: PathBuf,
    data: PathBuf,
}

/// What every row of a model shares: our full run of one sample on one thread
/// (in-process, warm) and the model's arithmetic.
#[derive(Clone, Copy)]
struct OneThread {
    ours_run: f64,
    gflop: f64,
    /// A full run's multiply-adds at one core's measured FMA peak, seconds.
    peak_run: f64,
}

impl OneThread {
    fn measure(root: &Path, model: &Path, data: &Path) -> Result<OneThread> {
        let model = hmct_ir::load_model(model)?;
        let gflop = crate::bench_ort::gflop(&model, data)?;
        Ok(OneThread {
            ours_run: crate::bench_ort::warm_run_secs(&model, data, 1, 5)?,
            gflop,
            peak_run: gflop / crate::peak::f32_gflops(root, 1)?,
        })
    }
}

/// The speed-up our way would reach if its probes ran at another speed per core: the
/// cone arithmetic of issue 21, measured rather than estimated. At any thread count
/// our probes are single-thread tasks side by side, and a probe's time is its cone's
/// share of a full run times a full run's time on one core; so scaling our probe time
/// by (other one-thread full-run time / our one-thread full-run time) keeps every cone
/// as it is and swaps only the kernels. The rest of our time (start, loading, the
/// float pass, metrics) stays as measured.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    /// Our full run of one sample on one thread, seconds.
    ours_run: f64,
    /// onnxruntime's on one thread (the runs of its one-thread sweep), when measured.
    ort_run: Option<f64>,
    /// With our probes at onnxruntime's one-thread speed per run.
    at_parity: Option<f64>,
    /// With every multiply-add of our probes at one core's measured f32 FMA peak (and
    /// the rest of a run free): no f32 engine does better on this machine.
    at_peak: f64,
}

impl Bounds {
    fn new(
        ours_total: f64,
        probes: f64,
        ort_total: f64,
        ours_run: f64,
        ort_run: Option<f64>,
        peak_run: f64,
    ) -> Bounds {
        let rest = (ours_total - probes).max(0.0);
        let with = |run: f64| ort_total / (rest + probes * run / ours_run);
        Bounds {
            ours_run,
            ort_run,
            at_parity: ort_run.map(with),
            at_peak: with(peak_run),
        }
    }
}

/// One measurement of one model at one thread count.
struct Row {
    label: String,
    threads: usize,
    candidates: usize,
    ours: f64,
    /// Wall time of our probes (from `--timings`).
    probes: Option<f64>,
    ort: f64,
    /// What the speed-up would be with our probes at other per-run speeds (see
    /// [`Bounds`]), when the timings needed were there.
    bounds: Option<Bounds>,
    /// onnxruntime's time per full run of one sample in its sweep.
    ort_run: Option<f64>,
    /// At more than one thread: the wall time of as many one-thread processes, each
    /// ranking its part of the candidates (`--shard I/N`), and `merge`.
    sharded: Option<f64>,
    /// The comparison of the rankings: `Ok(summary)` or `Err(problem)`.
    agreement: std::result::Result<String, String>,
}

fn targets(root: &Path, args: &Args) -> Result<Vec<Target>> {
    let folder_name = |m: &Path| {
        m.parent()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    };
    if args.zoo {
        let mut out = Vec::new();
        for e in crate::zoo::entries(root)? {
            match &e.state {
                Ok(()) => out.push(Target {
                    label: e.name.clone(),
                    model: e.calibrated(),
                    data: e.data(),
                }),
                Err(why) => println!("{}: skipped, {why}", e.name),
            }
        }
        return Ok(out);
    }
    let models = match &args.model {
        Some(m) => vec![m.clone()],
        None => crate::shared_models(root)?,
    };
    Ok(models
        .into_iter()
        .map(|m| {
            let data = match (&args.data, m.parent()) {
                (Some(d), _) => d.clone(),
                (None, Some(dir)) => dir.join("calibration_data"),
                (None, None) => PathBuf::from("calibration_data"),
            };
            Target {
                label: folder_name(&m),
                model: m,
                data,
            }
        })
        .collect())
}

pub fn run(root: &Path, args: &Args) -> Result<()> {
    let out_dir = root.join("target/sens-bench");
    std::fs::create_dir_all(&out_dir)?;
    let ours = crate::release_cli(root)?;
    let python = match &args.python {
        Some(p) => p.clone(),
        None => crate::bench_ort::venv_python(root)?,
    };
    let mut rows = Vec::new();
    for target in targets(root, args)? {
        let calibrated = calibrated(&ours, &target, &out_dir)?;
        let one_thread = match OneThread::measure(root, &calibrated, &target.data) {
            Ok(o) => o,
            Err(e) => {
                println!("{}: FAILED: {e:#}", target.label);
                continue;
            }
        };
        for &threads in &args.threads {
            match measure(
                root,
                args,
                &ours,
                &python,
                &target,
                &calibrated,
                threads,
                &out_dir,
                &one_thread,
                // onnxruntime's one-thread run time, from this model's one-thread row.
                rows.iter()
                    .rev()
                    .find(|r: &&Row| r.label == target.label && r.threads == 1)
                    .and_then(|r| r.ort_run),
            ) {
                Ok(row) => rows.push(row),
                // One model onnxruntime or we cannot run does not stop the others.
                Err(e) => println!("{} at {threads} thread(s): FAILED: {e:#}", target.label),
            }
        }
    }
    summary(&rows, &args.threads);
    let disagree: Vec<String> = rows
        .iter()
        .filter(|r| r.agreement.is_err())
        .map(|r| format!("{} at {} thread(s)", r.label, r.threads))
        .collect();
    if !disagree.is_empty() {
        bail!("rankings disagree on {}", disagree.join(", "));
    }
    Ok(())
}

/// The calibrated model of `target`: itself, or calibrated with our `calibrate`
/// first when it has no calibration nodes.
fn calibrated(ours: &Path, target: &Target, out_dir: &Path) -> Result<PathBuf> {
    if !hmct_ir::load_model(&target.model)?
        .calibration_nodes()
        .is_empty()
    {
        return Ok(target.model.clone());
    }
    let cal = out_dir.join(format!("{}_calibrated.onnx", target.label));
    if !cal.exists() {
        eprintln!(
            "calibrating {} -> {}",
            target.model.display(),
            cal.display()
        );
        timed(
            Command::new(ours)
                .arg("calibrate")
                .arg(&target.model)
                .arg(&target.data)
                .arg("-o")
                .arg(&cal),
            "hmct-debugger calibrate",
        )?;
    }
    Ok(cal)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    root: &Path,
    args: &Args,
    ours: &Path,
    python: &Path,
    target: &Target,
    calibrated: &Path,
    threads: usize,
    out_dir: &Path,
    one_thread: &OneThread,
    ort_run_1thread: Option<f64>,
) -> Result<Row> {
    let (d, t) = (args.data_num.to_string(), threads.to_string());
    let stem = format!("{}_t{threads}", target.label);
    let ours_json = out_dir.join(format!("{stem}_ours.json"));
    let ort_json = out_dir.join(format!("{stem}_ort.json"));
    eprintln!(
        "{}: ours: get-sensitivity-of-nodes -n {} -d {d} --threads {t}",
        target.label, args.node_type
    );
    let (ours_err, ours_secs) = timed(
        Command::new(ours)
            .arg("get-sensitivity-of-nodes")
            .arg(calibrated)
            .arg(&target.data)
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
        "setting    node_type {}, {} sample(s), {threads} thread(s)",
        args.node_type, args.data_num
    );
    println!("ours       {ours_secs:8.1} s");
    let timings: Vec<&str> = ours_err
        .lines()
        .filter(|l| l.starts_with("timings:"))
        .collect();
    for line in &timings {
        println!("           {line}");
    }
    eprintln!(
        "{}: onnxruntime: tools/ort_sensitivity.py (this is the slow side)",
        target.label
    );
    let (_, ort_secs) = timed(
        Command::new(python)
            .arg(root.join("tools/ort_sensitivity.py"))
            .arg(calibrated)
            .arg(&target.data)
            .args(["-n", &args.node_type, "-d", &d, "--threads", &t])
            .arg("--json")
            .arg(&ort_json),
        "tools/ort_sensitivity.py",
    )?;

    let (metric, ours_rank) = ranking(&ours_json)?;
    let sharded = if threads > 1 {
        let (secs, merged) = sharded(ours, calibrated, target, args, threads, out_dir)?;
        if let Err(problem) = compare(&ours_rank, &merged, &metric, 0.0) {
            bail!("{threads} sharded processes gave another ranking than one process: {problem}");
        }
        println!(
            "processes  {secs:8.1} s as {threads} processes of one thread (--shard I/{threads}, then merge; the same ranking)"
        );
        Some(secs)
    } else {
        None
    };
    let (_, ort_rank) = ranking(&ort_json)?;
    let agreement = compare(&ours_rank, &ort_rank, &metric, args.tolerance);
    println!("candidates {}", ours_rank.len());
    println!("onnxruntime{ort_secs:8.1} s");
    println!("speedup    {:8.1}x", ort_secs / ours_secs);
    let probes = timings.iter().find_map(|l| probes_secs(l));
    let ort_run = ort_run_secs(&ort_json, args.data_num)?;
    let ort_run_1 = if threads == 1 {
        ort_run
    } else {
        ort_run_1thread
    };
    let bounds = match probes {
        Some(probes) => {
            let OneThread {
                ours_run,
                gflop,
                peak_run,
            } = *one_thread;
            let b = Bounds::new(ours_secs, probes, ort_secs, ours_run, ort_run_1, peak_run);
            let ort = ort_run_1.map_or("not measured".into(), |r| format!("{:.2} ms", r * 1e3));
            println!(
                "full run   on one thread: ours {:.2} ms, onnxruntime {ort}, {gflop:.2} GFLOP ({:.2} ms at the FMA peak)",
                ours_run * 1e3,
                peak_run * 1e3
            );
            let parity = b.at_parity.map_or("-".into(), |p| format!("{p:.1}x"));
            println!(
                "bounds     {parity} with our probes at onnxruntime's speed per run and core, {:.1}x at the FMA peak",
                b.at_peak
            );
            Some(b)
        }
        None => None,
    };
    match &agreement {
        Ok(summary) => println!("rankings   agree: {summary}"),
        Err(problem) => println!("rankings   DISAGREE: {problem}"),
    }
    Ok(Row {
        label: target.label.clone(),
        threads,
        candidates: ours_rank.len(),
        ours: ours_secs,
        probes,
        ort: ort_secs,
        bounds,
        ort_run,
        sharded,
        agreement,
    })
}

/// Ranks the candidates as `n` concurrent one-thread processes, each taking part
/// `I/n` (`--shard`), then `merge`s the parts: the wall time of the whole, and the
/// merged ranking.
fn sharded(
    ours: &Path,
    calibrated: &Path,
    target: &Target,
    args: &Args,
    n: usize,
    out_dir: &Path,
) -> Result<(f64, Vec<(String, f64)>)> {
    eprintln!(
        "{}: ours as {n} processes of one thread (--shard I/{n})",
        target.label
    );
    let parts: Vec<PathBuf> = (1..=n)
        .map(|i| out_dir.join(format!("{}_part{i}of{n}.json", target.label)))
        .collect();
    let start = Instant::now();
    let children = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            Command::new(ours)
                .arg("get-sensitivity-of-nodes")
                .arg(calibrated)
                .arg(&target.data)
                .args(["-n", &args.node_type, "-d", &args.data_num.to_string()])
                .args(["--threads", "1", "--shard", &format!("{}/{n}", i + 1)])
                .arg("--json")
                .arg(part)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .context("starting a --shard run")
        })
        .collect::<Result<Vec<_>>>()?;
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "a --shard run failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let merged = out_dir.join(format!("{}_merged{n}.json", target.label));
    timed(
        Command::new(ours)
            .arg("merge")
            .args(&parts)
            .arg("--json")
            .arg(&merged),
        "hmct-debugger merge",
    )?;
    let secs = start.elapsed().as_secs_f64();
    Ok((secs, ranking(&merged)?.1))
}

/// onnxruntime's time per full run of one sample in its sweep: every candidate and the
/// float reference run each sample once (`timings.run` over `probes` x samples).
fn ort_run_secs(json: &Path, samples: usize) -> Result<Option<f64>> {
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?,
    )?;
    let run = v["timings"]["run"].as_f64();
    let probes = v["probes"].as_f64();
    let samples = v["data_num"].as_f64().unwrap_or(samples as f64);
    Ok(match (run, probes) {
        (Some(run), Some(p)) if p > 0.0 && samples > 0.0 => Some(run / (p * samples)),
        _ => None,
    })
}

/// The probes' wall time in a `timings:` line ("... probes 12.345 s wall ...").
fn probes_secs(line: &str) -> Option<f64> {
    let rest = &line[line.find("probes ")? + "probes ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The table of all measurements, then how each side scales with threads.
fn summary(rows: &[Row], threads: &[usize]) {
    println!();
    println!(
        "{:<28} {:>10} {:>7} {:>10} {:>10} {:>16} {:>9} {:>14} {:>9} {:>9}  rankings",
        "model",
        "candidates",
        "threads",
        "ours s",
        "probes s",
        "onnxruntime s",
        "speed-up",
        "run ours/ort",
        "parity",
        "peak"
    );
    for r in rows {
        let (run_ratio, parity, peak) = match r.bounds {
            Some(b) => (
                b.ort_run
                    .map(|o| format!("{:.2}", b.ours_run / o))
                    .unwrap_or_default(),
                b.at_parity.map(|p| format!("{p:.1}x")).unwrap_or_default(),
                format!("{:.1}x", b.at_peak),
            ),
            None => Default::default(),
        };
        println!(
            "{:<28} {:>10} {:>7} {:>10.1} {:>10} {:>16.1} {:>8.1}x {run_ratio:>14} {parity:>9} {peak:>9}  {}",
            r.label,
            r.candidates,
            r.threads,
            r.ours,
            r.probes.map(|p| format!("{p:.1}")).unwrap_or_default(),
            r.ort,
            r.ort / r.ours,
            match &r.agreement {
                Ok(_) => "agree".to_string(),
                Err(e) => format!("DISAGREE: {e}"),
            }
        );
    }
    let (Some(&one), Some(&most)) = (threads.iter().min(), threads.iter().max()) else {
        return;
    };
    if one == most {
        return;
    }
    println!();
    println!(
        "run ours/ort: a full run on one thread; parity / peak: the speed-up with our probes at onnxruntime's one-thread time per full run, or with their multiply-adds at one core's measured FMA peak (cones, thread count and the rest of our time as measured)"
    );
    println!(
        "scaling from {one} to {most} threads (time at {one} / time at {most}); ours also as {most} processes of one thread each (--shard I/{most}, then merge)"
    );
    println!(
        "{:<28} {:>10} {:>10} {:>14} {:>16}",
        "model",
        "ours",
        "probes",
        "onnxruntime",
        format!("{most} processes")
    );
    let mut labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    labels.dedup();
    for label in labels {
        let at = |t: usize| rows.iter().find(|r| r.label == label && r.threads == t);
        if let (Some(a), Some(b)) = (at(one), at(most)) {
            let probes = match (a.probes, b.probes) {
                (Some(x), Some(y)) => format!("{:.2}x", x / y),
                _ => String::new(),
            };
            let processes = b
                .sharded
                .map(|p| format!("{:.2}x", a.ours / p))
                .unwrap_or_default();
            println!(
                "{label:<28} {:>9.2}x {probes:>10} {:>13.2}x {processes:>16}",
                a.ours / b.ours,
                a.ort / b.ort
            );
        }
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

#[cfg(test)]
mod tests {
    use super::probes_secs;

    #[test]
    fn bounds_swap_only_the_probe_kernels() {
        // 10 s ours, 8 of them probes; onnxruntime 30 s. Probes at half our run time
        // take 4 s: 30 / (2 + 4).
        let b = super::Bounds::new(10.0, 8.0, 30.0, 0.010, Some(0.005), 0.0025);
        assert!((b.at_parity.unwrap() - 5.0).abs() < 1e-12);
        assert!((b.at_peak - 7.5).abs() < 1e-12);
    }

    #[test]
    fn reads_the_probe_time_of_a_timings_line() {
        let line = "timings: float pass 0.512 s (8 full runs); probes 12.345 s wall for 40 runs on 2 thread(s), of which runs 11.000 s and metrics 0.100 s; 12 MB cached";
        assert_eq!(probes_secs(line), Some(12.345));
        assert_eq!(probes_secs("timings: float pass 0.5 s"), None);
    }
}
