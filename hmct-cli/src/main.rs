//! `hmct-debugger`: the command-line front end. One module per sub-command; this
//! file only parses arguments, dispatches, and turns errors into one line and an
//! exit status (1 for failures; clap exits with 2 for usage errors).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod summary;

#[derive(Debug, Parser)]
#[command(
    name = "hmct-debugger",
    version,
    about = "Accuracy debugging for quantized ONNX models with HzCalibration nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Model facts and a table of the calibration nodes.
    Summary(summary::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match &cli.command {
        Command::Summary(args) => summary::run(args, &mut out),
    };
    let result = result.and_then(|()| out.flush().map_err(anyhow::Error::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`| head`) is not a failure of ours.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let message = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
