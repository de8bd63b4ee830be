//! One box per channel from precomputed statistics, and the statistics themselves.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::draw::{
    self, Axes, CategoryPlan, LegendEntry, LineKind, Margins, Marker, Scale, Swatch,
};
use crate::error::PlotError;
use crate::figure::{Figure, Format, RenderInfo, Rgb, Scene, render};

/// Summary of one channel, as matplotlib's box plot draws it.
#[derive(Debug, Clone, PartialEq)]
pub struct BoxStats {
    /// Finite values summarised.
    pub count: usize,
    pub min: f64,
    pub max: f64,
    /// Smallest value at or above `q1 - 1.5 * IQR`.
    pub whisker_low: f64,
    pub q1: f64,
    pub median: f64,
    pub mean: f64,
    pub q3: f64,
    /// Largest value at or below `q3 + 1.5 * IQR`.
    pub whisker_high: f64,
    /// Values beyond the whiskers, ascending; at most the cap given when computing,
    /// always including the most extreme ones on each side.
    pub outliers: Vec<f64>,
    /// How many values lie beyond the whiskers in total.
    pub outliers_total: usize,
    /// NaN or infinite inputs that were left out.
    pub non_finite: usize,
}

/// numpy's default ("linear") quantile of sorted data.
fn quantile(sorted: &[f32], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let i = pos.floor() as usize;
    let frac = pos - i as f64;
    let a = f64::from(sorted[i]);
    match sorted.get(i + 1) {
        Some(b) if frac > 0.0 => a + (f64::from(*b) - a) * frac,
        _ => a,
    }
}

/// `max` evenly spread picks from sorted `xs`, always keeping both ends.
fn spread(xs: &[f64], max: usize) -> Vec<f64> {
    if xs.len() <= max {
        return xs.to_vec();
    }
    match max {
        0 => Vec::new(),
        1 => vec![xs[xs.len() - 1]],
        _ => (0..max)
            .map(|k| xs[k * (xs.len() - 1) / (max - 1)])
            .collect(),
    }
}

impl BoxStats {
    /// Default cap on stored outliers: enough to show the spread, few enough that 2000
    /// boxes stay cheap to draw.
    pub const DEFAULT_MAX_OUTLIERS: usize = 50;

    /// Statistics of the finite values in `values`; quartiles interpolate linearly like
    /// numpy, whiskers reach the furthest values within 1.5 IQR like matplotlib. At
    /// most `max_outliers` outliers are kept, picked evenly from each side's sorted
    /// outliers and always including the extremes, so the result is deterministic.
    pub fn from_values(values: &[f32], max_outliers: usize) -> Result<BoxStats, PlotError> {
        if values.is_empty() {
            return Err(PlotError::EmptyData("no values for box statistics".into()));
        }
        let mut sorted: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let non_finite = values.len() - sorted.len();
        if sorted.is_empty() {
            return Err(PlotError::NoFiniteData(
                "every value is NaN or infinite".into(),
            ));
        }
        sorted.sort_unstable_by(f32::total_cmp);
        let q1 = quantile(&sorted, 0.25);
        let median = quantile(&sorted, 0.5);
        let q3 = quantile(&sorted, 0.75);
        let iqr = q3 - q1;
        let (lo_fence, hi_fence) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
        let as64 = |v: &f32| f64::from(*v);
        let low_idx = sorted.partition_point(|v| f64::from(*v) < lo_fence);
        let high_idx = sorted.partition_point(|v| f64::from(*v) <= hi_fence);
        // matplotlib falls back to the quartile when no point lies inside a fence.
        let whisker_low = if low_idx < sorted.len() {
            as64(&sorted[low_idx]).min(q1)
        } else {
            q1
        };
        let whisker_high = if high_idx > 0 {
            as64(&sorted[high_idx - 1]).max(q3)
        } else {
            q3
        };
        let below: Vec<f64> = sorted[..low_idx].iter().map(as64).collect();
        let above: Vec<f64> = sorted[high_idx..].iter().map(as64).collect();
        let outliers_total = below.len() + above.len();
        // Share the cap between the two sides in proportion, each keeping its extreme.
        let (b, a, max) = (below.len(), above.len(), max_outliers);
        let (keep_below, keep_above) = if b + a <= max {
            (b, a)
        } else if b == 0 || a == 0 {
            (b.min(max), a.min(max))
        } else if max < 2 {
            // Room for one point: the one furthest from the box.
            let low_further = (q1 - below[0]) >= (above[a - 1] - q3);
            if max == 0 {
                (0, 0)
            } else if low_further {
                (1, 0)
            } else {
                (0, 1)
            }
        } else {
            let kb = (max * b).div_ceil(b + a).clamp(1, max - 1).min(b);
            (kb, (max - kb).min(a))
        };
        let mut outliers = spread(&below, keep_below);
        outliers.extend(spread(&above, keep_above));
        let mean = sorted.iter().map(as64).sum::<f64>() / sorted.len() as f64;
        Ok(BoxStats {
            count: sorted.len(),
            min: as64(&sorted[0]),
            max: as64(&sorted[sorted.len() - 1]),
            whisker_low,
            q1,
            median,
            mean,
            q3,
            whisker_high,
            outliers,
            outliers_total,
            non_finite,
        })
    }

