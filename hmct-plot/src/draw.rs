//! Layout and drawing shared by the figures: the plot rectangle and its scales, ticks,
//! category axes, titles, legends, dashed lines and markers.
//!
//! Axes are drawn here rather than with plotters' mesh because the figures need things
//! the mesh does not do (thinned, rotated category labels sized from the font; a legend
//! outside the axes), and one layout routine for all of it keeps labels from colliding.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::figure::Rgb;
use crate::text::{FAMILY, measure};

pub(crate) const TITLE_SIZE: f64 = 20.0;
pub(crate) const DESC_SIZE: f64 = 16.0;
pub(crate) const TICK_SIZE: f64 = 13.0;
pub(crate) const LEGEND_SIZE: f64 = 13.0;
/// Longer category labels keep only their end (the distinctive part of node names).
pub(crate) const MAX_LABEL_CHARS: usize = 48;
const TICK_LEN: i32 = 5;
const GRID: RGBColor = RGBColor(224, 224, 224);

pub(crate) type DrawResult<DB> =
    Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

pub(crate) fn text_size(size: f64, text: &str) -> (u32, u32) {
    // Only a corrupt embedded font fails here; drawing reports that error later.
    measure(size, text).unwrap_or((text.chars().count() as u32 * size as u32 / 2, size as u32))
}

fn style(size: f64, color: Rgb) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&color.to_plotters())
}

/// `label` cut to `max` characters, keeping the end.
pub(crate) fn shorten_tail(label: &str, max: usize) -> String {
    let n = label.chars().count();
    if n <= max {
        return label.to_string();
    }
    let keep = max.saturating_sub(3);
    let tail: String = label.chars().skip(n - keep).collect();
    format!("...{tail}")
}

/// `text` cut to `max` characters, keeping both ends.
fn shorten_middle(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    let keep = max.saturating_sub(3);
    let head: String = text.chars().take(keep - keep / 2).collect();
    let tail: String = text.chars().skip(n - keep / 2).collect();
    format!("{head}...{tail}")
}

/// The title text and size that fit in `width` pixels: shrink the font first, then cut
/// the middle of the text.
pub(crate) fn fit_title(title: &str, width: u32) -> (String, f64) {
    let mut size = TITLE_SIZE;
    while size > 12.0 && text_size(size, title).0 > width {
        size -= 1.0;
    }
    let mut text = title.to_string();
    let mut max = title.chars().count();
    while max > 8 && text_size(size, &text).0 > width {
        max -= max / 10 + 1;
        text = shorten_middle(title, max);
    }
    (text, size)
}

/// A linear or base-10 logarithmic mapping of data values onto [0, 1].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
}

impl Scale {
    pub fn linear(lo: f64, hi: f64) -> Scale {
        Scale { lo, hi, log: false }
    }

    fn frac(&self, v: f64) -> f64 {
        let (v, lo, hi) = if self.log {
            (v.max(self.lo).log10(), self.lo.log10(), self.hi.log10())
        } else {
            (v, self.lo, self.hi)
        };
        if hi > lo { (v - lo) / (hi - lo) } else { 0.5 }
    }
}

/// The plot rectangle in pixels and the scales that map data into it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axes {
    pub left: i32,
    pub top: i32,
    pub right: i32,
    pub bottom: i32,
    pub x: Scale,
    pub y: Scale,
}

impl Axes {
    pub fn px(&self, x: f64, y: f64) -> (f64, f64) {
        let w = f64::from(self.right - self.left);
        let h = f64::from(self.bottom - self.top);
        (
            f64::from(self.left) + self.x.frac(x) * w,
            f64::from(self.bottom) - self.y.frac(y) * h,
        )
    }

    pub fn pt(&self, x: f64, y: f64) -> (i32, i32) {
        let (x, y) = self.px(x, y);
        (x.round() as i32, y.round() as i32)
    }

    pub fn width(&self) -> i32 {
        self.right - self.left
    }
}

/// Sizes of the margins around the plot rectangle.
pub(crate) struct Margins;

