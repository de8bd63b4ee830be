//! `report`: one self-contained HTML page over a runall result folder.

use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args, _out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::bail!("report is not built yet")
}
