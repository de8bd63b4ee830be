//! Pieces every analysis sub-command shares: usage errors, list flags, opening the
//! engine with its cache budget, the save folder, the progress bar.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hmct_cli::listarg::{ListArg, parse_list};
use hmct_debug::acc_error::NodeList;
use hmct_debug::engine::{Engine, EngineOptions};
use hmct_plot::Format;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::UsageError;

/// The model and data an analysis runs on (the first two arguments).
#[derive(Debug, clap::Args)]
pub struct ModelData {
    /// The calibrated ONNX model.
    pub model: PathBuf,
    /// Calibration-data folder: one sub-folder per model input with 0.npy, 1.npy, ...
    pub data: PathBuf,
}

/// How an analysis' engine runs: worker threads and the activation cache.
#[derive(Debug, clap::Args)]
pub struct EngineArgs {
    /// Worker threads (0 = all cores). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Memory for cached activations in MB (default: half the available memory).
    #[arg(long = "cache-mb", visible_alias = "cache_mb", value_name = "MB")]
    pub cache_mb: Option<usize>,
}

/// Worker threads, for the commands that keep no activation cache.
#[derive(Debug, clap::Args)]
pub struct Threads {
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// A mistake in the arguments: one line, exit status 2.
pub(crate) fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    UsageError(e.to_string()).into()
}

/// A list flag in the seeds' syntax.
pub(crate) fn list(flag: &str, value: &str) -> Result<ListArg> {
    parse_list(value).map_err(|e| usage(format!("{flag}: {e}")))
}

/// A list flag that must not be nested.
pub(crate) fn flat(flag: &str, value: &str) -> Result<Vec<String>> {
    match list(flag, value)? {
        ListArg::Flat(names) => Ok(names),
        ListArg::Nested(_) => Err(usage(format!("{flag} takes a flat list, got `{value}`"))),
    }
}

/// A list of sample numbers: `7`, `6,7` or `[6,7]`.
pub(crate) fn sample_list(flag: &str, value: &str) -> Result<Vec<usize>> {
    // `6,7` is the natural spelling on a command line; the list parser wants brackets.
    let bracketed = if value.trim_start().starts_with('[') {
        value.to_string()
    } else {
        format!("[{value}]")
    };
    let names = flat(flag, &bracketed)?;
    names
        .iter()
        .map(|n| {
            n.trim()
                .parse::<usize>()
                .map_err(|_| usage(format!("{flag}: '{n}' is not a sample number (0, 1, ...)")))
        })
        .collect()
}

/// `--shard I/N`: a part file needs `--json`, and the whole `.log` table comes from
/// `merge`, not from a part.
pub(crate) fn shard_arg(
    value: Option<&str>,
    json: bool,
    save_dir: bool,
) -> Result<Option<hmct_debug::shard::Shard>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let shard = value.parse().map_err(usage)?;
    if !json {
        return Err(usage(
            "--shard writes a part file: give it with --json FILE",
        ));
    }
    if save_dir {
        return Err(usage(
            "--shard: -s/--save_dir writes the whole table; pass it to `merge` instead",
        ));
    }
    Ok(Some(shard))
}

/// `quantize_node` / `non_quantize_node`: flat (one curve per name) or nested.
pub(crate) fn node_list(flag: &str, value: &str) -> Result<NodeList> {
    Ok(match list(flag, value)? {
        ListArg::Flat(names) => NodeList::Flat(names),
        ListArg::Nested(groups) => NodeList::Nested(groups),
    })
}

pub(crate) fn parse_format(value: &str) -> Result<Format> {
    match value.trim().to_ascii_lowercase().as_str() {
        "png" => Ok(Format::Png),
        "svg" => Ok(Format::Svg),
        _ => Err(usage(format!("--format: '{value}' is not png or svg"))),
    }
}

/// Writes `value` to `path` as the analyses write their JSON, atomically.
pub(crate) fn write_json<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    hmct_ir::write_atomic(path, &hmct_debug::json::pretty(value)?)?;
    Ok(())
}

/// Loads the model and opens the engine on the data, caching activations within
/// `cache_mb` (default: half the available memory).
pub(crate) fn open_engine(
    input: &ModelData,
    threads: usize,
    cache_mb: Option<usize>,
) -> Result<Engine> {
    let (model, data) = (input.model.as_path(), input.data.as_path());
    let loaded = hmct_ir::load_model(model)?;
    let cache_bytes = cache_mb
        .unwrap_or_else(EngineOptions::default_cache_mb)
        .saturating_mul(1 << 20);
    let engine = Engine::new(
        loaded,
        data,
        &EngineOptions {
            threads,
            cache_bytes: Some(cache_bytes),
        },
    );
    match engine {
        // Data errors name the folder or file at fault already.
        Err(e @ hmct_debug::engine::EngineError::Data(_)) => Err(e.into()),
        other => other.with_context(|| format!("{}", model.display())),
    }
}

/// A progress bar on stderr with this indicatif template, hidden when stderr is not
/// a terminal (so logs and tests see no bar).
pub(crate) fn progress_bar(template: &str) -> ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
        .with_style(ProgressStyle::with_template(template).expect("a valid template"))
}

/// The save folder, created if missing and checked for writing; `discard` removes it
/// again if this run created it and left it empty.
pub(crate) struct OutputFolder {
    path: PathBuf,
    created: bool,
}

impl OutputFolder {
    pub(crate) fn prepare(path: &Path) -> Result<OutputFolder> {
        let created = !path.exists();
        std::fs::create_dir_all(path)
            .with_context(|| format!("{}: cannot create folder", path.display()))?;
        let folder = OutputFolder {
            path: path.to_path_buf(),
            created,
        };
        if let Err(e) = tempfile::NamedTempFile::new_in(path) {
            folder.discard();
            return Err(anyhow::anyhow!(
                "{}: cannot write here: {e}",
                path.display()
            ));
        }
        Ok(folder)
    }

    pub(crate) fn discard(&self) {
        if self.created {
            // Only an empty folder goes: remove_dir refuses anything else.
            let _ = std::fs::remove_dir(&self.path);
        }
    }

    /// Writes an analysis' figures with `write_figures`, then `result` as JSON to
    /// `json` if given, all or nothing: when the JSON cannot be written the figures
    /// just written are removed again, and when either fails the folder goes too if
    /// this command created it.
    pub(crate) fn write_figures_and_json<T, E>(
        &self,
        json: Option<&Path>,
        result: &T,
        write_figures: impl FnOnce() -> std::result::Result<Vec<PathBuf>, E>,
    ) -> Result<Vec<PathBuf>>
    where
        T: serde::Serialize,
        E: Into<anyhow::Error>,
    {
        let json_bytes = match json {
            Some(_) => Some(hmct_debug::json::pretty(result)?),
            None => None,
        };
        let written = write_figures().map_err(|e| {
            self.discard();
            e.into()
        })?;
        if let (Some(path), Some(bytes)) = (json, json_bytes)
            && let Err(e) = hmct_ir::write_atomic(path, &bytes)
        {
            for figure in &written {
                let _ = std::fs::remove_file(figure);
            }
            self.discard();
            return Err(e.into());
        }
        Ok(written)
    }
}
