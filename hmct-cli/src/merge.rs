//! `hmct-debugger merge PART.json...`: the parts written by `--shard I/N` runs of
//! `get-sensitivity-of-nodes` or `precision-table`, put back together into exactly
//! the unsharded result (same entries, order and values; the same `.log` table
//! under `-s`). Parts of different models, data, options or commands, and a missing
//! or duplicated shard, are refused in one line with status 2 before anything is
//! written.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hmct_cli::listarg::parse_bool;
use hmct_debug::precision_table::{PrecisionTable, merge_precision_table};
use hmct_debug::sensitivity::{Sensitivity, merge_sensitivity};

use crate::common::{OutputFolder, usage};

/// Arguments of `merge`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The part files (`--json` of each `--shard I/N` run), in any order.
    #[arg(required = true, value_name = "PART.json")]
    pub parts: Vec<PathBuf>,
    /// Write the merged result as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print the table (True/False; a bare -v means True).
    #[arg(short = 'v', long = "verbose", num_args = 0..=1, default_missing_value = "True", value_name = "BOOL")]
    pub verbose: Option<String>,
    /// Write the table to DIR (sensitivity_of_<node_type>.log, as the unsharded
    /// command does, or precision_table.log).
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        value_name = "DIR"
    )]
    pub save_dir: Option<PathBuf>,
}

/// The parts, all of one command.
enum Parts {
    Sensitivity(Vec<(String, Sensitivity)>),
    PrecisionTable(Vec<(String, PrecisionTable)>),
}

fn label(path: &Path) -> String {
    path.display().to_string()
}

fn read_parts(paths: &[PathBuf]) -> Result<Parts> {
    let mut sensitivity = Vec::new();
    let mut precision = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("{}: cannot read: {e}", path.display())))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| usage(format!("{}: not JSON: {e}", path.display())))?;
        let not_a_part = || {
            usage(format!(
                "{}: not a part of get-sensitivity-of-nodes or precision-table",
                path.display()
            ))
        };
        let is_sensitivity = value.get("entries").is_some();
        let is_precision = value.get("rows").is_some();
        if is_sensitivity == is_precision {
            return Err(not_a_part());
        }
        // Read from the text, not from `value`: serde_json's exact float parsing
        // applies to text, so the merged figures are the parts' bits.
        if is_sensitivity {
            let part: Sensitivity = serde_json::from_str(&text)
                .map_err(|e| usage(format!("{}: {e}", path.display())))?;
            sensitivity.push((label(path), part));
        } else {
            let part: PrecisionTable = serde_json::from_str(&text)
                .map_err(|e| usage(format!("{}: {e}", path.display())))?;
            precision.push((label(path), part));
        }
    }
    match (sensitivity.is_empty(), precision.is_empty()) {
        (false, true) => Ok(Parts::Sensitivity(sensitivity)),
        (true, false) => Ok(Parts::PrecisionTable(precision)),
        _ => Err(usage(format!(
            "parts of different commands: {} is a get-sensitivity-of-nodes part, {} a precision-table part",
            sensitivity[0].0, precision[0].0
        ))),
    }
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let verbose = match &args.verbose {
        Some(v) => parse_bool(v).map_err(|e| usage(format!("--verbose: {e}")))?,
        None => false,
    };
    match read_parts(&args.parts)? {
        Parts::Sensitivity(parts) => {
            let whole = merge_sensitivity(parts).map_err(usage)?;
            let log = format!("sensitivity_of_{}.log", whole.node_type);
            finish(args, verbose, out, &whole, whole.render(), &log)
        }
        Parts::PrecisionTable(parts) => {
            let whole = merge_precision_table(parts).map_err(usage)?;
            let mut table = Vec::new();
            crate::precision_table::print_table(&whole, &mut table)?;
            let table = String::from_utf8(table).expect("tables are text");
            finish(args, verbose, out, &whole, table, "precision_table.log")
        }
    }
}

/// Prints and writes the merged result: the `.log` table and the JSON, both or
/// neither.
fn finish<T: serde::Serialize>(
    args: &Args,
    verbose: bool,
    out: &mut dyn Write,
    whole: &T,
    table: String,
    log_name: &str,
) -> Result<()> {
    if let Some(dir) = &args.save_dir {
        let folder = OutputFolder::prepare(dir)?;
        folder.write_figures_and_json(args.json.as_deref(), whole, || {
            let log = dir.join(log_name);
            hmct_ir::write_atomic(&log, table.as_bytes()).map(|()| vec![log])
        })?;
    } else if let Some(path) = &args.json {
        crate::common::write_json(path, whole)?;
    }
    if verbose {
        out.write_all(table.as_bytes())
            .context("writing to stdout")?;
    }
    if !verbose && args.save_dir.is_none() && args.json.is_none() {
        eprintln!(
            "note: nothing to show; pass -v True to print the table, -s DIR or --json FILE to save it"
        );
    }
    Ok(())
}