impl Margins {
    /// Top margin holding the title.
    pub fn title_height() -> u32 {
        text_size(TITLE_SIZE, "Ag").1 + 24
    }

    /// Left margin for y tick labels of `label_width` pixels plus the y axis title.
    pub fn left_for(label_width: u32) -> u32 {
        12 + text_size(DESC_SIZE, "Ag").1 + 10 + label_width + TICK_LEN as u32 + 6
    }

    /// Bottom margin for x tick labels reaching `extent` pixels below the axis plus the
    /// x axis title.
    pub fn bottom_for(extent: u32) -> u32 {
        TICK_LEN as u32 + 6 + extent + 10 + text_size(DESC_SIZE, "Ag").1 + 12
    }
}

/// "Nice" ticks (multiples of 1, 2 or 5 times a power of ten) inside [lo, hi], at most
/// `max_count` of them (and at least two when the range allows).
pub(crate) fn nice_ticks(lo: f64, hi: f64, max_count: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater)
        || !lo.is_finite()
        || !hi.is_finite()
    {
        return vec![lo];
    }
    let max_count = max_count.max(2);
    let span = hi - lo;
    let mut step = 10f64.powf((span / max_count as f64).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0].iter().cycle() {
        let s = step * m;
        if span / s <= (max_count - 1) as f64 + 1e-9 {
            step = s;
            break;
        }
        if *m == 10.0 {
            step *= 10.0;
        }
    }
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Powers of ten inside [lo, hi] (lo > 0), skipping exponents if there are too many.
pub(crate) fn log_ticks(lo: f64, hi: f64, max_count: usize) -> Vec<f64> {
    let (a, b) = (lo.log10().ceil() as i32, hi.log10().floor() as i32);
    if b < a {
        return vec![lo];
    }
    let n = (b - a + 1) as usize;
    let stride = n.div_ceil(max_count.max(2)).max(1);
    (a..=b).step_by(stride).map(|e| 10f64.powi(e)).collect()
}

/// How tick values are printed: fixed decimals, or scientific for very large or tiny
/// magnitudes, with just enough digits for neighbouring ticks to differ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NumberFormat {
    scientific: bool,
    decimals: usize,
    zero_below: f64,
}

impl NumberFormat {
    pub fn for_ticks(ticks: &[f64]) -> NumberFormat {
        let step = ticks
            .windows(2)
            .map(|w| (w[1] - w[0]).abs())
            .filter(|s| *s > 0.0)
            .fold(f64::INFINITY, f64::min);
        let max_abs = ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
        let step = if step.is_finite() {
            step
        } else if max_abs > 0.0 {
            max_abs
        } else {
            1.0
        };
        let step_exp = step.log10().floor();
        let scientific = max_abs >= 1e5 || (max_abs > 0.0 && max_abs < 1e-3);
        let decimals = if scientific {
            (max_abs.log10().floor() - step_exp).clamp(0.0, 6.0) as usize
        } else {
            (-step_exp).clamp(0.0, 10.0) as usize
        };
        NumberFormat {
            scientific,
            decimals,
            zero_below: step * 1e-6,
        }
    }

    pub fn format(&self, v: f64) -> String {
        let v = if v.abs() < self.zero_below { 0.0 } else { v };
        if self.scientific && v != 0.0 {
            format!("{:.*e}", self.decimals, v)
        } else if self.scientific {
            "0".to_string()
        } else {
            format!("{:.*}", self.decimals, v)
        }
    }
}

/// Which category labels to print and how.
#[derive(Debug, Clone)]
pub(crate) struct CategoryPlan {
    /// Index of the category and its (possibly shortened) label.
    pub shown: Vec<(usize, String)>,
    /// Labels read bottom-to-top, hanging below their tick.
    pub rotated: bool,
    /// How far the labels reach below the axis, in pixels.
    pub extent: u32,
}

