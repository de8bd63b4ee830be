//! Overlaid histograms of raw values on shared bins, with an optional threshold line and
//! a marker at the largest magnitude.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::draw::{self, Axes, LegendEntry, LineKind, Margins, Marker, Scale, Swatch};
use crate::error::PlotError;
use crate::figure::{Figure, Format, RenderInfo, Rgb, Scene, render};

/// One set of values; its bars are drawn semi-transparent over the others.
#[derive(Debug, Clone, PartialEq)]
pub struct HistSeries {
    pub label: String,
    pub values: Vec<f32>,
    /// `None` takes the next colour of the default cycle.
    pub color: Option<Rgb>,
}

impl HistSeries {
    pub fn new(label: impl Into<String>, values: Vec<f32>) -> Self {
        HistSeries {
            label: label.into(),
            values,
            color: None,
        }
    }
}

/// A labelled position on the x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct VLine {
    pub value: f64,
    pub label: String,
}

impl VLine {
    pub fn new(value: f64, label: impl Into<String>) -> Self {
        VLine {
            value,
            label: label.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub figure: Figure,
    pub series: Vec<HistSeries>,
    /// Number of equal-width bins spanning the finite values of all series.
    pub bins: usize,
    /// Logarithmic count axis (empty bins then sit on the floor of the axis).
    pub log_y: bool,
    /// Drawn as a red dashed vertical line (the calibration threshold).
    pub threshold: Option<VLine>,
    /// Drawn as a blue triangle on the x axis (where the largest |x| lies).
    pub max_marker: Option<VLine>,
}

impl Histogram {
    pub const DEFAULT_BINS: usize = 100;

    pub fn new(figure: Figure, series: Vec<HistSeries>) -> Self {
        Histogram {
            figure,
            series,
            bins: Self::DEFAULT_BINS,
            log_y: false,
            threshold: None,
            max_marker: None,
        }
    }
}

/// Draws `spec` to `path`. Non-finite values are left out (and counted in the info);
/// it fails only if no finite value is left at all.
pub fn histogram(spec: &Histogram, path: &Path, format: Format) -> Result<RenderInfo, PlotError> {
    let (scene, skipped, notes) = HistScene::new(spec)?;
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

/// Counts of `values` in `bins` equal bins over [lo, hi]; the last bin includes `hi`
/// (as numpy does). Non-finite values are ignored.
pub(crate) fn bin_counts(values: &[f32], lo: f64, hi: f64, bins: usize) -> Vec<u64> {
    let mut counts = vec![0u64; bins];
    let width = (hi - lo) / bins as f64;
    for v in values
        .iter()
        .map(|v| f64::from(*v))
        .filter(|v| v.is_finite())
    {
        let k = ((v - lo) / width).floor();
        if k >= 0.0 {
            counts[(k as usize).min(bins - 1)] += 1;
        }
    }
    counts
}

/// The bins a [`Histogram`] of these series draws: `bins + 1` equal-width edges spanning
/// the finite values of all series (a single distinct value gets a small range around
/// it), and each series' counts on them. `None` when there is no finite value or no
/// bin. Callers that report the numbers behind a figure use this to report exactly
/// what is drawn.
pub fn histogram_bins(series: &[&[f32]], bins: usize) -> Option<(Vec<f64>, Vec<Vec<u64>>)> {
    if bins == 0 {
        return None;
    }
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in series
        .iter()
        .flat_map(|s| s.iter())
        .map(|v| f64::from(*v))
        .filter(|v| v.is_finite())
    {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return None;
    }
    let (blo, bhi) = if hi > lo {
        (lo, hi)
    } else {
        draw::padded_range(lo, hi, 0.0)
    };
    let edges: Vec<f64> = (0..=bins)
        .map(|k| blo + (bhi - blo) * k as f64 / bins as f64)
        .collect();
    let counts = series
        .iter()
        .map(|s| bin_counts(s, blo, bhi, bins))
        .collect();
    Some((edges, counts))
}

struct HistScene<'a> {
    spec: &'a Histogram,
    colors: Vec<Rgb>,
    /// Bin edges shared by all series.
    edges: Vec<f64>,
    counts: Vec<Vec<u64>>,
    axes: Axes,
    size: (u32, u32),
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<(f64, String)>,
    legend: Vec<LegendEntry>,
}

const DEFAULT_PLOT: (u32, u32) = (820, 460);
const THRESHOLD_COLOR: Rgb = Rgb::RED;
const MARKER_COLOR: Rgb = Rgb::BLUE;

impl<'a> HistScene<'a> {
    fn new(spec: &'a Histogram) -> Result<(Self, usize, Vec<String>), PlotError> {
        if spec.series.is_empty() {
            return Err(PlotError::EmptyData("histogram has no series".into()));
        }
        if spec.bins == 0 {
            return Err(PlotError::InvalidSpec(
                "histogram needs at least one bin".into(),
            ));
        }
        let mut skipped = 0;
        let mut notes = Vec::new();
        for s in &spec.series {
            let bad = s.values.iter().filter(|v| !v.is_finite()).count();
            if bad > 0 {
                skipped += bad;
                notes.push(format!(
                    "series '{}': {bad} non-finite values not counted",
                    s.label
                ));
            }
        }
        let values: Vec<&[f32]> = spec.series.iter().map(|s| s.values.as_slice()).collect();
        let Some((edges, counts)) = histogram_bins(&values, spec.bins) else {
            let total: usize = spec.series.iter().map(|s| s.values.len()).sum();
            return Err(if total == 0 {
                PlotError::EmptyData("every histogram series is empty".into())
            } else {
                PlotError::NoFiniteData("every histogram value is NaN or infinite".into())
            });
        };
        let (blo, bhi) = (edges[0], edges[edges.len() - 1]);
        let max_count = counts.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;

        // The x range also covers the threshold and the marker, so they are never lost
        // off the edge.
        let (mut xlo, mut xhi) = (blo, bhi);
        for m in [&spec.threshold, &spec.max_marker].into_iter().flatten() {
            if m.value.is_finite() {
                xlo = xlo.min(m.value);
                xhi = xhi.max(m.value);
            } else {
                notes.push(format!("'{}' is not finite and was not drawn", m.label));
            }
        }
        let (xlo, xhi) = draw::padded_range(xlo, xhi, 0.03);
        let x = Scale::linear(xlo, xhi);
        let y = if spec.log_y {
            Scale {
                lo: 0.5,
                hi: max_count * 2.0,
                log: true,
            }
        } else {
            Scale::linear(0.0, max_count * 1.05)
        };

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
                swatch: Swatch::Fill,
            })
            .collect();
        if let Some(t) = spec.threshold.as_ref().filter(|t| t.value.is_finite()) {
            legend.push(LegendEntry {
                label: t.label.clone(),
                color: THRESHOLD_COLOR,
                swatch: Swatch::Line {
                    line: LineKind::Dashed,
                    marker: Marker::None,
                },
            });
        }
        if let Some(m) = spec.max_marker.as_ref().filter(|m| m.value.is_finite()) {
            legend.push(LegendEntry {
                label: m.label.clone(),
                color: MARKER_COLOR,
                swatch: Swatch::Line {
                    line: LineKind::None,
                    marker: Marker::TriangleUp,
                },
            });
        }

        let top = Margins::title_height();
        let bottom = Margins::bottom_for(draw::text_size(draw::TICK_SIZE, "Ag").1);
        let plot_h = match spec.figure.size {
            Some((_, h)) => h.saturating_sub(top + bottom).max(100),
            None => DEFAULT_PLOT.1,
        };
        let y_ticks = draw::labelled_count_ticks(&y, (plot_h / 45) as usize);
        let left = Margins::left_for(draw::max_label_width(&y_ticks));
        let (legend_w, _) = draw::legend_size(&legend, plot_h);
        let right = if legend_w > 0 { legend_w + 30 } else { 30 };
        let plot_w = match spec.figure.size {
            Some((w, _)) => w.saturating_sub(left + right).max(100),
            None => DEFAULT_PLOT.0,
        };
        let mut x_ticks = draw::labelled_ticks(&x, (plot_w / 90) as usize);
        // Long labels (scientific notation) need fewer ticks to stay apart.
        while x_ticks.len() > 2
            && draw::max_label_width(&x_ticks) as usize * x_ticks.len() * 13 / 10 > plot_w as usize
        {
            x_ticks = draw::labelled_ticks(&x, x_ticks.len() - 1);
        }
        let size = match spec.figure.size {
            Some(s) => s,
            None => (left + plot_w + right, top + plot_h + bottom),
        };
        let axes = Axes {
            left: left as i32,
            top: top as i32,
            right: (left + plot_w) as i32,
            bottom: (top + plot_h) as i32,
            x,
            y,
        };
        let scene = HistScene {
            spec,
            colors,
            edges,
            counts,
            axes,
            size,
            x_ticks,
            y_ticks,
            legend,
        };
        Ok((scene, skipped, notes))
    }
}

