//! `hmct-debugger get-sensitivity-of-nodes MODEL DATA`: rank nodes by how much
//! quantizing each alone degrades the outputs (DEBUGGER.md §3).
//!
//! Prints the table with `-v True` (warnings about degenerate samples under it);
//! `-s DIR` writes it to `DIR/sensitivity_of_<node_type>.log`, `--json FILE` writes
//! the ordered result. `--exclude-samples` ranks without some samples; `--shard I/N`
//! runs one part of the candidates into a part file (`--json`), which `merge` puts
//! back together.
//! Argument mistakes (unknown names, metrics or node type, an `-o` node that is not
//! quantized, a `data_num` beyond the data, a model without calibration nodes) exit
//! with status 2 and one line before anything is written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::parse_bool;
use hmct_debug::engine::Engine;
use hmct_debug::sensitivity::{
    NodeType, Sensitivity, SensitivityOptions, get_sensitivity_of_nodes, parse_metrics,
};

use crate::common::{self, flat, list, usage};

/// Arguments of `get-sensitivity-of-nodes`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Metric or list of metrics (cosine-similarity, mse, mre, sqnr, chebyshev);
    /// the result is sorted by the first. E.g. "['cosine-similarity','mse']".
    #[arg(short = 'm', long = "metrics", default_value = "cosine-similarity")]
    pub metrics: String,
    /// node (quantized regular nodes), weight or activation (calibration nodes).
    #[arg(
        short = 'n',
        long = "node_type",
        visible_alias = "node-type",
        default_value = "node"
    )]
    pub node_type: String,
    /// Compare on this regular node's outputs (or a list of nodes) instead of the
    /// model outputs; each must be quantized.
    #[arg(short = 'o', long = "output_node", visible_alias = "output-node")]
    pub output_node: Option<String>,
    /// Use the first N samples (default: all).
    #[arg(short = 'd', long = "data_num", visible_alias = "data-num")]
    pub data_num: Option<usize>,
    /// Print the table (True/False; a bare -v means True).
    #[arg(short = 'v', long = "verbose", num_args = 0..=1, default_missing_value = "True", value_name = "BOOL")]
    pub verbose: Option<String>,
    /// Only these nodes (overrides -n); a nested list quantizes each sub-list
    /// together, reported as a+b. E.g. "['Conv_2',['Conv_4','Conv_9']]".
    #[arg(
        short = 'i',
        long = "interested_nodes",
        visible_alias = "interested-nodes"
    )]
    pub interested_nodes: Option<String>,
    /// Write the table to DIR/sensitivity_of_<node_type>.log.
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        value_name = "DIR"
    )]
    pub save_dir: Option<PathBuf>,
    /// Write the ordered result as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Rank without these samples (numbered from 0), e.g. "7" or "[6,7]"; they are
    /// still run, and their per-sample figures kept.
    #[arg(
        long = "exclude-samples",
        visible_alias = "exclude_samples",
        value_name = "LIST"
    )]
    pub exclude_samples: Option<String>,
    /// Run part I of N of the candidates (1-based), balanced by estimated cost, into
    /// the part file given by --json; `merge` puts the parts together.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Worker threads (0 = all cores). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Memory for cached float activations in MB (default: half the available
    /// memory). Samples beyond it are recomputed; results do not depend on it.
    #[arg(long = "cache-mb", visible_alias = "cache_mb", value_name = "MB")]
    pub cache_mb: Option<usize>,
    /// Print where the time went (float pass, probes, metrics) on stderr.
    #[arg(long)]
    pub timings: bool,
}

/// The checked arguments.
struct Parsed {
    options: SensitivityOptions,
    verbose: bool,
}

fn parse(args: &Args) -> Result<Parsed> {
    let metrics = parse_metrics(&flat("--metrics", &args.metrics)?).map_err(usage)?;
    let node_type: NodeType = args.node_type.parse().map_err(usage)?;
    let output_nodes = match &args.output_node {
        Some(v) => flat("--output_node", v)?,
        None => Vec::new(),
    };
    let interested_nodes = match &args.interested_nodes {
        Some(v) => Some(list("--interested_nodes", v)?.into_groups()),
        None => None,
    };
    if interested_nodes.as_ref().is_some_and(Vec::is_empty) {
        return Err(usage("--interested_nodes: the list is empty"));
    }
    let verbose = match &args.verbose {
        Some(v) => parse_bool(v).map_err(|e| usage(format!("--verbose: {e}")))?,
        None => false,
    };
    if args.data_num == Some(0) {
        return Err(usage("data_num must be at least 1"));
    }
    let exclude_samples = match &args.exclude_samples {
        Some(v) => common::sample_list("--exclude-samples", v)?,
        None => Vec::new(),
    };
    let shard = common::shard_arg(
        args.shard.as_deref(),
        args.json.is_some(),
        args.save_dir.is_some(),
    )?;
    Ok(Parsed {
        options: SensitivityOptions {
            node_type,
            metrics,
            output_nodes,
            data_num: args.data_num,
            interested_nodes,
            exclude_samples,
            shard,
        },
        verbose,
    })
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let parsed = parse(args)?;
    let engine = common::open_engine(&args.input, args.threads, args.cache_mb)?;

    let bar = common::progress_bar("probing {bar:30} {pos}/{len} runs ({elapsed}, eta {eta})");
    let progress = |_done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = get_sensitivity_of_nodes(&engine, &parsed.options, &progress);
    bar.finish_and_clear();
    let result = result?;

    let table = result.render();
    if parsed.verbose {
        out.write_all(table.as_bytes())
            .context("writing to stdout")?;
    }
    if let Some(dir) = &args.save_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create folder", dir.display()))?;
        let path = dir.join(format!("sensitivity_of_{}.log", parsed.options.node_type));
        hmct_ir::write_atomic(&path, table.as_bytes())?;
    }
    if let Some(path) = &args.json {
        crate::common::write_json(path, &result)?;
    }
    if !parsed.verbose && args.save_dir.is_none() && args.json.is_none() {
        eprintln!(
            "note: nothing to show; pass -v True to print the table, -s DIR or --json FILE to save it"
        );
    }
    if args.timings {
        print_timings(&result, &engine);
    }
    Ok(())
}

fn print_timings(result: &Sensitivity, engine: &Engine) {
    let t = &result.timings;
    let secs = |d: std::time::Duration| d.as_secs_f64();
    // Runs and metrics are summed over tasks running in parallel; their share of
    // the wall time is what they cost.
    let busy = secs(t.probe_runs + t.reduce).max(1e-12);
    let wall = secs(t.probes);
    eprintln!(
        "timings: float pass {:.3} s ({} full runs); probes {:.3} s wall for {} runs on {} thread(s), of which runs {:.3} s and metrics {:.3} s; {} MB cached",
        secs(t.capture),
        t.captures,
        wall,
        t.tasks,
        engine.threads(),
        wall * secs(t.probe_runs) / busy,
        wall * secs(t.reduce) / busy,
        engine.cached_bytes() >> 20,
    );
}