/// Smallest of 1, 2, 5, 10, 20, 50, ... that is at least `x`.
pub(crate) fn nice_step(x: f64) -> usize {
    let mut step = 1usize;
    let mut mults = [2usize, 5, 10].iter().cycle();
    let mut base = 1usize;
    while (step as f64) < x && step < usize::MAX / 10 {
        let m = *mults.next().unwrap_or(&10);
        step = base * m;
        if m == 10 {
            base *= 10;
        }
    }
    step
}

/// Chooses category labels for `plot_width` pixels: all of them horizontally if they
/// fit; otherwise every `step`-th, horizontal if they are short (numbers), else rotated.
pub(crate) fn plan_categories(labels: &[String], plot_width: f64) -> CategoryPlan {
    let texts: Vec<String> = labels
        .iter()
        .map(|l| shorten_tail(l, MAX_LABEL_CHARS))
        .collect();
    let n = texts.len().max(1);
    let slot = plot_width / n as f64;
    let widths: Vec<u32> = texts.iter().map(|t| text_size(TICK_SIZE, t).0).collect();
    let max_w = widths.iter().copied().max().unwrap_or(0);
    let line_h = text_size(TICK_SIZE, "Ag").1;
    let horizontal_step = nice_step(f64::from(max_w + 10) / slot);
    let rotated = horizontal_step > 1 && max_w > 4 * line_h;
    let step = if rotated {
        nice_step(f64::from(line_h + 3) / slot)
    } else {
        horizontal_step
    };
    let shown: Vec<(usize, String)> = texts.into_iter().enumerate().step_by(step).collect();
    let extent = if rotated {
        shown.iter().map(|(i, _)| widths[*i]).max().unwrap_or(0)
    } else {
        line_h
    };
    CategoryPlan {
        shown,
        rotated,
        extent,
    }
}

/// Frame, y ticks with grid lines, and both axis titles.
pub(crate) fn draw_y_axis<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    ticks: &[(f64, String)],
    y_label: &str,
) -> DrawResult<DB> {
    for (v, text) in ticks {
        let y = axes.pt(axes.x.lo, *v).1;
        if y < axes.top || y > axes.bottom {
            continue;
        }
        area.draw(&PathElement::new(
            vec![(axes.left, y), (axes.right, y)],
            GRID,
        ))?;
        area.draw(&PathElement::new(
            vec![(axes.left - TICK_LEN, y), (axes.left, y)],
            BLACK,
        ))?;
        let s = style(TICK_SIZE, Rgb::BLACK).pos(Pos::new(HPos::Right, VPos::Center));
        area.draw_text(text, &s, (axes.left - TICK_LEN - 4, y))?;
    }
    if !y_label.is_empty() {
        let s = style(DESC_SIZE, Rgb::BLACK)
            .transform(FontTransform::Rotate270)
            .pos(Pos::new(HPos::Center, VPos::Top));
        let (text, _) = fit_label(y_label, DESC_SIZE, (axes.bottom - axes.top) as u32);
        area.draw_text(&text, &s, (12, (axes.top + axes.bottom) / 2))?;
    }
    Ok(())
}

fn fit_label(text: &str, size: f64, width: u32) -> (String, u32) {
    let mut max = text.chars().count();
    let mut out = text.to_string();
    while max > 8 && text_size(size, &out).0 > width {
        max -= max / 10 + 1;
        out = shorten_middle(text, max);
    }
    let w = text_size(size, &out).0;
    (out, w)
}