impl Scene for HistScene<'_> {
    fn size(&self) -> (u32, u32) {
        self.size
    }

    fn title(&self) -> &str {
        &self.spec.figure.title
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> draw::DrawResult<DB> {
        let axes = &self.axes;
        draw::draw_y_axis(root, axes, &self.y_ticks, &self.spec.figure.y_label)?;
        draw::draw_x_values(root, axes, &self.x_ticks)?;
        let floor = axes.y.lo;
        // All fills first, then all outlines, so no series hides another's shape.
        for (counts, color) in self.counts.iter().zip(&self.colors) {
            let fill = color.to_plotters().mix(0.35).filled();
            for (k, c) in counts.iter().enumerate() {
                if *c == 0 {
                    continue;
                }
                let (x0, y0) = axes.pt(self.edges[k], *c as f64);
                let (x1, y1) = axes.pt(self.edges[k + 1], floor);
                // Neighbouring bars share an edge pixel; leaving it to the next bar
                // avoids a darker double-blended seam.
                let x1 = if k + 1 < counts.len() && x1 > x0 {
                    x1 - 1
                } else {
                    x1
                };
                root.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill))?;
            }
        }
        for (counts, color) in self.counts.iter().zip(&self.colors) {
            let mut outline = vec![axes.px(self.edges[0], floor)];
            for (k, c) in counts.iter().enumerate() {
                let c = (*c as f64).max(floor);
                outline.push(axes.px(self.edges[k], c));
                outline.push(axes.px(self.edges[k + 1], c));
            }
            outline.push(axes.px(self.edges[counts.len()], floor));
            draw::draw_polyline(root, &outline, *color, 1, LineKind::Solid)?;
        }
        if let Some(t) = self.spec.threshold.as_ref().filter(|t| t.value.is_finite()) {
            let a = axes.px(t.value, axes.y.hi);
            let z = axes.px(t.value, floor);
            draw::draw_polyline(root, &[a, z], THRESHOLD_COLOR, 2, LineKind::Dashed)?;
        }
        draw::draw_frame(root, axes)?;
        if let Some(m) = self
            .spec
            .max_marker
            .as_ref()
            .filter(|m| m.value.is_finite())
        {
            let x = axes.pt(m.value, floor).0;
            // Sitting on the axis, fully inside the plot.
            draw::draw_marker(
                root,
                (x, axes.bottom - 7),
                Marker::TriangleUp,
                MARKER_COLOR,
                6,
            )?;
        }
        draw::draw_x_title(
            root,
            axes,
            &self.spec.figure.x_label,
            draw::text_size(draw::TICK_SIZE, "Ag").1,
        )?;
        draw::draw_legend(
            root,
            (axes.right + 15, axes.top),
            &self.legend,
            (axes.bottom - axes.top) as u32,
        )?;
        draw::draw_title(root, axes, &self.spec.figure.title)
    }
}

