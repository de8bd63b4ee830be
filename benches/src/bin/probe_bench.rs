//! The probe workload of `get-sensitivity-of-nodes --node_type node` on the
//! interpreter alone (no hmct-debug), for profiling kernels and the scheduler:
//! `probe_bench MODEL DATA [-d N] [--threads T] [--every K]`. Every K-th candidate
//! node is probed (K = 1: all of them). Prints the time split and a checksum of the
//! cosine similarities, which must not change when kernels are optimized.

use std::path::PathBuf;
use std::time::Instant;

use hmct_quant::{Capture, Config, Override, Session, Values, plan_model};
use hmct_tensor::{Dataset, Tensor};
use rayon::prelude::*;

/// Large buffers on cache lines, as in `hmct-debugger` (see `hmct_quant::alloc`).
#[global_allocator]
static ALLOC: hmct_quant::CacheLineAlloc = hmct_quant::CacheLineAlloc;

fn cosine(x: &Tensor, y: &Tensor) -> f64 {
    let (x, y) = (x.as_f32().expect("f32"), y.as_f32().expect("f32"));
    let (mut xy, mut xx, mut yy) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in x.iter().zip(y.iter()) {
        let (a, b) = (a as f64, b as f64);
        xy += a * b;
        xx += a * a;
        yy += b * b;
    }
    xy / (xx.sqrt() * yy.sqrt()).max(f64::MIN_POSITIVE)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse::<usize>())
            .transpose()
    };
    let positional: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with('-') && (*i == 0 || !args[i - 1].starts_with('-')))
        .map(|(_, a)| a)
        .collect();
    let [model_path, data_dir] = positional[..] else {
        return Err("usage: probe_bench MODEL DATA [-d N] [--threads T] [--every K]".into());
    };
    let samples = flag("-d")?.unwrap_or(1);
    let threads = flag("--threads")?.unwrap_or(1);
    let every = flag("--every")?.unwrap_or(1).max(1);

    let model = hmct_ir::load_model(PathBuf::from(model_path))?;
    let plan = plan_model(&model)?;
    let specs = plan.input_specs();
    let data = Dataset::open(&PathBuf::from(data_dir), &specs)?;
    let session = Session::new(plan, threads)?;
    let plan = session.plan();

    // Candidates: regular nodes reading a calibration node's output.
    let cal_of_slot: std::collections::HashMap<usize, usize> = plan
        .calibrations()
        .iter()
        .enumerate()
        .map(|(i, c)| (c.output, i))
        .collect();
    let cal_nodes: std::collections::HashSet<usize> =
        plan.calibrations().iter().map(|c| c.node).collect();
    let mut probes: Vec<Vec<usize>> = Vec::new();
    for (idx, node) in plan.nodes().iter().enumerate() {
        let mut cals: Vec<usize> = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|s| cal_of_slot.get(s).copied())
            .collect();
        if cals.is_empty() || cal_nodes.contains(&idx) {
            continue;
        }
        cals.sort_unstable();
        cals.dedup();
        if !probes.contains(&cals) {
            probes.push(cals);
        }
    }
    let probes: Vec<Vec<usize>> = probes.into_iter().step_by(every).collect();
    let configs: Vec<Config> = probes
        .iter()
        .map(|cals| {
            cals.iter()
                .fold(Config::float(), |c, &i| c.with(i, Override::On))
        })
        .collect();
    let all_slots: Vec<usize> = plan
        .nodes()
        .iter()
        .flat_map(|n| n.outputs.iter().copied())
        .collect();
    let outputs = plan.outputs().to_vec();

    let t0 = Instant::now();
    let mut captures = Vec::new();
    for s in 0..samples {
        let inputs = data.sample(s)?;
        let refs: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = session.bind_inputs(&refs)?;
        captures.push(session.run_from(
            &bound,
            None,
            &Config::float(),
            &all_slots,
            Capture::All,
        )?);
    }
    let capture_time = t0.elapsed();
    let float = Config::float();
    // One task per probe, its samples run together as the engine runs them.
    let t1 = Instant::now();
    let sims: Vec<f64> = session.install(|| {
        (0..probes.len())
            .into_par_iter()
            .flat_map_iter(|p| {
                let knowns: Vec<&Values> = captures.iter().collect();
                let runs = session
                    .run_many_from(
                        &knowns,
                        Some(&float),
                        &configs[p],
                        &outputs,
                        Capture::Wanted,
                    )
                    .expect("probe runs");
                runs.into_iter()
                    .zip(&captures)
                    .map(|(v, capture)| {
                        outputs
                            .iter()
                            .map(|&o| {
                                cosine(
                                    &session.value(capture, o).expect("float value"),
                                    &session.value(&v, o).expect("probe value"),
                                )
                            })
                            .sum::<f64>()
                    })
                    .collect::<Vec<f64>>()
            })
            .collect()
    });
    let probe_time = t1.elapsed();
    let checksum: f64 = sims
        .iter()
        .enumerate()
        .map(|(i, v)| v * (i + 1) as f64)
        .sum();
    println!(
        "probes {} x samples {} on {} thread(s): capture {:.2} s, probes {:.2} s ({:.1} ms/task), checksum {:.17e}",
        probes.len(),
        samples,
        session.threads(),
        capture_time.as_secs_f64(),
        probe_time.as_secs_f64(),
        probe_time.as_secs_f64() * 1e3 / sims.len().max(1) as f64,
        checksum
    );
    Ok(())
}
