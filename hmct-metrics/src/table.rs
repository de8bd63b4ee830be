//! Plain-text tables in the layout of the tool's logs (no printing here).
//!
//! The layout, as inferred from the widths in the seeds' tables: every column is as
//! wide as its longest cell or header plus two spaces; the title is centred in a line
//! of `=` as wide as the table (the extra `=` of an odd split goes right), then the
//! header, a rule of `-`, and one left-aligned row per line. Cells longer than 50
//! characters are shown as `...` followed by their last 47 characters.

use std::borrow::Cow;
use std::fmt;

use crate::{InfoFigures, Metric, MetricError};

/// Cells longer than this many characters are shortened from the left.
pub const MAX_CELL_CHARS: usize = 50;
const COLUMN_GAP: usize = 2;

/// `name` as a table shows it: unchanged up to 50 characters, else `...` + last 47.
pub fn display_name(name: &str) -> Cow<'_, str> {
    let chars = name.chars().count();
    if chars <= MAX_CELL_CHARS {
        return Cow::Borrowed(name);
    }
    let keep = MAX_CELL_CHARS - 3;
    let tail: String = name.chars().skip(chars - keep).collect();
    Cow::Owned(format!("...{tail}"))
}

/// `value` rounded to `decimals` decimal places, correctly rounded from its exact
/// binary value with ties to even (what Python's `round(v, n)` does). Non-finite
/// values come back unchanged.
pub fn round_to(value: f64, decimals: usize) -> f64 {
    if !value.is_finite() {
        return value;
    }
    // Rust's fixed-precision formatting is exact, so going through the decimal string
    // avoids the double rounding of `(v * 10^n).round() / 10^n`.
    format!("{value:.decimals$}").parse().unwrap_or(value)
}

/// `value` written the way Python's `repr(float)` writes it: shortest round-trip
/// digits, `.0` on integral values, exponent form below 1e-4 or from 1e16 on
/// (`1e-05`, `1e+16`), and `inf`, `-inf`, `nan`.
///
/// One known divergence: when a value lies exactly halfway between its two shortest
/// spellings (only possible from about 1e14 up, e.g. 797907124943640.25), Python picks
/// the even last digit and Rust's digit generator rounds up (`...640.3` vs `...640.2`).
/// Checked against Python on 20 000 random doubles; those ties were the only misses.
pub fn python_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if value.is_infinite() {
        return format!("{sign}inf");
    }
    // `{:e}` yields the same shortest digits Python picks, as `d.ddde<exp>`.
    let sci = format!("{:e}", value.abs());
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let ndigits = digits.len() as i32;
    // Python's decimal-point position: value = 0.<digits> × 10^decpt.
    let decpt = exp + 1;
    let body = if value == 0.0 {
        "0.0".to_string()
    } else if decpt <= -4 || decpt > 16 {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{exp_sign}{:02}", exp.unsigned_abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else if decpt >= ndigits {
        format!("{digits}{}.0", "0".repeat((decpt - ndigits) as usize))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

/// A metric value as the tables print it: rounded to 5 decimals, then written like
/// Python prints a float (`0.8041`, `49.4949`, `1.0`, `inf`), as in the seeds' tables.
/// Below 1e-3, where 5 decimals would keep at most two digits (an mse of 2.45e-6
/// would read `0.0`), 5 significant digits instead (`2.45e-06`, `0.00098765`).
pub fn format_value(value: f64) -> String {
    if value != 0.0 && value.abs() < 1e-3 {
        let significant: f64 = format!("{value:.4e}").parse().unwrap_or(value);
        return python_repr(significant);
    }
    python_repr(round_to(value, 5))
}

/// A text table: title, header and rows of already formatted cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table; an empty `title` gives a plain line of `=` (the `info` layout).
    pub fn new(title: impl Into<String>, header: Vec<String>) -> Self {
        Self {
            title: title.into(),
            header,
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have one cell per header column.
    pub fn push_row(&mut self, cells: Vec<String>) -> Result<(), MetricError> {
        if cells.len() != self.header.len() {
            return Err(MetricError::RowWidth {
                expected: self.header.len(),
                got: cells.len(),
            });
        }
        self.rows.push(cells);
        Ok(())
    }

    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// The whole table, one `\n`-terminated line each.
    pub fn render(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |cell: &String| display_name(cell).into_owned();
        let header: Vec<String> = self.header.iter().map(shown).collect();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|row| row.iter().map(shown).collect())
            .collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|col| {
                std::iter::once(&header)
                    .chain(&rows)
                    .map(|row| row[col].chars().count())
                    .max()
                    .unwrap_or(0)
                    + COLUMN_GAP
            })
            .collect();
        let total: usize = widths.iter().sum();
        writeln!(f, "{:=^total$}", self.title)?;
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            let last = cells.len().saturating_sub(1);
            for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
                // The last column is not padded: no trailing blanks in logs.
                if i == last {
                    write!(f, "{cell}")?
                } else {
                    write!(f, "{cell:<width$}")?
                }
            }
            writeln!(f)
        };
        line(f, &header)?;
        writeln!(f, "{}", "-".repeat(total))?;
        for row in &rows {
            line(f, row)?;
        }
        Ok(())
    }
}

