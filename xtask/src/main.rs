//! Developer tasks: `cargo xtask <task>` (see `cargo xtask --help`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Large buffers on cache lines, as in `hmct-debugger` (see `hmct_quant::alloc`).
#[global_allocator]
static ALLOC: hmct_quant::CacheLineAlloc = hmct_quant::CacheLineAlloc;

mod bench_ort;
mod example;
mod peak;
mod sens_bench;
mod zoo;

#[derive(Parser)]
#[command(name = "xtask", about = "hmct-rs developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Regenerate the bundled example (examples/tiny_cnn) with our own tools.
    Example(example::Args),
    /// Time our interpreter against onnxruntime on the same models and inputs.
    BenchOrt {
        /// Models to time (default: every model of ../shared/models).
        models: Vec<PathBuf>,
        /// Time the models of the zoo (`cargo xtask zoo`) instead.
        #[arg(long, conflicts_with = "models")]
        zoo: bool,
        /// Timed runs per side.
        #[arg(long, default_value_t = 15)]
        runs: usize,
        /// Thread counts to compare at.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Measure each model this many times, each with a fresh session and
        /// onnxruntime process, and print the median ratio with its range (on a
        /// shared machine a single measurement's ratio moves by 0.1-0.3).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Time get-sensitivity-of-nodes against the onnxruntime way on the same model,
    /// data and threads; check the rankings agree.
    SensitivityBench(sens_bench::Args),
    /// Measure the per-core arithmetic peak (f32 FMA with AVX-512 and AVX2, AVX512_BF16,
    /// AMX-BF16 where present) and cache the f32 figure for bench-ort.
    Peak {
        /// Thread counts to measure at.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
    },
    /// Rebuild the benchmark zoo in target/zoo from package registries and calibrate
    /// it with our `calibrate`.
    Zoo(zoo::Args),
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_path_buf()
}

/// Builds `hmct-debugger` in release mode and returns its path.
fn release_cli(root: &Path) -> Result<PathBuf> {
    eprintln!("building hmct-debugger (release)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-q", "-p", "hmct-cli"])
        .output()
        .context("starting cargo build")?;
    if !out.status.success() {
        anyhow::bail!(
            "cargo build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(root.join("target/release/hmct-debugger"))
}

fn shared_models(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("../shared/models");
    let mut models = Vec::new();
    let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
    // Each model has a folder; files beside them (README.md) are not models.
    for e in entries.flatten().filter(|e| e.path().is_dir()) {
        if let Some(m) = std::fs::read_dir(e.path())?
            .flatten()
            .map(|f| f.path())
            .find(|p| p.extension().is_some_and(|x| x == "onnx"))
        {
            models.push(m);
        }
    }
    models.sort();
    Ok(models)
}

/// The float models of the zoo that our interpreter runs; prints the others with
/// the reason.
fn zoo_models(root: &Path) -> Result<Vec<PathBuf>> {
    let mut models = Vec::new();
    for e in zoo::entries(root)? {
        match &e.state {
            Ok(()) => models.push(e.model()),
            Err(why) => println!("{}: skipped, {why}", e.name),
        }
    }
    Ok(models)
}

fn main() -> Result<()> {
    let root = repo_root();
    match Cli::parse().task {
        Task::Example(args) => example::run(&args),
        Task::SensitivityBench(args) => sens_bench::run(&root, &args),
        Task::Peak { threads } => peak::run(&root, &threads),
        Task::Zoo(args) => zoo::run(&root, &args),
        Task::BenchOrt {
            models,
            zoo,
            runs,
            threads,
            repeat,
        } => {
            let models = if zoo {
                zoo_models(&root)?
            } else if models.is_empty() {
                shared_models(&root)?
            } else {
                models
            };
            bench_ort::run(
                &root,
                &bench_ort::Options {
                    models,
                    runs,
                    threads,
                    repeat,
                },
            )
        }
    }
}
