//! `hmct-debugger report RESULT_DIR [-o FILE]`: one self-contained HTML page over a
//! runall result folder (`hmct_debug::report`). runall writes the same page as
//! `report.html`; this command re-renders it, e.g. after a newer tool version.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use hmct_debug::layout::{REPORT_NAME, SUMMARY_NAME};
use hmct_debug::report::render_report;

use crate::common::usage;

/// Arguments of `report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A folder written by runall (it holds summary.json).
    pub result_dir: PathBuf,
    /// The page to write (default: RESULT_DIR/report.html).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    if !args.result_dir.join(SUMMARY_NAME).is_file() {
        return Err(usage(format!(
            "{} is not a runall result folder (no {SUMMARY_NAME})",
            args.result_dir.display()
        )));
    }
    let html = render_report(&args.result_dir)?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| args.result_dir.join(REPORT_NAME));
    hmct_ir::write_atomic(&path, html.as_bytes())?;
    writeln!(
        out,
        "wrote {} ({} KB)",
        path.display(),
        html.len().div_ceil(1024)
    )?;
    Ok(())
}