/// The header of a sensitivity table: the key columns (`node`; `weight`, `node`;
/// `activation`, `node`, `threshold`, `bit`) followed by the metric names.
pub fn sensitivity_header(key_columns: &[&str], metrics: &[Metric]) -> Vec<String> {
    key_columns
        .iter()
        .map(|c| c.to_string())
        .chain(metrics.iter().map(|m| m.to_string()))
        .collect()
}

/// A sensitivity row: the key cells as given, then each value via [`format_value`].
pub fn sensitivity_row(keys: &[&str], values: &[f64]) -> Vec<String> {
    keys.iter()
        .map(|k| k.to_string())
        .chain(values.iter().map(|&v| format_value(v)))
        .collect()
}

/// The output-comparison table of the `info` command: one row per model output with
/// its [`InfoFigures`], 6 fixed decimals.
pub fn info_table<'a>(outputs: impl IntoIterator<Item = (&'a str, InfoFigures)>) -> Table {
    let header = [
        "Output",
        "Cosine Similarity",
        "L1 Distance",
        "L2 Distance",
        "Chebyshev Distance",
    ];
    let mut table = Table::new("", header.iter().map(|h| h.to_string()).collect());
    for (name, fig) in outputs {
        table.rows.push(vec![
            name.to_string(),
            format!("{:.6}", fig.cosine),
            format!("{:.6}", fig.l1),
            format!("{:.6}", fig.l2),
            format!("{:.6}", fig.chebyshev),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_keep_significant_digits() {
        // The seeds' figures are unchanged...
        assert_eq!(format_value(0.77795), "0.77795");
        assert_eq!(format_value(68.021034), "68.02103");
        assert_eq!(format_value(0.0091), "0.0091");
        assert_eq!(format_value(0.0035949), "0.00359");
        // ...and what 5 decimals would round away is not.
        assert_eq!(format_value(2.45e-6), "2.45e-06");
        assert_eq!(format_value(-3.123456e-7), "-3.1235e-07");
        assert_eq!(format_value(0.000987654), "0.00098765");
        assert_eq!(format_value(0.0), "0.0");
        assert_eq!(format_value(f64::INFINITY), "inf");
    }

    fn table(title: &str, keys: &[&str], metrics: &[Metric], rows: &[(&[&str], &[f64])]) -> String {
        let mut t = Table::new(title, sensitivity_header(keys, metrics));
        for (k, v) in rows {
            t.push_row(sensitivity_row(k, v)).unwrap();
        }
        t.render()
    }

    /// Whitespace runs collapsed, as the seeds' copy of the logs has them.
    fn collapsed(line: &str) -> String {
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn python_float_spelling() {
        let cases = [
            (0.8041, "0.8041"),
            (49.4949, "49.4949"),
            (1.0, "1.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (-2.5e-5, "-2.5e-05"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (1.25e300, "1.25e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
        ];
        for (v, want) in cases {
            assert_eq!(python_repr(v), want, "{v:e}");
        }
    }

    #[test]
    fn five_decimal_values() {
        assert_eq!(format_value(0.804099), "0.8041");
        assert_eq!(format_value(0.999996), "1.0");
        assert_eq!(format_value(68.021034), "68.02103");
        // Below 1e-3, significant digits instead of zeros.
        assert_eq!(format_value(0.000004), "4e-06");
        assert_eq!(format_value(0.0000123), "1.23e-05");
        assert_eq!(format_value(f64::INFINITY), "inf");
        // Ties go to even on the exact binary value, as Python's round does.
        assert_eq!(round_to(0.125, 2), 0.12);
        assert_eq!(round_to(0.375, 2), 0.38);
        assert_eq!(round_to(2.675, 2), 2.67); // 2.675 is 2.67499999... in binary
    }

    #[test]
    fn long_names_keep_their_tail() {
        let name = "/decoder/seg_blocks.4/block/block.0/block/block.0/Pad";
        assert_eq!(name.chars().count(), 53);
        assert_eq!(
            display_name(name),
            "...er/seg_blocks.4/block/block.0/block/block.0/Pad"
        );
        let fifty = "x".repeat(50);
        assert_eq!(display_name(&fifty), fifty.as_str());
        // Characters, not bytes: multi-byte names are cut on character boundaries.
        let wide = "é".repeat(60);
        assert_eq!(display_name(&wide), format!("...{}", "é".repeat(47)));
    }

    #[test]
    fn row_width_is_checked() {
        let mut t = Table::new("t", vec!["node".into(), "mse".into()]);
        assert_eq!(
            t.push_row(vec!["a".into()]),
            Err(MetricError::RowWidth {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn exact_layout() {
        let text = table(
            "node sensitivity",
            &["node"],
            &[Metric::CosineSimilarity, Metric::Mse],
            &[
                (&["Conv_60"], &[0.777951, 68.021034]),
                (&["Conv_4"], &[0.8041, 49.4949]),
            ],
        );
        // Widths: node 7+2, cosine-similarity 17+2, mse 8+2 → 38; title split 11 | 11.
        let expected = "\
===========node sensitivity===========
node     cosine-similarity  mse
--------------------------------------
Conv_60  0.77795            68.02103
Conv_4   0.8041             49.4949
";
        assert_eq!(text, expected);
    }

    /// Seed 001, hybridnets: the longest names are cut to 50, so the table is
    /// 50+2 + 17+2 = 71 wide, with the title split 27 | 28.
    #[test]
    fn matches_seed_node_table_with_long_names() {
        let rows: [(&str, f64); 4] = [
            ("/encoder/_blocks.0/_depthwise_conv/Conv", 0.98768),
            ("/bifpn/bifpn.5/p4_downsample/Pad", 0.99985),
            (
                "/decoder/seg_blocks.4/block/block.0/block/block.0/Pad",
                0.99985,
            ),
            ("/encoder/_blocks.2/GlobalAveragePool", 0.999804),
        ];
        let rows: Vec<(&[&str], &[f64])> = rows
            .iter()
            .map(|(n, v)| (std::slice::from_ref(n), std::slice::from_ref(v)))
            .collect();
        let text = table(
            "node sensitivity",
            &["node"],
            &[Metric::CosineSimilarity],
            &rows,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "===========================node sensitivity============================"
        );
        assert_eq!(lines[2], "-".repeat(71));
        let seed = [
            "node cosine-similarity",
            "/encoder/_blocks.0/_depthwise_conv/Conv 0.98768",
            "/bifpn/bifpn.5/p4_downsample/Pad 0.99985",
            "...er/seg_blocks.4/block/block.0/block/block.0/Pad 0.99985",
            "/encoder/_blocks.2/GlobalAveragePool 0.9998",
        ];
        let body: Vec<String> = lines[1..2]
            .iter()
            .chain(&lines[3..])
            .map(|l| collapsed(l))
            .collect();
        assert_eq!(body, seed);
    }

    /// Seed 000, weight table: weight names up to 50 (one cut), node names up to 7,
    /// cosine 17, mse 7: 52+9+19+9 = 89 wide, as its dash rule is. (That seed's title
    /// lines are one `=` short of their rules, 36 | 36; seed 001's titles are exactly
    /// as wide as their rules with the odd `=` on the right, which is what we follow.)
    #[test]
    fn matches_seed_weight_table_width() {
        let long = "features.99classifier.1.weight_conv_weight_HzCalibration";
        let rows: [(&[&str], &[f64]); 3] = [
            (&["471_HzCalibration", "Conv_2"], &[0.99978, 0.07519]),
            (&[long, "Gemm_99"], &[0.999991, 0.00359]),
            (&["558_HzCalibration", "Conv_56"], &[0.99999, 0.00369]),
        ];
        let text = table(
            "node sensitivity",
            &["weight", "node"],
            &[Metric::CosineSimilarity, Metric::Mse],
            &rows,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].len(), 89);
        assert_eq!(
            lines[0],
            format!("{}node sensitivity{}", "=".repeat(36), "=".repeat(37))
        );
        assert_eq!(lines[2].len(), 89);
        assert_eq!(
            collapsed(lines[4]),
            "...99classifier.1.weight_conv_weight_HzCalibration Gemm_99 0.99999 0.00359"
        );
    }

    /// Seed 001, `hmct-info` output: 6 fixed decimals, a bare `=` line, 81 wide.
    #[test]
    fn matches_seed_info_table() {
        let fig = |cosine, l1, l2, chebyshev| InfoFigures {
            cosine,
            l1,
            l2,
            chebyshev,
        };
        let t = info_table([
            (
                "det_out",
                fig(0.9953521, 7.6334812, 289.6376651, 552.8175659),
            ),
            ("drive_area_seg", fig(0.998973, 0.004005, 0.001132, 0.59261)),
            ("lane_line_seg", fig(0.999933, 0.000417, 0.000069, 0.564768)),
        ]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "=".repeat(81));
        assert_eq!(lines[2], "-".repeat(81));
        let seed = [
            "Output Cosine Similarity L1 Distance L2 Distance Chebyshev Distance",
            "det_out 0.995352 7.633481 289.637665 552.817566",
            "drive_area_seg 0.998973 0.004005 0.001132 0.592610",
            "lane_line_seg 0.999933 0.000417 0.000069 0.564768",
        ];
        let body: Vec<String> = lines[1..2]
            .iter()
            .chain(&lines[3..])
            .map(|l| collapsed(l))
            .collect();
        assert_eq!(body, seed);
    }
}