/// x axis title, centred under the plot, below labels reaching `extent` pixels.
pub(crate) fn draw_x_title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    x_label: &str,
    extent: u32,
) -> DrawResult<DB> {
    if x_label.is_empty() {
        return Ok(());
    }
    let (text, _) = fit_label(x_label, DESC_SIZE, axes.width() as u32);
    let y = axes.bottom + TICK_LEN + 6 + extent as i32 + 10;
    let s = style(DESC_SIZE, Rgb::BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    area.draw_text(&text, &s, ((axes.left + axes.right) / 2, y))
}

/// Numeric x ticks (and their vertical grid lines), labels centred under the ticks.
pub(crate) fn draw_x_values<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    ticks: &[(f64, String)],
) -> DrawResult<DB> {
    for (v, text) in ticks {
        let x = axes.pt(*v, axes.y.lo).0;
        if x < axes.left || x > axes.right {
            continue;
        }
        area.draw(&PathElement::new(
            vec![(x, axes.top), (x, axes.bottom)],
            GRID,
        ))?;
        area.draw(&PathElement::new(
            vec![(x, axes.bottom), (x, axes.bottom + TICK_LEN)],
            BLACK,
        ))?;
        let s = style(TICK_SIZE, Rgb::BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        area.draw_text(text, &s, (x, axes.bottom + TICK_LEN + 4))?;
    }
    Ok(())
}

/// Category ticks at x = index, as planned by [`plan_categories`].
pub(crate) fn draw_categories<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    plan: &CategoryPlan,
) -> DrawResult<DB> {
    for (i, text) in &plan.shown {
        let x = axes.pt(*i as f64, axes.y.lo).0;
        area.draw(&PathElement::new(
            vec![(x, axes.bottom), (x, axes.bottom + TICK_LEN)],
            BLACK,
        ))?;
        let y = axes.bottom + TICK_LEN + 4;
        let s = if plan.rotated {
            // Right end at the tick: after the quarter turn the text reads upwards and
            // hangs below the axis.
            style(TICK_SIZE, Rgb::BLACK)
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Right, VPos::Center))
        } else {
            style(TICK_SIZE, Rgb::BLACK).pos(Pos::new(HPos::Center, VPos::Top))
        };
        area.draw_text(text, &s, (x, y))?;
    }
    Ok(())
}

pub(crate) fn draw_frame<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
) -> DrawResult<DB> {
    area.draw(&Rectangle::new(
        [(axes.left, axes.top), (axes.right, axes.bottom)],
        BLACK.stroke_width(1),
    ))
}

/// The title, centred over the plot rectangle.
pub(crate) fn draw_title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    title: &str,
) -> DrawResult<DB> {
    if title.is_empty() {
        return Ok(());
    }
    let (w, _) = area.dim_in_pixel();
    let (text, size) = fit_title(title, w.saturating_sub(20));
    let tw = text_size(size, &text).0 as i32;
    // Very wide figures (thousands of boxes) are read by scrolling from the left: the
    // title goes where the reader starts, above the y axis.
    if axes.width() > 2400 {
        let s = style(size, Rgb::BLACK).pos(Pos::new(HPos::Left, VPos::Top));
        return area.draw_text(&text, &s, (axes.left, 12));
    }
    // Centred on the axes when that fits inside the image, else on the image.
    let centre = (axes.left + axes.right) / 2;
    let centre = centre.clamp(10 + tw / 2, (w as i32 - 10 - tw / 2).max(10 + tw / 2));
    let s = style(size, Rgb::BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    area.draw_text(&text, &s, (centre, 12))
}

/// How a series is stroked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LineKind {
    #[default]
    Solid,
    Dashed,
    /// Markers only.
    None,
}

/// The symbol drawn at each point of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Marker {
    #[default]
    None,
    Circle,
    Cross,
    TriangleUp,
    Square,
}

/// Splits a polyline into dashes of `on` pixels separated by `off` pixels.
pub(crate) fn dash(points: &[(f64, f64)], on: f64, off: f64) -> Vec<Vec<(i32, i32)>> {
    let round = |p: (f64, f64)| (p.0.round() as i32, p.1.round() as i32);
    let mut dashes = Vec::new();
    let mut current: Vec<(i32, i32)> = Vec::new();
    let mut drawing = true;
    let mut left = on;
    for w in points.windows(2) {
        let (mut a, b) = (w[0], w[1]);
        if drawing && current.is_empty() {
            current.push(round(a));
        }
        let mut seg = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        while seg > left {
            let t = left / seg;
            let p = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            if drawing {
                current.push(round(p));
                dashes.push(std::mem::take(&mut current));
            } else {
                current.push(round(p));
            }
            drawing = !drawing;
            left = if drawing { on } else { off };
            seg -= ((p.0 - a.0).powi(2) + (p.1 - a.1).powi(2)).sqrt();
            a = p;
            if !drawing {
                current.clear();
            }
        }
        left -= seg;
        if drawing {
            current.push(round(b));
        }
    }
    if drawing && current.len() > 1 {
        dashes.push(current);
    }
    dashes
}

