//! One self-contained HTML page over a runall result folder: the model and the run
//! that produced it, the health findings, sortable sensitivity tables, the
//! accumulated-error and partial-quantization charts (re-drawn as inline SVG from
//! their JSON), and a detail block per sensitive calibration node with the figures
//! runall drew for it.
//!
//! Everything comes from `summary.json` and the files it indexes; nothing is fetched
//! from elsewhere (no script, style sheet or font links), so the page can be mailed
//! or archived alone. Every string from the folder is HTML-escaped: node names can
//! hold `<` or `&`. An indexed file that is missing or unreadable becomes a note in
//! its section, not a failure: the rest of the page is still worth reading.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hmct_plot::{Figure, Format, LineChart, LineKind, LineSeries, Rgb};
use serde::{Deserialize, Serialize};

use crate::acc_error::{Curve, FigureFile};
use crate::distribution::file_safe;
use crate::layout::{
    ACC_ERROR_DIR, ANALYSIS_DIR, CHANNELWISE_DIR, DISTRIBUTION_DIR, RunallSummary, SENSITIVITY_DIR,
    SUMMARY_NAME,
};
use crate::sensitivity::{NodeType, Sensitivity};
use crate::sensitivity_analysis::SensitivityAnalysis;

/// Per-node detail is given for at most this many calibration nodes.
pub const TOP_DETAIL: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {message}", path.display())]
    Summary { path: PathBuf, message: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Health {
    samples: usize,
    warnings: usize,
    infos: usize,
    findings: Vec<Finding>,
    calibrations: Vec<Calibration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Finding {
    severity: String,
    check: String,
    node: String,
    message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Calibration {
    node: String,
    tensor_type: String,
    qtype: String,
    per_channel: bool,
    thresholds: usize,
    threshold_min: Option<f64>,
    threshold_max: Option<f64>,
    consumers: String,
    max_abs: Option<f64>,
}

/// Builds the page for the runall result folder `result_dir`.
pub fn render_report(result_dir: &Path) -> Result<String, ReportError> {
    let summary_path = result_dir.join(SUMMARY_NAME);
    let summary: RunallSummary =
        read_json(&summary_path).map_err(|message| ReportError::Summary {
            path: summary_path.clone(),
            message,
        })?;
    let mut page = Page::new(result_dir);
    let files: Vec<&str> = summary
        .steps
        .iter()
        .flat_map(|s| s.files.iter().map(String::as_str))
        .collect();

    let health = summary
        .health
        .as_ref()
        .map(|h| read_json::<Health>(&result_dir.join(&h.file)).map_err(|e| (h.file.clone(), e)));
    let rankings: Vec<(String, Result<Sensitivity, String>)> = files
        .iter()
        .filter(|f| f.starts_with(SENSITIVITY_DIR) && f.ends_with(".json"))
        .map(|f| (f.to_string(), read_json::<Sensitivity>(&result_dir.join(f))))
        .collect();

    page.head(&summary);
    page.overview(&summary, health.as_ref().and_then(|h| h.as_ref().ok()));
    page.health(health.as_ref());
    page.rankings(&rankings);
    page.acc_error(&files);
    page.partial(&files);
    let ok_rankings: Vec<&Sensitivity> = rankings
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    page.details(
        &summary,
        &files,
        &ok_rankings,
        health.as_ref().and_then(|h| h.as_ref().ok()),
    );
    page.out.push_str(SORT_SCRIPT);
    page.out.push_str("</body>\n</html>\n");
    Ok(page.out)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// An activation's threshold as the page has always shown it: the f32's shortest
/// decimal, as the ranking's JSON spells it, read back as f64 (widening the f32
/// itself would change the table's digits and its sort keys).
fn threshold_as_written(t: f32) -> f64 {
    serde_json::to_string(&t)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(f64::NAN)
}

/// The name serde gives a unit variant (the files' spelling of an enum).
fn serde_name(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Six significant digits, or the name of a non-finite value.
fn fmt(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-4) {
        format!("{v:.5e}")
    } else {
        let s = format!("{v:.6}");
        // Sensitivities sit near 1: keep the digits that tell them apart.
        if v.abs() < 10.0 { s } else { format!("{v:.4}") }
    }
}

fn opt_fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), fmt)
}

/// A table cell holding a number, with the exact value for sorting.
fn num_cell(v: f64) -> String {
    let key = if v.is_finite() {
        format!("{v:e}")
    } else {
        String::new()
    };
    format!("<td class=\"n\" data-v=\"{key}\">{}</td>", fmt(v))
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

struct Page<'a> {
    dir: &'a Path,
    out: String,
    /// Inline SVGs so far: each gets its own id prefix, since every figure numbers
    /// its glyph definitions from the start.
    figures: usize,
}

impl<'a> Page<'a> {
    fn new(dir: &'a Path) -> Page<'a> {
        Page {
            dir,
            out: String::new(),
            figures: 0,
        }
    }

    fn w(&mut self, s: &str) {
        self.out.push_str(s);
    }

    fn note(&mut self, text: &str) {
        let _ = writeln!(self.out, "<p class=\"note\">{}</p>", escape(text));
    }

    fn head(&mut self, summary: &RunallSummary) {
        let model = Path::new(&summary.model)
            .file_name()
            .map_or(summary.model.clone(), |n| n.to_string_lossy().into_owned());
        let _ = write!(
            self.out,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>hmct-debugger report: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
             <h1>Accuracy debug report: {}</h1>\n",
            escape(&model),
            escape(&model)
        );
        self.w(
            "<nav><a href=\"#overview\">Overview</a> <a href=\"#health\">Health</a> \
             <a href=\"#sensitivity\">Sensitivity</a> <a href=\"#acc-error\">Accumulated error</a> \
             <a href=\"#partial\">Partial quantization</a> <a href=\"#details\">Node details</a></nav>\n",
        );
    }

    fn overview(&mut self, summary: &RunallSummary, health: Option<&Health>) {
        self.w("<section id=\"overview\"><h2>Overview</h2>\n<table class=\"kv\">\n");
        let mut row = |k: &str, v: String| {
            let _ = writeln!(self.out, "<tr><th>{k}</th><td>{v}</td></tr>");
        };
        row("model", format!("<code>{}</code>", escape(&summary.model)));
        row("samples in the data", summary.samples.to_string());
        if let Some(h) = health {
            let weights = h
                .calibrations
                .iter()
                .filter(|c| c.tensor_type == "weight")
                .count();
            let mut qtypes: BTreeMap<&str, usize> = BTreeMap::new();
            for c in &h.calibrations {
                *qtypes.entry(c.qtype.as_str()).or_default() += 1;
            }
            let qtypes: Vec<String> = qtypes
                .iter()
                .map(|(q, n)| format!("{} {}", n, escape(q)))
                .collect();
            row(
                "calibration nodes",
                format!(
                    "{} ({} activation, {} weight; {})",
                    h.calibrations.len(),
                    h.calibrations.len() - weights,
                    weights,
                    qtypes.join(", ")
                ),
            );
        }
        if let (Some(c), Some(f)) = (summary.calibrated_metric, summary.float_metric) {
            row(
                "model outputs vs float",
                format!("cosine-similarity {} (float model {})", fmt(c), fmt(f)),
            );
        }
        if !summary.sensitive_nodes.is_empty() {
            let names: Vec<String> = summary
                .sensitive_nodes
                .iter()
                .map(|n| format!("<code>{}</code>", escape(n)))
                .collect();
            row("sensitive nodes", names.join(", "));
        }
        row("tool", escape(&summary.tool));
        let command = match &summary.command {
            Some(args) => format!("<code class=\"cmd\">{}</code>", escape(&shell_words(args))),
            None => "not recorded".to_string(),
        };
        row("command", command);
        row("total time", format!("{:.1} s", summary.seconds));
        self.w("</table>\n<table><thead><tr><th>step</th><th>time (s)</th><th>files</th></tr></thead><tbody>\n");
        for step in &summary.steps {
            let _ = writeln!(
                self.out,
                "<tr><td>{}</td><td class=\"n\">{:.2}</td><td class=\"n\">{}</td></tr>",
                escape(&step.name),
                step.seconds,
                step.files.len()
            );
        }
        self.w("</tbody></table>\n</section>\n");
    }

    fn health(&mut self, health: Option<&Result<Health, (String, String)>>) {
        self.w("<section id=\"health\"><h2>Health checks</h2>\n");
        let h = match health {
            None => {
                return self.end_with_note(
                    "This folder has no health checks (written by an older runall).",
                );
            }
            Some(Err((file, e))) => return self.end_with_note(&format!("{file}: {e}")),
            Some(Ok(h)) => h,
        };
        let _ = writeln!(
            self.out,
            "<p>{} warning(s), {} note(s) over {} sample(s).</p>",
            h.warnings, h.infos, h.samples
        );
        if h.findings.is_empty() {
            self.w("<p class=\"ok\">Nothing found: thresholds match the data, no NaN/inf, every activation is reached.</p>\n");
        } else {
            self.w("<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>severity</th><th>check</th><th>node</th><th>finding</th></tr></thead><tbody>\n");
            for f in &h.findings {
                let _ = writeln!(
                    self.out,
                    "<tr class=\"{}\"><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                    escape(&f.severity),
                    escape(&f.severity),
                    escape(&f.check),
                    escape(&f.node),
                    escape(&f.message)
                );
            }
            self.w("</tbody></table></div>\n");
        }
        self.w("</section>\n");
    }

    fn end_with_note(&mut self, text: &str) {
        self.note(text);
        self.w("</section>\n");
    }

    fn rankings(&mut self, rankings: &[(String, Result<Sensitivity, String>)]) {
        self.w("<section id=\"sensitivity\"><h2>Node sensitivity</h2>\n");
        if rankings.is_empty() {
            self.note("No sensitivity ranking in this folder.");
        }
        self.w("<p>Each candidate alone is quantized in the float model and compared with it on the outputs; worst first by the first metric. Click a column to sort.</p>\n");
        for (file, ranking) in rankings {
            let r = match ranking {
                Ok(r) => r,
                Err(e) => {
                    self.note(&format!("{file}: {e}"));
                    continue;
                }
            };
            let _ = writeln!(
                self.out,
                "<h3>{} ({} candidates, {} sample(s), compared on {})</h3>",
                escape(r.node_type.name()),
                r.entries.len(),
                r.data_num,
                escape(&r.compared.join(", "))
            );
            for w in &r.warnings {
                let output = w
                    .output
                    .as_ref()
                    .map_or(String::new(), |o| format!(" of '{o}'"));
                let excluded = if w.excluded {
                    " (left out of the ranking)"
                } else {
                    ""
                };
                self.note(&format!(
                    "Degenerate sample {}{output}: {}{excluded}.",
                    w.sample, w.why
                ));
            }
            let regular = r.node_type == NodeType::Node;
            // Weight entries carry no threshold or bit: no empty columns for them.
            let limits = !regular && r.entries.iter().any(|e| e.threshold.is_some());
            self.w("<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>#</th><th>name</th>");
            if regular {
                self.w("<th>calibration nodes</th>");
            } else {
                self.w("<th>node</th>");
                if limits {
                    self.w("<th>threshold</th><th>bit</th>");
                }
            }
            for m in &r.metrics {
                let _ = write!(self.out, "<th>{}</th>", escape(m.name()));
            }
            self.w("</tr></thead><tbody>\n");
            for (i, e) in r.entries.iter().enumerate() {
                let _ = write!(
                    self.out,
                    "<tr><td class=\"n\" data-v=\"{}\">{}</td><td><a href=\"#{}\"><code>{}</code></a></td>",
                    i + 1,
                    i + 1,
                    anchor(&e.name),
                    escape(&e.name)
                );
                if regular {
                    let _ = write!(self.out, "<td>{}</td>", escape(&e.calibrations.join(", ")));
                } else {
                    let _ = write!(
                        self.out,
                        "<td>{}</td>",
                        escape(e.node.as_deref().unwrap_or(""))
                    );
                }
                if limits {
                    let threshold = e.threshold.map_or(f64::NAN, threshold_as_written);
                    self.out.push_str(&num_cell(threshold));
                    let bit = e.bit.map_or(String::new(), |b| b.to_string());
                    let _ = write!(self.out, "<td class=\"n\">{bit}</td>");
                }
                for m in &r.metrics {
                    let v = e.values.get(*m).unwrap_or(f64::NAN);
                    self.out.push_str(&num_cell(v));
                }
                self.w("</tr>\n");
            }
            self.w("</tbody></table></div>\n");
        }
        self.w("</section>\n");
    }

    fn acc_error(&mut self, files: &[&str]) {
        self.w("<section id=\"acc-error\"><h2>Accumulated error</h2>\n");
        let jsons: Vec<&&str> = files
            .iter()
            .filter(|f| f.starts_with(ACC_ERROR_DIR) && f.ends_with(".json"))
            .collect();
        if jsons.is_empty() {
            self.note("No accumulated-error curves in this folder.");
        }
        self.w("<p>The metric at the output of every quantized node (graph order), float model against the configurations below.</p>\n");
        for file in jsons {
            match read_json::<FigureFile>(&self.dir.join(file)) {
                Ok(acc) => {
                    let chart = acc_error_chart(&acc);
                    self.chart(&chart);
                }
                Err(e) => self.note(&format!("{file}: {e}")),
            }
        }
        self.w("</section>\n");
    }

    fn partial(&mut self, files: &[&str]) {
        self.w("<section id=\"partial\"><h2>Partial quantization</h2>\n");
        let Some(file) = files
            .iter()
            .find(|f| f.starts_with(ANALYSIS_DIR) && f.ends_with(".json"))
        else {
            return self.end_with_note("No sensitivity analysis in this folder.");
        };
        let p = match read_json::<SensitivityAnalysis>(&self.dir.join(file)) {
            Ok(p) => p,
            Err(e) => return self.end_with_note(&format!("{file}: {e}")),
        };
        let _ = writeln!(
            self.out,
            "<p>The sensitive nodes, most sensitive first: each alone quantized in the float model, and the calibrated model with it and every earlier one in {} ({} of the outputs vs float, {} sample(s)).</p>",
            escape(p.qtype.name()),
            escape(p.metric.name()),
            p.data_num
        );
        if p.nodes.is_empty() {
            let why = p.pick_threshold.map_or(String::new(), |t| {
                format!(" is at or below pick_threshold {t}")
            });
            return self.end_with_note(&format!(
                "No node{why}, so there is nothing to analyse: the calibrated model scores {}.",
                fmt(p.calibrated)
            ));
        }
        // The analysis' own figure, as it draws it for partial_quantization.png.
        self.chart(&p.chart());
        // "Only this node quantized" is the node's sensitivity measured again on the
        // same samples, so the sensitivity gets no column of its own.
        self.w("<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>#</th><th>node</th><th>calibration nodes</th><th>only this node quantized</th><th>cumulative de-quantization</th></tr></thead><tbody>\n");
        for (i, n) in p.nodes.iter().enumerate() {
            let _ = write!(
                self.out,
                "<tr><td class=\"n\" data-v=\"{}\">{}</td><td><code>{}</code></td><td>{}</td>",
                i + 1,
                i + 1,
                escape(&n.name),
                escape(&n.calibrations.join(", "))
            );
            for v in [n.single, n.cumulative] {
                self.out.push_str(&num_cell(v));
            }
            self.w("</tr>\n");
        }
        self.w("</tbody></table></div>\n</section>\n");
    }

    fn details(
        &mut self,
        summary: &RunallSummary,
        files: &[&str],
        rankings: &[&Sensitivity],
        health: Option<&Health>,
    ) {
        self.w("<section id=\"details\"><h2>Node details</h2>\n");
        let calibrations: HashMap<&str, &Calibration> = health
            .map(|h| {
                h.calibrations
                    .iter()
                    .map(|c| (c.node.as_str(), c))
                    .collect()
            })
            .unwrap_or_default();
        let (order, left_out) = detail_order(summary, rankings);
        let _ = writeln!(
            self.out,
            "<p>{} calibration node(s), most sensitive first (rank by rank in each ranking), with the figures runall drew for them.{}</p>",
            order.len(),
            if left_out > 0 {
                format!(
                    " Only the top {TOP_DETAIL} are detailed here; the other {left_out} are in the tables above."
                )
            } else {
                String::new()
            }
        );
        for (i, name) in order.iter().enumerate() {
            let open = if i == 0 { " open" } else { "" };
            let _ = write!(
                self.out,
                "<details id=\"{}\"{open}><summary><code>{}</code>",
                anchor(name),
                escape(name)
            );
            let mut ranks = Vec::new();
            for r in rankings {
                if let Some((k, e)) = r
                    .entries
                    .iter()
                    .enumerate()
                    .find(|(_, e)| &e.name == name || e.calibrations.iter().any(|c| c == name))
                {
                    let first = r
                        .metrics
                        .first()
                        .and_then(|&m| e.values.get(m).map(|v| (m, v)));
                    ranks.push((r.node_type, k + 1, r.entries.len(), e.name.as_str(), first));
                }
            }
            if let Some((t, k, n, _, Some((m, v)))) = ranks.first() {
                let _ = write!(
                    self.out,
                    " <span class=\"dim\">#{k} of {n} {} · {} {}</span>",
                    escape(t.name()),
                    escape(m.name()),
                    fmt(*v)
                );
            }
            self.w("</summary>\n<table class=\"kv\">\n");
            if let Some(c) = calibrations.get(name.as_str()) {
                let mut row = |k: &str, v: String| {
                    let _ = writeln!(self.out, "<tr><th>{k}</th><td>{v}</td></tr>");
                };
                row("tensor type", escape(&c.tensor_type));
                row(
                    "qtype",
                    format!(
                        "{}{}",
                        escape(&c.qtype),
                        if c.per_channel {
                            ", per channel"
                        } else {
                            ", per tensor"
                        }
                    ),
                );
                let thresholds = if c.thresholds == 1 {
                    opt_fmt(c.threshold_max)
                } else {
                    format!(
                        "{} values, {} … {}",
                        c.thresholds,
                        opt_fmt(c.threshold_min),
                        opt_fmt(c.threshold_max)
                    )
                };
                row("thresholds", thresholds);
                row(
                    "consumers",
                    format!("<code>{}</code>", escape(&c.consumers)),
                );
                let what = if c.tensor_type == "weight" {
                    "weight"
                } else {
                    "over the data"
                };
                let ratio = match (c.max_abs, c.threshold_max) {
                    (Some(m), Some(t)) if t > 0.0 => {
                        format!(" ({} × the largest threshold)", fmt(m / t))
                    }
                    _ => String::new(),
                };
                row(
                    &format!("max|x| {what}"),
                    format!("{}{ratio}", opt_fmt(c.max_abs)),
                );
            }
            for (t, k, n, entry, _) in &ranks {
                let r = rankings.iter().find(|r| r.node_type == *t);
                let values = r
                    .and_then(|r| r.entries.iter().find(|e| e.name == *entry).map(|e| (r, e)))
                    .map(|(r, e)| {
                        r.metrics
                            .iter()
                            .map(|m| {
                                format!(
                                    "{} {}",
                                    escape(m.name()),
                                    fmt(e.values.get(*m).unwrap_or(f64::NAN))
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                let via = if entry != name {
                    format!(" (as part of <code>{}</code>)", escape(entry))
                } else {
                    String::new()
                };
                let _ = writeln!(
                    self.out,
                    "<tr><th>{} sensitivity</th><td>#{k} of {n}{via}: {values}</td></tr>",
                    escape(t.name())
                );
            }
            self.w("</table>\n");
            if let Some(h) = health {
                for f in h.findings.iter().filter(|f| &f.node == name) {
                    let _ = writeln!(
                        self.out,
                        "<p class=\"{}\">{}: {}</p>",
                        escape(&f.severity),
                        escape(&f.severity),
                        escape(&f.message)
                    );
                }
            }
            let safe = file_safe(name);
            let distribution = files.iter().find(|f| {
                f.starts_with(DISTRIBUTION_DIR)
                    && stem(f).is_some_and(|s| {
                        s == format!("weight_{safe}") || s == format!("activation_{safe}")
                    })
            });
            let boxplot = files.iter().find(|f| {
                f.starts_with(CHANNELWISE_DIR)
                    && stem(f).is_some_and(|s| s == format!("{safe}_boxplot"))
            });
            for file in [distribution, boxplot].into_iter().flatten() {
                self.embed(file);
            }
            self.w("</details>\n");
        }
        self.w("</section>\n");
    }

    /// A figure runall wrote: SVG inline, PNG as a data: URI.
    fn embed(&mut self, file: &str) {
        let path = self.dir.join(file);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => return self.note(&format!("{file}: {e}")),
        };
        if file.ends_with(".svg") {
            match String::from_utf8(bytes) {
                Ok(svg) => self.inline_svg(&svg),
                Err(e) => self.note(&format!("{file}: {e}")),
            }
        } else {
            let _ = writeln!(
                self.out,
                "<figure><img alt=\"{}\" src=\"data:image/png;base64,{}\"></figure>",
                escape(file),
                base64(&bytes)
            );
        }
    }

    /// Draws a chart with hmct-plot as SVG and inlines it; a chart that cannot be drawn
    /// (no finite value) becomes a note.
    fn chart(&mut self, chart: &LineChart) {
        let svg = tempfile::Builder::new()
            .suffix(".svg")
            .tempfile()
            .map_err(|e| e.to_string())
            .and_then(|file| {
                hmct_plot::line_chart(chart, file.path(), Format::Svg)
                    .map_err(|e| hmct_ir::error_chain(&e))?;
                std::fs::read_to_string(file.path()).map_err(|e| e.to_string())
            });
        match svg {
            Ok(svg) => self.inline_svg(&svg),
            Err(e) => self.note(&format!("{}: cannot draw: {e}", chart.figure.title)),
        }
    }

    fn inline_svg(&mut self, svg: &str) {
        self.figures += 1;
        let prefix = format!("f{}-", self.figures);
        let body = svg.find("<svg").map_or(svg, |i| &svg[i..]);
        let body = body
            .replace("id=\"", &format!("id=\"{prefix}"))
            .replace("href=\"#", &format!("href=\"#{prefix}"));
        // Every chart is scaled to the page, however many nodes it spans: a page
        // that scrolls sideways hides the part of the curve that matters.
        let _ = writeln!(self.out, "<figure>{body}</figure>");
    }
}

/// The calibration nodes to detail, most sensitive first: the candidates of each
/// ranking taken rank by rank in turn, cut at [`TOP_DETAIL`], plus any node runall
/// drew figures for further down. The second value is how many were left out.
fn detail_order(summary: &RunallSummary, rankings: &[&Sensitivity]) -> (Vec<String>, usize) {
    let mut order: Vec<String> = Vec::new();
    let push = |order: &mut Vec<String>, n: &str| {
        if !order.iter().any(|o| o == n) {
            order.push(n.to_string());
        }
    };
    let longest = rankings.iter().map(|r| r.entries.len()).max().unwrap_or(0);
    for k in 0..longest {
        for r in rankings {
            // A regular node of a `node` ranking stands for its calibration nodes.
            for c in r.entries.get(k).iter().flat_map(|e| &e.calibrations) {
                push(&mut order, c);
            }
        }
    }
    let figures = summary
        .distribution_nodes
        .iter()
        .chain(&summary.channelwise_nodes);
    for n in figures.clone() {
        push(&mut order, n);
    }
    let mut shown: Vec<String> = order.iter().take(TOP_DETAIL).cloned().collect();
    for n in figures {
        push(&mut shown, n);
    }
    let left_out = order.len() - shown.len();
    (shown, left_out)
}

fn stem(file: &str) -> Option<&str> {
    Path::new(file).file_stem().and_then(|s| s.to_str())
}

/// An id attribute for a node name: escaped, and without spaces (ids cannot hold them).
fn anchor(name: &str) -> String {
    format!("node-{}", escape(&name.replace(char::is_whitespace, "_")))
}

/// The command line as a shell would need it typed.
fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn acc_error_chart(acc: &FigureFile) -> LineChart {
    let is_reference = |c: &&Curve| c.label == "calibrated_model";
    let values = |c: &Curve| -> Vec<f64> {
        match (&c.averaged, acc.average_mode) {
            (Some(a), true) => a.clone(),
            _ => c.values.clone(),
        }
    };
    let label = |c: &Curve| {
        if c.nodes.is_empty() {
            c.label.clone()
        } else if c.nodes.len() <= 2 {
            format!("{} ({})", c.label, c.nodes.join(", "))
        } else {
            format!("{} ({} nodes)", c.label, c.nodes.len())
        }
    };
    // The calibrated model first, black and dashed, as the analysis draws it.
    let reference = acc.curves.iter().filter(is_reference).map(|c| {
        LineSeries::new(label(c), values(c))
            .color(Rgb::BLACK)
            .line(LineKind::Dashed)
    });
    let others = acc
        .curves
        .iter()
        .filter(|c| !is_reference(c))
        .enumerate()
        .map(|(i, c)| LineSeries::new(label(c), values(c)).color(Rgb::cycle(i)));
    let samples = if acc.data_num == 1 {
        "1 sample".to_string()
    } else {
        format!("mean of {} samples", acc.data_num)
    };
    LineChart {
        figure: Figure::new(
            format!(
                "Accumulated {}{}: {} ({samples})",
                acc.metric,
                if acc.average_mode {
                    " (running mean)"
                } else {
                    ""
                },
                serde_name(acc.kind).replace('_', " ")
            ),
            "output of quantized node (graph order)",
            acc.metric.name(),
        ),
        x_labels: acc.points.iter().map(|p| p.label.clone()).collect(),
        series: reference.chain(others).collect(),
        baseline: None,
    }
}

const STYLE: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1200px;padding:0 1.5em 3em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin:.8em 0 .3em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.6em}h3{font-size:1.05em}
nav{position:sticky;top:0;background:#fff;padding:.4em 0;border-bottom:1px solid #eee;z-index:1}nav a{margin-right:1em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
thead th{background:#f3f4f6}.scroll thead th{position:sticky;top:0}table.sortable thead th{cursor:pointer;user-select:none}
th[data-dir=asc]::after{content:' \\25B2'}th[data-dir=desc]::after{content:' \\25BC'}
table.kv th{background:#f8f8f8;width:14em;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}tr.warning td{background:#fff4e5}tr.info td{background:#eef5ff}
p.warning{color:#8a4b00}p.info{color:#24497a}p.note{color:#666;font-style:italic}p.ok{color:#1d6b2f}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:break-word}code.cmd{display:block;white-space:pre-wrap;background:#f6f8fa;padding:.4em}
.scroll{max-height:32em;overflow:auto;border:1px solid #eee}
.dim{color:#666;font-weight:normal;margin-left:.6em}
details{border:1px solid #ddd;border-radius:4px;margin:.5em 0;padding:.3em .8em}summary{cursor:pointer;font-weight:600}
figure{margin:.6em 0}figure svg,figure img{max-width:100%;height:auto;display:block}
";

/// Click a header to sort its table by that column (numbers by `data-v`, missing
/// values last); click again to reverse.
const SORT_SCRIPT: &str = "<script>
document.querySelectorAll('table.sortable thead th').forEach(function (th) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
    var asc = th.dataset.dir !== 'asc';
    table.querySelectorAll('thead th').forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = asc ? 'asc' : 'desc';
    var key = function (row) {
      var cell = row.cells[col];
      if (cell.hasAttribute('data-v')) {
        var v = parseFloat(cell.getAttribute('data-v'));
        return isNaN(v) ? null : v;
      }
      return cell.textContent;
    };
    Array.from(body.rows).map(function (r) { return [key(r), r]; }).sort(function (a, b) {
      if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null);
      var c = typeof a[0] === 'number' ? a[0] - b[0] : a[0].localeCompare(b[0]);
      return asc ? c : -c;
    }).forEach(function (p) { body.appendChild(p[1]); });
  });
});
</script>
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn shell_words_quote_what_a_shell_would_split() {
        let args = [
            "hmct-debugger",
            "-nm",
            "['cosine-similarity','mse']",
            "a b",
            "x.onnx",
        ];
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            shell_words(&args),
            r#"hmct-debugger -nm '['\''cosine-similarity'\'','\''mse'\'']' 'a b' x.onnx"#
        );
    }
}