    fn is_finite(&self) -> bool {
        [
            self.whisker_low,
            self.q1,
            self.median,
            self.mean,
            self.q3,
            self.whisker_high,
        ]
        .iter()
        .all(|v| v.is_finite())
    }
}

/// Box statistics of every channel of a row-major array of `shape`, the channel being
/// dimension `axis`.
pub fn channel_stats(
    values: &[f32],
    shape: &[usize],
    axis: usize,
    max_outliers: usize,
) -> Result<Vec<BoxStats>, PlotError> {
    if axis >= shape.len() {
        return Err(PlotError::InvalidSpec(format!(
            "channel axis {axis} out of range for shape {shape:?}"
        )));
    }
    if shape.iter().product::<usize>() != values.len() {
        return Err(PlotError::InvalidSpec(format!(
            "shape {shape:?} does not hold {} values",
            values.len()
        )));
    }
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    (0..channels)
        .map(|c| {
            let mut chunk = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                let start = (o * channels + c) * inner;
                chunk.extend_from_slice(&values[start..start + inner]);
            }
            BoxStats::from_values(&chunk, max_outliers)
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BoxPlot {
    pub figure: Figure,
    pub boxes: Vec<BoxStats>,
    /// Tick label per box; `None` numbers the boxes from 0 (channel indices).
    pub labels: Option<Vec<String>>,
}

/// Draws `spec` to `path`. Boxes with non-finite statistics and non-finite outliers are
/// left out (and counted in the info); it fails only if no box can be drawn.
pub fn box_plot(spec: &BoxPlot, path: &Path, format: Format) -> Result<RenderInfo, PlotError> {
    let (scene, skipped, notes) = BoxScene::new(spec)?;
    let (width, height) = render(&scene, path, format)?;
    Ok(RenderInfo {
        path: path.to_path_buf(),
        format,
        width,
        height,
        skipped_non_finite: skipped,
        notes,
    })
}

struct BoxScene<'a> {
    spec: &'a BoxPlot,
    axes: Axes,
    size: (u32, u32),
    y_ticks: Vec<(f64, String)>,
    plan: CategoryPlan,
    legend: Vec<LegendEntry>,
}

const PLOT_HEIGHT: u32 = 440;
/// Pixels per box while the image may still grow.
const PX_PER_BOX: u32 = 10;
const MAX_WIDTH: u32 = 16_384;
const MEDIAN: Rgb = Rgb::RED;
const MEAN: Rgb = Rgb::BLUE;
const OUTLIER: Rgb = Rgb(60, 60, 60);

impl<'a> BoxScene<'a> {
    fn new(spec: &'a BoxPlot) -> Result<(Self, usize, Vec<String>), PlotError> {
        let n = spec.boxes.len();
        if n == 0 {
            return Err(PlotError::EmptyData("box plot has no boxes".into()));
        }
        let labels: Vec<String> = match &spec.labels {
            Some(l) if l.len() != n => {
                return Err(PlotError::InvalidSpec(format!(
                    "{} labels for {n} boxes",
                    l.len()
                )));
            }
            Some(l) => l.clone(),
            None => (0..n).map(|i| i.to_string()).collect(),
        };
        let mut notes = Vec::new();
        let bad_boxes = spec.boxes.iter().filter(|b| !b.is_finite()).count();
        let bad_outliers: usize = spec
            .boxes
            .iter()
            .map(|b| b.outliers.iter().filter(|v| !v.is_finite()).count())
            .sum();
        if bad_boxes > 0 {
            notes.push(format!(
                "{bad_boxes} boxes with non-finite statistics not drawn"
            ));
        }
        if bad_outliers > 0 {
            notes.push(format!("{bad_outliers} non-finite outliers not drawn"));
        }
        let capped = spec
            .boxes
            .iter()
            .filter(|b| b.outliers_total > b.outliers.len())
            .count();
        if capped > 0 {
            notes.push(format!(
                "{capped} boxes show only a sample of their outliers (extremes kept)"
            ));
        }
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for b in spec.boxes.iter().filter(|b| b.is_finite()) {
            let finite_outliers = b.outliers.iter().copied().filter(|v| v.is_finite());
            for v in [b.whisker_low, b.whisker_high, b.mean]
                .into_iter()
                .chain(finite_outliers)
            {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        if !lo.is_finite() {
            return Err(PlotError::NoFiniteData(
                "every box has non-finite statistics".into(),
            ));
        }
        let (ylo, yhi) = draw::padded_range(lo, hi, 0.05);
        let y = Scale::linear(ylo, yhi);

        let legend = vec![
            LegendEntry {
                label: "median".into(),
                color: MEDIAN,
                swatch: Swatch::Line {
                    line: LineKind::Solid,
                    marker: Marker::None,
                },
            },
            LegendEntry {
                label: "mean".into(),
                color: MEAN,
                swatch: Swatch::Line {
                    line: LineKind::Dashed,
                    marker: Marker::None,
                },
            },
            LegendEntry {
                label: "outliers".into(),
                color: OUTLIER,
                swatch: Swatch::Ring,
            },
        ];

        let top = Margins::title_height();
        let est_plot_h = match spec.figure.size {
            Some((_, h)) => h.saturating_sub(top + 80).max(100),
            None => PLOT_HEIGHT,
        };
        let y_ticks = draw::labelled_ticks(&y, (est_plot_h / 45) as usize);
        let left = Margins::left_for(draw::max_label_width(&y_ticks));
        let (legend_w, _) = draw::legend_size(&legend, est_plot_h);
        let right = legend_w + 30;
        let plot_w = match spec.figure.size {
            Some((w, _)) => w.saturating_sub(left + right).max(100),
            None => (n as u32)
                .saturating_mul(PX_PER_BOX)
                .clamp(600, MAX_WIDTH - left - right),
        };
        let plan = draw::plan_categories(&labels, f64::from(plot_w));
        let bottom = Margins::bottom_for(plan.extent);
        let (size, plot_h) = match spec.figure.size {
            Some((w, h)) => ((w, h), h.saturating_sub(top + bottom).max(100)),
            None => (
                (left + plot_w + right, top + PLOT_HEIGHT + bottom),
                PLOT_HEIGHT,
            ),
        };
        let axes = Axes {
            left: left as i32,
            top: top as i32,
            right: (left + plot_w) as i32,
            bottom: (top + plot_h) as i32,
            x: Scale::linear(-0.5, n as f64 - 0.5),
            y,
        };
        let skipped = bad_boxes + bad_outliers;
        let scene = BoxScene {
            spec,
            axes,
            size,
            y_ticks,
            plan,
            legend,
        };
        Ok((scene, skipped, notes))
    }
}

impl Scene for BoxScene<'_> {
    fn size(&self) -> (u32, u32) {
        self.size
    }

    fn title(&self) -> &str {
        &self.spec.figure.title
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> draw::DrawResult<DB> {
        let axes = &self.axes;
        draw::draw_y_axis(root, axes, &self.y_ticks, &self.spec.figure.y_label)?;
        let slot = f64::from(axes.width()) / self.spec.boxes.len() as f64;
        let half = (slot * 0.3).clamp(1.0, 40.0);
        let thick = if slot >= 8.0 { 2 } else { 1 };
        let ring = if slot >= 12.0 { 3 } else { 2 };
        let black = BLACK.stroke_width(1);
        for (i, b) in self
            .spec
            .boxes
            .iter()
            .enumerate()
            .filter(|(_, b)| b.is_finite())
        {
            let cx = axes.px(i as f64, 0.0).0;
            let (l, r) = ((cx - half).round() as i32, (cx + half).round() as i32);
            let c = cx.round() as i32;
            let y = |v: f64| axes.pt(0.0, v).1;
            let (yq1, yq3) = (y(b.q1), y(b.q3));
            root.draw(&PathElement::new(
                vec![(c, y(b.whisker_low)), (c, yq1)],
                black,
            ))?;
            root.draw(&PathElement::new(
                vec![(c, yq3), (c, y(b.whisker_high))],
                black,
            ))?;
            let cap = (half / 2.0).round().max(1.0) as i32;
            for w in [b.whisker_low, b.whisker_high] {
                root.draw(&PathElement::new(
                    vec![(c - cap, y(w)), (c + cap, y(w))],
                    black,
                ))?;
            }
            root.draw(&Rectangle::new([(l, yq3), (r, yq1)], black))?;
            let (ym, ya) = (axes.px(0.0, b.median).1, axes.px(0.0, b.mean).1);
            let (lf, rf) = (f64::from(l), f64::from(r));
            draw::draw_polyline(root, &[(lf, ym), (rf, ym)], MEDIAN, thick, LineKind::Solid)?;
            draw::draw_polyline(root, &[(lf, ya), (rf, ya)], MEAN, thick, LineKind::Dashed)?;
            for o in b.outliers.iter().filter(|v| v.is_finite()) {
                root.draw(&Circle::new(
                    (c, y(*o)),
                    ring,
                    OUTLIER.to_plotters().stroke_width(1),
                ))?;
            }
        }
        draw::draw_frame(root, axes)?;
        draw::draw_categories(root, axes, &self.plan)?;
        draw::draw_x_title(root, axes, &self.spec.figure.x_label, self.plan.extent)?;
        draw::draw_legend(
            root,
            (axes.right + 15, axes.top),
            &self.legend,
            (axes.bottom - axes.top) as u32,
        )?;
        draw::draw_title(root, axes, &self.spec.figure.title)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_keeps_extremes() {
        let xs: Vec<f64> = (0..100).map(f64::from).collect();
        let s = spread(&xs, 5);
        assert_eq!(s, vec![0.0, 24.0, 49.0, 74.0, 99.0]);
        assert_eq!(spread(&xs[..3], 5), vec![0.0, 1.0, 2.0]);
    }
}