/// A solid or dashed polyline in pixel coordinates.
pub(crate) fn draw_polyline<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    points: &[(f64, f64)],
    color: Rgb,
    width: u32,
    kind: LineKind,
) -> DrawResult<DB> {
    let stroke = color.to_plotters().stroke_width(width);
    match kind {
        LineKind::None => Ok(()),
        LineKind::Solid => {
            let pts: Vec<(i32, i32)> = points
                .iter()
                .map(|p| (p.0.round() as i32, p.1.round() as i32))
                .collect();
            if pts.len() == 1 {
                return Ok(());
            }
            area.draw(&PathElement::new(pts, stroke))
        }
        LineKind::Dashed => {
            let on = 6.0 + 2.0 * f64::from(width);
            for d in dash(points, on, on * 0.6) {
                area.draw(&PathElement::new(d, stroke))?;
            }
            Ok(())
        }
    }
}

pub(crate) fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    marker: Marker,
    color: Rgb,
    radius: i32,
) -> DrawResult<DB> {
    let c = color.to_plotters();
    let r = radius;
    match marker {
        Marker::None => Ok(()),
        Marker::Circle => area.draw(&Circle::new((x, y), r, c.filled())),
        Marker::Square => area.draw(&Rectangle::new(
            [(x - r, y - r), (x + r, y + r)],
            c.filled(),
        )),
        Marker::TriangleUp => area.draw(&Polygon::new(
            vec![(x, y - r - 1), (x - r - 1, y + r), (x + r + 1, y + r)],
            c.filled(),
        )),
        Marker::Cross => {
            area.draw(&PathElement::new(
                vec![(x - r, y - r), (x + r, y + r)],
                c.stroke_width(2),
            ))?;
            area.draw(&PathElement::new(
                vec![(x - r, y + r), (x + r, y - r)],
                c.stroke_width(2),
            ))
        }
    }
}

/// What a legend entry shows next to its label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Swatch {
    Line {
        line: LineKind,
        marker: Marker,
    },
    /// A semi-transparent filled box with a solid outline, like histogram bars.
    Fill,
    /// An open circle, like box-plot outliers.
    Ring,
}

#[derive(Debug, Clone)]
pub(crate) struct LegendEntry {
    pub label: String,
    pub color: Rgb,
    pub swatch: Swatch,
}

const SWATCH_W: u32 = 34;
const LEGEND_PAD: u32 = 8;

fn legend_row_height() -> u32 {
    text_size(LEGEND_SIZE, "Ag").1 + 7
}

fn legend_label(label: &str) -> String {
    shorten_tail(label, MAX_LABEL_CHARS)
}

/// Width of the legend box for `entries` when it may be `max_height` pixels tall (it
/// wraps into more columns when one is not enough).
pub(crate) fn legend_size(entries: &[LegendEntry], max_height: u32) -> (u32, u32) {
    if entries.is_empty() {
        return (0, 0);
    }
    let row = legend_row_height();
    let rows = ((max_height.saturating_sub(2 * LEGEND_PAD)) / row).max(1) as usize;
    let cols = entries.len().div_ceil(rows);
    let rows = entries.len().div_ceil(cols);
    let col_w = entries
        .iter()
        .map(|e| text_size(LEGEND_SIZE, &legend_label(&e.label)).0)
        .max()
        .unwrap_or(0)
        + SWATCH_W
        + 8
        + 12;
    (
        cols as u32 * col_w + 2 * LEGEND_PAD,
        rows as u32 * row + 2 * LEGEND_PAD,
    )
}

