//! `hmct-debugger run`: runs a model on every sample of a calibration-data folder and
//! writes its outputs as `.npy` files.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use hmct_quant::{Config, NodeTimes, Session, plan_model};
use hmct_tensor::{Dataset, InputSpec, Tensor, sanitize_name, write_npy};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The (calibrated) ONNX model.
    pub model: PathBuf,
    /// Calibration-data folder: one sub-folder per input with 0.npy, 1.npy, ...
    pub data: PathBuf,
    /// Write outputs to OUTDIR/<output name>/<sample>.npy.
    #[arg(short = 'o', long = "output-dir", visible_alias = "output_dir")]
    pub output_dir: Option<PathBuf>,
    /// Run the float model (every calibration node OFF).
    #[arg(long, conflicts_with = "calibrated")]
    pub float: bool,
    /// Run the calibrated model as written (the default).
    #[arg(long)]
    pub calibrated: bool,
    #[command(flatten)]
    pub workers: crate::common::Threads,
    /// Run each sample this many times and print the median time per run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Print where the time goes: per op type and the slowest nodes.
    #[arg(long)]
    pub profile: bool,
    /// How many of the slowest nodes the profile lists by name.
    #[arg(long, default_value_t = 10, requires = "profile")]
    pub slowest: usize,
}

pub fn run(args: &RunArgs) -> Result<()> {
    let model = hmct_ir::load_model(&args.model)?;
    let plan = plan_model(&model).with_context(|| args.model.display().to_string())?;
    let mut session = Session::new(plan, args.workers.threads)?;
    if args.profile {
        session = session.with_profiling();
    }
    let specs = session.plan().input_specs();
    let data = Dataset::open(&args.data, &specs)?;
    let config = if args.float {
        Config::float()
    } else {
        Config::calibrated()
    };
    let output_names: Vec<String> = session
        .plan()
        .output_names()
        .iter()
        .map(|s| s.to_string())
        .collect();

    if let Some(dir) = &args.output_dir {
        for name in &output_names {
            let sub = dir.join(sanitize_name(name));
            std::fs::create_dir_all(&sub)
                .with_context(|| format!("{}: cannot create folder", sub.display()))?;
        }
    }

    let mut times: Vec<Duration> = Vec::new();
    for sample in 0..data.len() {
        let inputs = data.sample(sample)?;
        let refs: Vec<(&str, Tensor)> = inputs
            .into_iter()
            .map(|(n, t)| (specs_name(&specs, &n), t))
            .collect();
        let mut outputs = Vec::new();
        for _ in 0..args.repeat {
            session.recycle(std::mem::take(&mut outputs));
            let start = Instant::now();
            outputs = session.run(&refs, &config)?;
            times.push(start.elapsed());
        }
        if let Some(dir) = &args.output_dir {
            for (name, t) in output_names.iter().zip(&outputs) {
                let path = dir.join(sanitize_name(name)).join(format!("{sample}.npy"));
                write_npy(&path, t)?;
            }
        }
        session.recycle(outputs);
    }
    if data.is_empty() {
        bail!("{}: no samples", args.data.display());
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "ran {} model on {} sample(s), {} output(s), {} thread(s)",
        if args.float {
            "the float"
        } else {
            "the calibrated"
        },
        data.len(),
        output_names.len(),
        session.threads()
    );
    if args.repeat > 1 {
        println!(
            "median time per run: {:.3} ms over {} runs",
            median.as_secs_f64() * 1e3,
            times.len()
        );
    }
    if let Some(times) = session.node_times() {
        print_profile(
            &session,
            &times,
            data.len() * args.repeat as usize,
            args.slowest,
        );
    }
    if let Some(dir) = &args.output_dir {
        println!("outputs written to {}", dir.display());
    }
    Ok(())
}

/// Time per run by op type, then the slowest nodes.
fn print_profile(session: &hmct_quant::Session, times: &NodeTimes, runs: usize, slowest: usize) {
    let plan = session.plan();
    let per_run = |d: Duration| d.as_secs_f64() * 1e3 / runs.max(1) as f64;
    let total: Duration = times.total.iter().sum();
    let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(f64::MIN_POSITIVE);
    // A node that ran an element-wise chain as one pass timed the whole chain; the
    // chain's other nodes did not run on their own.
    let fused = |i: usize| session.fused_chain(i).filter(|_| times.fused_calls[i] > 0);
    // A node whose kernel ran the element-wise chain after it on its output (a Conv
    // and its activation) timed both.
    let tail = |i: usize| session.fused_tail(i).filter(|_| times.tail_calls[i] > 0);
    let label = |i: usize| match (fused(i), tail(i)) {
        (Some(chain), _) => format!("fused chain of {}", chain.len()),
        (None, Some(tail)) if tail.len() <= 2 => std::iter::once(i)
            .chain(tail.iter().copied())
            .map(|j| plan.nodes()[j].op_type.as_str())
            .collect::<Vec<_>>()
            .join("+"),
        (None, Some(tail)) => format!("{}+chain of {}", plan.nodes()[i].op_type, tail.len()),
        (None, None) => plan.nodes()[i].op_type.clone(),
    };
    let mut by_op: Vec<(String, usize, Duration)> = Vec::new();
    for (i, &t) in times.total.iter().enumerate() {
        if times.calls[i] == 0 {
            continue;
        }
        let op = match (fused(i), tail(i)) {
            (Some(_), _) => "fused chains".to_string(),
            (None, Some(_)) => format!("{} with tail", plan.nodes()[i].op_type),
            (None, None) => plan.nodes()[i].op_type.clone(),
        };
        match by_op.iter_mut().find(|(o, _, _)| *o == op) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 += t;
            }
            None => by_op.push((op, 1, t)),
        }
    }
    by_op.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    println!(
        "\ntime per run by op type ({:.3} ms in nodes):",
        per_run(total)
    );
    println!(
        "{:<24} {:>6} {:>10} {:>7}",
        "op type", "nodes", "ms/run", "share"
    );
    for (op, count, t) in &by_op {
        println!(
            "{op:<24} {count:>6} {:>10.3} {:>6.1}%",
            per_run(*t),
            share(*t)
        );
    }
    let mut nodes: Vec<usize> = (0..plan.nodes().len()).collect();
    nodes.sort_by(|&a, &b| times.total[b].cmp(&times.total[a]).then(a.cmp(&b)));
    println!("\nslowest nodes:");
    println!(
        "{:<40} {:<16} {:>10} {:>7}",
        "node", "op type", "ms/run", "share"
    );
    for &i in nodes.iter().filter(|&&i| times.calls[i] > 0).take(slowest) {
        let node = &plan.nodes()[i];
        println!(
            "{:<40} {:<16} {:>10.3} {:>6.1}%",
            node.name,
            label(i),
            per_run(times.total[i]),
            share(times.total[i])
        );
    }
}

fn specs_name<'a>(specs: &'a [InputSpec], name: &str) -> &'a str {
    specs
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.name.as_str())
        .unwrap_or("")
}
