//! The runall result folder: where each entry sits, and `summary.json`, the index of
//! what was written. `runall` writes the folder; `report` reads it back with these
//! same types.

use serde::{Deserialize, Serialize};

use crate::health::HealthReport;
use crate::sensitivity::{EntryKind, MetricValues, NodeType, Sensitivity};
use crate::sensitivity_analysis::SensitivityAnalysis;

/// The sub-folders runall writes, in step order.
pub const SENSITIVITY_DIR: &str = "node_sensitivity";
pub const DISTRIBUTION_DIR: &str = "data_distribution";
pub const CHANNELWISE_DIR: &str = "channelwise_distribution";
pub const ACC_ERROR_DIR: &str = "accumulate_error";
pub const ANALYSIS_DIR: &str = "sensitivity_analysis";
/// The index of everything written.
pub const SUMMARY_NAME: &str = "summary.json";
/// The health checks' findings.
pub const HEALTH_NAME: &str = "health.json";
/// The HTML page over the whole folder.
pub const REPORT_NAME: &str = "report.html";

/// Every entry runall owns in its save folder: what a re-run replaces, and nothing
/// else.
pub const ENTRIES: [&str; 8] = [
    SENSITIVITY_DIR,
    DISTRIBUTION_DIR,
    CHANNELWISE_DIR,
    ACC_ERROR_DIR,
    ANALYSIS_DIR,
    HEALTH_NAME,
    SUMMARY_NAME,
    REPORT_NAME,
];

/// The ranking of `node_type` as a table (`.log`) or as JSON (`.json`), relative to
/// the folder.
pub fn sensitivity_file(node_type: NodeType, extension: &str) -> String {
    format!("{SENSITIVITY_DIR}/sensitivity_of_{node_type}.{extension}")
}

/// One step as it ran.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepRecord {
    pub name: String,
    pub seconds: f64,
    /// Files written, relative to the result folder, in order.
    pub files: Vec<String>,
}

/// The top of one ranking, for the summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TopEntry {
    pub name: String,
    pub kind: EntryKind,
    pub values: MetricValues,
}

/// The top of the ranking of one node type.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TopList {
    pub node_type: NodeType,
    pub entries: Vec<TopEntry>,
}

/// The health checks' counts, for the summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthCounts {
    pub file: String,
    pub warnings: usize,
    pub infos: usize,
}

/// What runall did: `summary.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunallSummary {
    /// Tool and version that wrote the folder.
    pub tool: String,
    /// The command line, when the caller gives it.
    pub command: Option<Vec<String>>,
    pub model: String,
    /// Samples the data holds.
    pub samples: usize,
    pub steps: Vec<StepRecord>,
    /// The top candidates of each ranking made, in step order.
    pub top: Vec<TopList>,
    /// The calibration nodes steps 3 and 4 looked at.
    pub distribution_nodes: Vec<String>,
    pub channelwise_nodes: Vec<String>,
    /// The calibrated model's value of the sensitivity-analysis metric on the model
    /// outputs, and the float model's (the baseline).
    pub calibrated_metric: Option<f64>,
    pub float_metric: Option<f64>,
    /// The nodes the sensitivity analysis looked at, most sensitive first.
    pub sensitive_nodes: Vec<String>,
    /// Total wall time in seconds.
    pub seconds: f64,
    pub health: Option<HealthCounts>,
    /// The HTML report's file, when written.
    pub report: Option<String>,
    /// Every finding, for the caller to show.
    #[serde(skip)]
    pub health_report: HealthReport,
    #[serde(skip)]
    pub rankings: Vec<Sensitivity>,
    #[serde(skip)]
    pub analysis: Option<SensitivityAnalysis>,
}