/// Draws the legend box with its top-left corner at `(x, y)`.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    entries: &[LegendEntry],
    max_height: u32,
) -> DrawResult<DB> {
    if entries.is_empty() {
        return Ok(());
    }
    let (w, h) = legend_size(entries, max_height);
    let row = legend_row_height() as i32;
    let rows = ((h - 2 * LEGEND_PAD) as i32 / row).max(1) as usize;
    let cols = entries.len().div_ceil(rows);
    let col_w = ((w - 2 * LEGEND_PAD) as usize / cols) as i32;
    area.draw(&Rectangle::new(
        [(x, y), (x + w as i32, y + h as i32)],
        WHITE.filled(),
    ))?;
    area.draw(&Rectangle::new(
        [(x, y), (x + w as i32, y + h as i32)],
        RGBColor(190, 190, 190).stroke_width(1),
    ))?;
    for (k, e) in entries.iter().enumerate() {
        let (c, r) = ((k / rows) as i32, (k % rows) as i32);
        let sx = x + LEGEND_PAD as i32 + c * col_w;
        let cy = y + LEGEND_PAD as i32 + r * row + row / 2;
        let sw = SWATCH_W as i32;
        match e.swatch {
            Swatch::Line { line, marker } => {
                let pts = [
                    (f64::from(sx), f64::from(cy)),
                    (f64::from(sx + sw), f64::from(cy)),
                ];
                draw_polyline(area, &pts, e.color, 2, line)?;
                draw_marker(area, (sx + sw / 2, cy), marker, e.color, 4)?;
            }
            Swatch::Fill => {
                let rect = [(sx + 4, cy - 6), (sx + sw - 4, cy + 6)];
                area.draw(&Rectangle::new(
                    rect,
                    e.color.to_plotters().mix(0.4).filled(),
                ))?;
                area.draw(&Rectangle::new(rect, e.color.to_plotters().stroke_width(1)))?;
            }
            Swatch::Ring => {
                area.draw(&Circle::new(
                    (sx + sw / 2, cy),
                    4,
                    e.color.to_plotters().stroke_width(1),
                ))?;
            }
        }
        let s = style(LEGEND_SIZE, Rgb::BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        area.draw_text(&legend_label(&e.label), &s, (sx + sw + 8, cy))?;
    }
    Ok(())
}

/// Value ticks for `scale` with their labels.
pub(crate) fn labelled_ticks(scale: &Scale, max_count: usize) -> Vec<(f64, String)> {
    if scale.log {
        return log_ticks(scale.lo, scale.hi, max_count)
            .into_iter()
            .map(|t| {
                let e = t.log10().round() as i32;
                let label = if (0..=4).contains(&e) {
                    format!("{t}")
                } else {
                    format!("1e{e}")
                };
                (t, label)
            })
            .collect();
    }
    let ticks = nice_ticks(scale.lo, scale.hi, max_count);
    let fmt = NumberFormat::for_ticks(&ticks);
    ticks.iter().map(|t| (*t, fmt.format(*t))).collect()
}

/// Ticks of a count axis: whole numbers only, since a tick at 0.2 of a count means
/// nothing (a histogram whose tallest bin holds one value got 0.0, 0.2, ... 1.0).
pub(crate) fn labelled_count_ticks(scale: &Scale, max_count: usize) -> Vec<(f64, String)> {
    let ticks = labelled_ticks(scale, max_count);
    if ticks.iter().all(|(t, _)| t.fract() == 0.0) {
        return ticks;
    }
    ticks
        .into_iter()
        .filter(|(t, _)| t.fract() == 0.0)
        .map(|(t, _)| (t, format!("{t:.0}")))
        .collect()
}

/// Widest tick label, in pixels.
pub(crate) fn max_label_width(ticks: &[(f64, String)]) -> u32 {
    ticks
        .iter()
        .map(|(_, t)| text_size(TICK_SIZE, t).0)
        .max()
        .unwrap_or(0)
}

/// [lo, hi] widened by `pad` of its span on each side; a single value gets a small
/// range around it so it does not sit on the frame.
pub(crate) fn padded_range(lo: f64, hi: f64, pad: f64) -> (f64, f64) {
    if hi > lo {
        let p = (hi - lo) * pad;
        (lo - p, hi + p)
    } else {
        let p = if lo == 0.0 { 1.0 } else { lo.abs() * 0.05 };
        (lo - p, hi + p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_ticks_are_whole_numbers() {
        let labels = |hi: f64| -> Vec<String> {
            labelled_count_ticks(&Scale::linear(0.0, hi), 8)
                .into_iter()
                .map(|(_, l)| l)
                .collect()
        };
        assert_eq!(labels(1.05), ["0", "1"]);
        assert_eq!(labels(3.15), ["0", "1", "2", "3"]);
        // Large counts keep the ordinary labels.
        assert_eq!(
            labels(2100.0),
            labelled_ticks(&Scale::linear(0.0, 2100.0), 8)
                .into_iter()
                .map(|(_, l)| l)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn nice_ticks_are_round_and_inside() {
        assert_eq!(
            nice_ticks(0.0, 10.0, 6),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        let t = nice_ticks(0.9991, 1.0001, 6);
        assert!(t.len() >= 2 && t.len() <= 6, "{t:?}");
        assert!(t.iter().all(|v| (0.9991..=1.0001).contains(v)));
        let fmt = NumberFormat::for_ticks(&t);
        let labels: Vec<String> = t.iter().map(|v| fmt.format(*v)).collect();
        let mut dedup = labels.clone();
        dedup.dedup();
        assert_eq!(labels, dedup, "neighbouring labels must differ");
        assert_eq!(fmt.format(1.0), "1.0000");
    }

    #[test]
    fn tiny_and_huge_ticks_go_scientific() {
        let t = nice_ticks(0.0, 3e-6, 5);
        let fmt = NumberFormat::for_ticks(&t);
        assert!(fmt.format(2e-6).contains('e'), "{}", fmt.format(2e-6));
        assert_eq!(fmt.format(0.0), "0");
        let t = nice_ticks(0.0, 4e6, 5);
        assert_eq!(NumberFormat::for_ticks(&t).format(2e6), "2e6");
    }

    #[test]
    fn log_ticks_are_powers_of_ten() {
        assert_eq!(log_ticks(0.5, 2000.0, 10), vec![1.0, 10.0, 100.0, 1000.0]);
        assert!(log_ticks(1.0, 1e20, 5).len() <= 5);
    }

    #[test]
    fn nice_step_sequence() {
        let got: Vec<usize> = [0.3, 1.0, 1.5, 2.1, 4.9, 7.0, 11.0, 49.0]
            .iter()
            .map(|x| nice_step(*x))
            .collect();
        assert_eq!(got, vec![1, 1, 2, 5, 5, 10, 20, 50]);
    }

    #[test]
    fn shortening_keeps_the_end() {
        let s = shorten_tail(
            "/encoder/_blocks.0/_depthwise_conv/Conv_output_0_really_long_name",
            20,
        );
        assert_eq!(s.chars().count(), 20);
        assert!(s.starts_with("...") && s.ends_with("long_name"));
        assert_eq!(shorten_tail("short", 20), "short");
    }

    #[test]
    fn dashes_alternate() {
        let d = dash(&[(0.0, 0.0), (100.0, 0.0)], 10.0, 5.0);
        assert_eq!(d.len(), 7);
        assert_eq!(d[0], vec![(0, 0), (10, 0)]);
        assert_eq!(d[1], vec![(15, 0), (25, 0)]);
    }

    #[test]
    fn many_long_categories_are_thinned_and_rotated() {
        let labels: Vec<String> = (0..600)
            .map(|i| format!("/encoder/_blocks.{i}/_depthwise_conv/Conv"))
            .collect();
        let plan = plan_categories(&labels, 2000.0);
        assert!(plan.rotated);
        assert!(
            plan.shown.len() < 200 && plan.shown.len() > 20,
            "{}",
            plan.shown.len()
        );
        let few = vec!["none".to_string(), "Conv_2".into(), "Conv_7".into()];
        let plan = plan_categories(&few, 800.0);
        assert!(!plan.rotated);
        assert_eq!(plan.shown.len(), 3);
    }
}
