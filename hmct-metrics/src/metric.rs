use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::MetricError;

/// One of the five error metrics the tool offers (`-m/--metrics`).
///
/// Names are the tool's kebab-case spellings, both for [`FromStr`]/[`Display`](fmt::Display)
/// and for serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// dot(x,y) / (max(‖x‖,1e-8)·max(‖y‖,1e-8)).
    CosineSimilarity,
    /// mean((x−y)²).
    Mse,
    /// mean(|x−y|): despite the name, the mean *absolute* error (the tool's definition).
    Mre,
    /// 10·log10(‖x‖/‖x−y‖): half the usual dB figure (the tool's definition).
    Sqnr,
    /// max(|x−y|).
    Chebyshev,
}

impl Metric {
    /// The position of this metric in [`Metric::ALL`].
    pub fn index(self) -> usize {
        Metric::ALL
            .iter()
            .position(|&m| m == self)
            .expect("ALL lists every metric")
    }

    /// All metrics, in the order the tool's manual lists them.
    pub const ALL: [Metric; 5] = [
        Metric::CosineSimilarity,
        Metric::Mse,
        Metric::Mre,
        Metric::Sqnr,
        Metric::Chebyshev,
    ];

    /// The names accepted on the command line, in the order of [`Metric::ALL`].
    pub const NAMES: [&'static str; 5] = ["cosine-similarity", "mse", "mre", "sqnr", "chebyshev"];

    /// The tool's spelling of the metric.
    pub fn name(self) -> &'static str {
        match self {
            Metric::CosineSimilarity => "cosine-similarity",
            Metric::Mse => "mse",
            Metric::Mre => "mre",
            Metric::Sqnr => "sqnr",
            Metric::Chebyshev => "chebyshev",
        }
    }

    /// True when a lower value means a larger quantization error (cosine, sqnr); false
    /// for the distances (mse, mre, chebyshev), where higher is worse.
    pub fn worse_is_lower(self) -> bool {
        matches!(self, Metric::CosineSimilarity | Metric::Sqnr)
    }

    /// The value a lossless comparison gives: where "no error" sits on this metric's scale.
    pub fn perfect_value(self) -> f64 {
        match self {
            Metric::CosineSimilarity => 1.0,
            Metric::Sqnr => f64::INFINITY,
            Metric::Mse | Metric::Mre | Metric::Chebyshev => 0.0,
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Metric {
    type Err = MetricError;

    /// Accepts the tool's names; case and `_` for `-` are forgiven because users type
    /// `cosine_similarity` after seeing the Python keyword arguments.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normalized = s.trim().to_ascii_lowercase().replace('_', "-");
        Metric::ALL
            .into_iter()
            .find(|m| m.name() == normalized)
            .ok_or_else(|| MetricError::UnknownMetric {
                name: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_from_str_and_display() {
        for (m, name) in Metric::ALL.iter().zip(Metric::NAMES) {
            assert_eq!(m.to_string(), name);
            assert_eq!(name.parse::<Metric>().unwrap(), *m);
        }
    }

    #[test]
    fn forgiving_spellings() {
        assert_eq!(
            "Cosine_Similarity".parse::<Metric>().unwrap(),
            Metric::CosineSimilarity
        );
        assert_eq!(" MSE ".parse::<Metric>().unwrap(), Metric::Mse);
    }

    #[test]
    fn unknown_name_lists_the_five() {
        let err = "cosine".parse::<Metric>().unwrap_err();
        assert_eq!(
            err,
            MetricError::UnknownMetric {
                name: "cosine".into()
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("'cosine'"), "{msg}");
        for name in Metric::NAMES {
            assert!(msg.contains(name), "{msg} lacks {name}");
        }
    }

    #[test]
    fn direction() {
        assert!(Metric::CosineSimilarity.worse_is_lower());
        assert!(Metric::Sqnr.worse_is_lower());
        assert!(!Metric::Mse.worse_is_lower());
        assert!(!Metric::Mre.worse_is_lower());
        assert!(!Metric::Chebyshev.worse_is_lower());
    }

    #[test]
    fn serde_uses_kebab_names() {
        for (m, name) in Metric::ALL.iter().zip(Metric::NAMES) {
            assert_eq!(serde_json::to_string(m).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<Metric>(&format!("\"{name}\"")).unwrap(),
                *m
            );
        }
        assert!(serde_json::from_str::<Metric>("\"CosineSimilarity\"").is_err());
    }
}
