//! The quantization type of a calibration node and the kind of tensor it quantizes.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// The `qtype` attribute of an HzCalibration node, spelled as in ONNX (`int8`,
/// `uint16`, `float16`, ...). Strings this crate does not know are kept verbatim in
/// [`QType::Unknown`] so they survive an edit and can be reported; such a node cannot
/// be run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum QType {
    /// `intN` / `uintN` (int8, int16, uint8, uint16, int4, ...).
    Int {
        bits: u8,
        signed: bool,
    },
    Float16,
    Float32,
    Unknown(String),
}

impl QType {
    pub const INT8: QType = QType::Int {
        bits: 8,
        signed: true,
    };
    pub const INT16: QType = QType::Int {
        bits: 16,
        signed: true,
    };
    pub const UINT8: QType = QType::Int {
        bits: 8,
        signed: false,
    };
    pub const UINT16: QType = QType::Int {
        bits: 16,
        signed: false,
    };
    pub const INT4: QType = QType::Int {
        bits: 4,
        signed: true,
    };

    /// `(qmin, qmax)` of an integer type (int8: -128..127, uint8: 0..255); `None` for
    /// float and unknown types and for widths whose range does not fit in an i64.
    pub fn qrange(&self) -> Option<(i64, i64)> {
        match *self {
            QType::Int { bits, signed } => {
                if bits == 0 || bits > 64 {
                    return None;
                }
                // i128 holds every range up to 64 bits; the result must fit an i64.
                let (lo, hi): (i128, i128) = if signed {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                Some((i64::try_from(lo).ok()?, i64::try_from(hi).ok()?))
            }
            _ => None,
        }
    }

    /// True for the integer types (the ones with a scale).
    pub fn is_int(&self) -> bool {
        matches!(self, QType::Int { .. })
    }

    /// True for every type except [`QType::Unknown`].
    pub fn is_known(&self) -> bool {
        !matches!(self, QType::Unknown(_))
    }
}

impl FromStr for QType {
    type Err = Infallible;

    /// Never fails; see [`QType::from_name`].
    fn from_str(s: &str) -> Result<QType, Infallible> {
        Ok(QType::from_name(s))
    }
}

impl QType {
    /// Parses an ONNX spelling (case-insensitive). Strings that are not a known type
    /// become [`QType::Unknown`], verbatim.
    pub fn from_name(s: &str) -> QType {
        let lower = s.trim().to_ascii_lowercase();
        let int = |digits: &str, signed: bool| {
            // Digits only: "int+8" or "int08" would parse as numbers but are not types.
            if digits.is_empty()
                || !digits.bytes().all(|b| b.is_ascii_digit())
                || digits.starts_with('0')
            {
                return None;
            }
            digits
                .parse::<u8>()
                .ok()
                .filter(|&b| (1..=64).contains(&b))
                .map(|bits| QType::Int { bits, signed })
        };
        let parsed = match lower.as_str() {
            "float16" => Some(QType::Float16),
            "float32" => Some(QType::Float32),
            other => match other.strip_prefix("uint") {
                Some(d) => int(d, false),
                None => other.strip_prefix("int").and_then(|d| int(d, true)),
            },
        };
        parsed.unwrap_or_else(|| QType::Unknown(s.to_string()))
    }
}

impl fmt::Display for QType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QType::Int { bits, signed: true } => write!(f, "int{bits}"),
            QType::Int {
                bits,
                signed: false,
            } => write!(f, "uint{bits}"),
            QType::Float16 => f.write_str("float16"),
            QType::Float32 => f.write_str("float32"),
            QType::Unknown(s) => f.write_str(s),
        }
    }
}

/// What a calibration node quantizes: an activation (`feature`) or a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    Feature,
    Weight,
}

impl TensorType {
    /// The attribute spelling: `feature` or `weight`.
    pub fn as_str(self) -> &'static str {
        match self {
            TensorType::Feature => "feature",
            TensorType::Weight => "weight",
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> QType {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_onnx_spelling() {
        for s in [
            "int8", "int16", "uint8", "uint16", "int4", "int32", "uint2", "float16", "float32",
        ] {
            assert!(q(s).is_known(), "{s}");
            assert_eq!(q(s).to_string(), s);
        }
        assert_eq!(q("INT16"), QType::INT16);
        assert_eq!(q("bfloat16"), QType::Unknown("bfloat16".into()));
        assert_eq!(q("int0"), QType::Unknown("int0".into()));
        assert_eq!(q("int08"), QType::Unknown("int08".into()));
        assert_eq!(q("int+8"), QType::Unknown("int+8".into()));
        assert_eq!(q("int65"), QType::Unknown("int65".into()));
        assert_eq!(q("bfloat16").to_string(), "bfloat16");
    }

    #[test]
    fn ranges() {
        assert_eq!(QType::INT8.qrange(), Some((-128, 127)));
        assert_eq!(QType::INT16.qrange(), Some((-32768, 32767)));
        assert_eq!(QType::UINT8.qrange(), Some((0, 255)));
        assert_eq!(QType::UINT16.qrange(), Some((0, 65535)));
        assert_eq!(QType::INT4.qrange(), Some((-8, 7)));
        assert_eq!(q("int64").qrange(), Some((i64::MIN, i64::MAX)));
        assert_eq!(q("uint63").qrange(), Some((0, i64::MAX)));
        assert_eq!(q("uint64").qrange(), None);
        assert_eq!(QType::Float16.qrange(), None);
        assert_eq!(q("fp8").qrange(), None);
    }
}
