//! Curves over categorical x labels (node names): accumulated-error curves and the
//! partial-quantization chart.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::draw::{
    self, Axes, CategoryPlan, LegendEntry, LineKind, Margins, Marker, Scale, Swatch,
};
use crate::error::PlotError;
use crate::figure::{Figure, Format, RenderInfo, Rgb, Scene, render};

/// One labelled curve; `values[i]` belongs to `x_labels[i]`. NaN/inf values leave a gap.
#[derive(Debug, Clone, PartialEq)]
pub struct LineSeries {
    pub label: String,
    pub values: Vec<f64>,
    /// `None` takes the next colour of the default cycle.
    pub color: Option<Rgb>,
    pub line: LineKind,
    pub marker: Marker,
}

impl LineSeries {
    /// A solid line without markers in the next default colour.
    pub fn new(label: impl Into<String>, values: Vec<f64>) -> Self {
        LineSeries {
            label: label.into(),
            values,
            color: None,
            line: LineKind::Solid,
            marker: Marker::None,
        }
    }

    pub fn color(mut self, color: Rgb) -> Self {
        self.color = Some(color);
        self
    }

    pub fn line(mut self, line: LineKind) -> Self {
        self.line = line;
        self
    }

    pub fn marker(mut self, marker: Marker) -> Self {
        self.marker = marker;
        self
    }
}

/// A dashed horizontal reference line across the whole chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub value: f64,
    pub label: String,
    pub color: Rgb,
}

