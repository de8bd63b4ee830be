//! Figures for the debugger: line charts over node names, overlaid histograms (alone or
//! as a row of panels) and per-channel box plots. Takes plain series and statistics,
//! knows nothing of ONNX.
//!
//! Every figure is a function taking a plain-data spec, an output path and a
//! [`Format`]; it renders in memory, writes a temp file in the target folder and renames
//! it over the path, and returns a [`RenderInfo`] saying what was left out (NaN/inf).
//!
//! Text always comes from DejaVu Sans embedded in the binary (see `assets/`): no system
//! font, fontconfig or freetype is consulted. In PNGs the glyphs are rasterised from it;
//! in SVGs every glyph outline is defined once as a `<path>` and each string is a group
//! of `<use>` references (with an `aria-label` holding the text, and the figure title in
//! `<title>`), never `<text>`: plotters' SVG backend writes `<text font-family=...>` and
//! leaves the viewer to find a matching font, so output would differ between machines.

mod boxplot;
mod draw;
mod error;
mod figure;
mod histogram;
mod line;
mod text;

pub use boxplot::{BoxPlot, BoxStats, box_plot, channel_stats};
pub use draw::{LineKind, Marker};
pub use error::PlotError;
pub use figure::{Figure, Format, RenderInfo, Rgb};
pub use histogram::{
    HistSeries, Histogram, HistogramRow, VLine, histogram, histogram_bins, histogram_row,
};
pub use line::{Baseline, LineChart, LineSeries, line_chart};