/// Several histograms side by side under one title (e.g. values on the left and their
/// differences, on a scale of their own, on the right).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramRow {
    pub title: String,
    /// Each panel keeps its own title, axes and legend.
    pub panels: Vec<Histogram>,
}

/// Draws `spec` to `path`: each panel as [`histogram`] would, left to right, below the
/// common title. Fails if any panel cannot be drawn.
pub fn histogram_row(
    spec: &HistogramRow,
    path: &Path,
    format: Format,
) -> Result<RenderInfo, PlotError> {
    if spec.panels.is_empty() {
        return Err(PlotError::EmptyData("histogram row has no panels".into()));
    }
    let mut scenes = Vec::new();
    let mut skipped = 0;
    let mut notes = Vec::new();
    for panel in &spec.panels {
        let (scene, s, n) = HistScene::new(panel)?;
        scenes.push(scene);
        skipped += s;
        notes.extend(n);
    }
    let top = if spec.title.is_empty() {
        0
    } else {
        Margins::title_height()
    };
    let width = scenes.iter().map(|s| s.size.0).sum();
    let height = top + scenes.iter().map(|s| s.size.1).max().unwrap_or(0);
    let scene = RowScene {
        title: &spec.title,
        scenes,
        top,
        size: (width, height),
    };
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

struct RowScene<'a> {
    title: &'a str,
    scenes: Vec<HistScene<'a>>,
    top: u32,
    size: (u32, u32),
}

impl Scene for RowScene<'_> {
    fn size(&self) -> (u32, u32) {
        self.size
    }

    fn title(&self) -> &str {
        self.title
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> draw::DrawResult<DB> {
        let mut x = 0;
        for scene in &self.scenes {
            let area = root
                .clone()
                .shrink((x, self.top), (scene.size.0, scene.size.1));
            scene.draw(&area)?;
            x += scene.size.0;
        }
        let whole = Axes {
            left: 0,
            top: 0,
            right: self.size.0 as i32,
            bottom: self.size.1 as i32,
            x: Scale::linear(0.0, 1.0),
            y: Scale::linear(0.0, 1.0),
        };
        draw::draw_title(root, &whole, self.title)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_follow_numpy() {
        // numpy.histogram([0, 1, 2, 3, 4], bins=4) -> [1, 1, 1, 2]
        assert_eq!(
            bin_counts(&[0.0, 1.0, 2.0, 3.0, 4.0], 0.0, 4.0, 4),
            vec![1, 1, 1, 2]
        );
        assert_eq!(
            bin_counts(&[f32::NAN, 0.5, f32::INFINITY], 0.0, 1.0, 2),
            vec![0, 1]
        );
    }
}