impl Baseline {
    /// A blue dashed line, as the original tool draws the float model's value.
    pub fn new(value: f64, label: impl Into<String>) -> Self {
        Baseline {
            value,
            label: label.into(),
            color: Rgb::BLUE,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LineChart {
    pub figure: Figure,
    /// One per point, in order; long labels are shortened (end kept) and thinned out.
    pub x_labels: Vec<String>,
    pub series: Vec<LineSeries>,
    pub baseline: Option<Baseline>,
}

/// Draws `spec` to `path`. Non-finite values are left out (and counted in the info);
/// it fails only if no finite value is left at all.
pub fn line_chart(spec: &LineChart, path: &Path, format: Format) -> Result<RenderInfo, PlotError> {
    let (scene, skipped, notes) = LineScene::new(spec)?;
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

struct LineScene<'a> {
    spec: &'a LineChart,
    colors: Vec<Rgb>,
    axes: Axes,
    size: (u32, u32),
    y_ticks: Vec<(f64, String)>,
    plan: CategoryPlan,
    legend: Vec<LegendEntry>,
}

const DEFAULT_PLOT_HEIGHT: u32 = 480;

/// The plot width when the caller leaves the size to us: wide enough to print every
/// label of a small graph; past ~170 nodes the labels are thinned instead of growing
/// the image further.
fn default_plot_width(n: usize) -> u32 {
    (n.min(1000) as u32 * 14).clamp(640, 2400)
}

/// The plot height when the caller leaves the size to us: taller as the plot gets
/// wider, so a curve over hundreds of nodes is not squashed into a thin strip.
fn default_plot_height(n: usize) -> u32 {
    (DEFAULT_PLOT_HEIGHT + default_plot_width(n).saturating_sub(1200) / 8).min(630)
}

impl<'a> LineScene<'a> {
    fn new(spec: &'a LineChart) -> Result<(Self, usize, Vec<String>), PlotError> {
        let n = spec.x_labels.len();
        if n == 0 {
            return Err(PlotError::EmptyData("line chart has no x labels".into()));
        }
        if spec.series.is_empty() {
            return Err(PlotError::EmptyData("line chart has no series".into()));
        }
        let mut skipped = 0;
        let mut notes = Vec::new();
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for s in &spec.series {
            if s.values.len() != n {
                return Err(PlotError::InvalidSpec(format!(
                    "series '{}' has {} values for {} x labels",
                    s.label,
                    s.values.len(),
                    n
                )));
            }
            let bad = s.values.iter().filter(|v| !v.is_finite()).count();
            if bad > 0 {
                skipped += bad;
                notes.push(format!(
                    "series '{}': {bad} non-finite values not drawn",
                    s.label
                ));
            }
            for v in s.values.iter().filter(|v| v.is_finite()) {
                lo = lo.min(*v);
                hi = hi.max(*v);
            }
        }
        if !lo.is_finite() {
            return Err(PlotError::NoFiniteData(
                "every series value is NaN or infinite".into(),
            ));
        }
        if let Some(b) = &spec.baseline {
            if b.value.is_finite() {
                lo = lo.min(b.value);
                hi = hi.max(b.value);
            } else {
                notes.push(format!(
                    "baseline '{}' is not finite and was not drawn",
                    b.label
                ));
            }
        }

        let colors: Vec<Rgb> = spec
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| s.color.unwrap_or(Rgb::cycle(i)))
            .collect();
        let mut legend: Vec<LegendEntry> = spec
            .series
            .iter()
            .zip(&colors)
            .map(|(s, c)| LegendEntry {
                label: s.label.clone(),
                color: *c,
                swatch: Swatch::Line {
                    line: s.line,
                    marker: s.marker,
                },
            })
            .collect();
        if let Some(b) = spec.baseline.as_ref().filter(|b| b.value.is_finite()) {
            legend.push(LegendEntry {
                label: b.label.clone(),
                color: b.color,
                swatch: Swatch::Line {
                    line: LineKind::Dashed,
                    marker: Marker::None,
                },
            });
        }

        let top = Margins::title_height();
        let est_plot_h = match spec.figure.size {
            Some((_, h)) => h.saturating_sub(top + 200).max(100),
            None => default_plot_height(n),
        };
        let (ylo, yhi) = draw::padded_range(lo, hi, 0.06);
        let y = Scale::linear(ylo, yhi);
        let y_ticks = draw::labelled_ticks(&y, (est_plot_h / 45) as usize);
        let left = Margins::left_for(draw::max_label_width(&y_ticks));
        let (legend_w, _) = draw::legend_size(&legend, est_plot_h);
        let right = if legend_w > 0 { legend_w + 30 } else { 30 };
        let plot_w = match spec.figure.size {
            Some((w, _)) => w.saturating_sub(left + right).max(100),
            None => default_plot_width(n),
        };
        let plan = draw::plan_categories(&spec.x_labels, f64::from(plot_w));
        let bottom = Margins::bottom_for(plan.extent);
        let (width, height, plot_h) = match spec.figure.size {
            Some((w, h)) => (w, h, h.saturating_sub(top + bottom).max(100)),
            None => (
                left + plot_w + right,
                top + default_plot_height(n) + bottom,
                default_plot_height(n),
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
        let scene = LineScene {
            spec,
            colors,
            axes,
            size: (width, height.max(top + plot_h + bottom)),
            y_ticks,
            plan,
            legend,
        };
        Ok((scene, skipped, notes))
    }
}

/// Runs of consecutive finite values, as pixel points with their indices.
fn finite_runs(axes: &Axes, values: &[f64]) -> Vec<Vec<(f64, f64)>> {
    let mut runs = Vec::new();
    let mut run = Vec::new();
    for (i, v) in values.iter().enumerate() {
        if v.is_finite() {
            run.push(axes.px(i as f64, *v));
        } else if !run.is_empty() {
            runs.push(std::mem::take(&mut run));
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

impl Scene for LineScene<'_> {
    fn size(&self) -> (u32, u32) {
        self.size
    }

    fn title(&self) -> &str {
        &self.spec.figure.title
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> draw::DrawResult<DB> {
        let axes = &self.axes;
        draw::draw_y_axis(root, axes, &self.y_ticks, &self.spec.figure.y_label)?;
        for (s, color) in self.spec.series.iter().zip(&self.colors) {
            for run in finite_runs(axes, &s.values) {
                let round = |p: &(f64, f64)| (p.0.round() as i32, p.1.round() as i32);
                // A lone point between gaps would vanish without a marker.
                if run.len() == 1 && (s.marker == Marker::None || s.line == LineKind::None) {
                    let m = if s.marker == Marker::None {
                        Marker::Circle
                    } else {
                        s.marker
                    };
                    draw::draw_marker(root, round(&run[0]), m, *color, 3)?;
                    continue;
                }
                draw::draw_polyline(root, &run, *color, 2, s.line)?;
                for p in &run {
                    draw::draw_marker(root, round(p), s.marker, *color, 4)?;
                }
            }
        }
        if let Some(b) = self.spec.baseline.as_ref().filter(|b| b.value.is_finite()) {
            let a = axes.px(axes.x.lo, b.value);
            let z = axes.px(axes.x.hi, b.value);
            draw::draw_polyline(root, &[a, z], b.color, 2, LineKind::Dashed)?;
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
