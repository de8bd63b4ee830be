//! Text from the embedded font, for every backend.
//!
//! plotters' own `ab_glyph` text path places the baseline half a font size below the
//! anchor, so labels sit visibly off-centre, and its SVG backend writes `<text>` elements
//! that depend on whatever fonts the viewer has. [`TextBackend`] wraps a backend and
//! lays out every string itself with the embedded DejaVu Sans: on bitmaps it blends the
//! glyph coverage into pixels, on SVG it emits the glyph outlines as filled paths so the
//! file shows the same glyphs everywhere without any font installed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Once, OnceLock};

use ab_glyph::{Font, FontRef, GlyphId, OutlineCurve, PxScale, ScaleFont, point};
use plotters::style::{FontStyle, register_font};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontTransform,
};

/// DejaVu Sans, cut down to Latin/Greek/punctuation/maths; see assets/LICENSE-DejaVu.txt.
pub(crate) static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");

/// The family name every figure asks plotters for.
pub(crate) const FAMILY: &str = "sans-serif";

#[derive(Debug, thiserror::Error)]
#[error("the embedded font could not be parsed")]
pub struct FontParseError;

pub(crate) fn font() -> Result<&'static FontRef<'static>, FontParseError> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).ok())
        .as_ref()
        .ok_or(FontParseError)
}

/// Registers the embedded font with plotters under the generic family names, so that
/// whatever plotters measures on its own (without going through the backend) uses the
/// same metrics as what [`TextBackend`] draws.
pub(crate) fn register_with_plotters() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for family in [FAMILY, "serif", "monospace"] {
            for style in [FontStyle::Normal, FontStyle::Bold] {
                // A parse failure here is reported by `font()` at the first layout.
                let _ = register_font(family, style, FONT_BYTES);
            }
        }
    });
}

/// A string laid out on one line: glyph ids with their pen positions relative to the
/// start of the baseline, plus the box metrics.
struct Line {
    glyphs: Vec<(GlyphId, f32)>,
    width: f32,
    ascent: f32,
    descent: f32,
}

fn layout(font: &FontRef<'static>, size: f32, text: &str) -> Line {
    let scaled = font.as_scaled(PxScale::from(size));
    let mut glyphs = Vec::with_capacity(text.len());
    let mut pen = 0f32;
    let mut prev: Option<GlyphId> = None;
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = prev {
            pen += scaled.kern(p, id);
        }
        glyphs.push((id, pen));
        pen += scaled.h_advance(id);
        prev = Some(id);
    }
    Line {
        glyphs,
        width: pen,
        ascent: scaled.ascent(),
        descent: scaled.descent(),
    }
}

/// Size in pixels of `text` drawn horizontally at `size`.
pub(crate) fn measure(size: f64, text: &str) -> Result<(u32, u32), FontParseError> {
    let line = layout(font()?, size as f32, text);
    Ok((
        line.width.ceil() as u32,
        (line.ascent - line.descent).ceil() as u32,
    ))
}

/// Offset from the anchor point to the start of the baseline, before rotation. Same
/// anchor meaning as plotters: the box is placed by the anchor, then turned about it.
fn origin(line: &Line, h: HPos, v: VPos) -> (f32, f32) {
    let x = match h {
        HPos::Left => 0.0,
        HPos::Center => -line.width / 2.0,
        HPos::Right => -line.width,
    };
    let height = line.ascent - line.descent;
    let top = match v {
        VPos::Top => 0.0,
        VPos::Center => -height / 2.0,
        VPos::Bottom => -height,
    };
    (x, top + line.ascent)
}

/// plotters' `FontTransform`, which is not `Copy`.
#[derive(Clone, Copy)]
enum Turn {
    None,
    Cw90,
    Cw180,
    Cw270,
}

impl From<&FontTransform> for Turn {
    fn from(t: &FontTransform) -> Self {
        match t {
            FontTransform::None => Turn::None,
            FontTransform::Rotate90 => Turn::Cw90,
            FontTransform::Rotate180 => Turn::Cw180,
            FontTransform::Rotate270 => Turn::Cw270,
        }
    }
}

/// Same turns as `FontTransform::transform`.
fn rotate(t: Turn, x: f32, y: f32) -> (f32, f32) {
    match t {
        Turn::None => (x, y),
        Turn::Cw90 => (-y, x),
        Turn::Cw180 => (-x, -y),
        Turn::Cw270 => (y, -x),
    }
}

/// Where unrotated pixel cell (x, y) lands after rotation: the cell is a unit square, so
/// its image's top-left corner moves by one along the flipped axes.
fn rotate_cell(t: Turn, x: i32, y: i32) -> (i32, i32) {
    match t {
        Turn::None => (x, y),
        Turn::Cw90 => (-y - 1, x),
        Turn::Cw180 => (-x - 1, -y - 1),
        Turn::Cw270 => (y, -x - 1),
    }
}

/// One laid-out string and where it goes.
#[derive(Clone, Copy)]
struct Placed<'l> {
    line: &'l Line,
    font: &'static FontRef<'static>,
    size: f32,
    /// Start of the baseline relative to `pos`, before rotation.
    origin: (f32, f32),
    transform: Turn,
    pos: BackendCoord,
    color: BackendColor,
}

/// A drawing backend whose text comes from the embedded font; everything else is
/// passed through. With `svg_glyphs` set, text becomes SVG markup collected there
/// (the caller splices it into the document); without it, text is rasterised through
/// `draw_pixel` of the inner backend.
pub(crate) struct TextBackend<'a, DB: DrawingBackend> {
    inner: DB,
    svg_glyphs: Option<&'a RefCell<SvgText>>,
}

impl<'a, DB: DrawingBackend> TextBackend<'a, DB> {
    pub(crate) fn raster(inner: DB) -> Self {
        register_with_plotters();
        Self {
            inner,
            svg_glyphs: None,
        }
    }

    pub(crate) fn vector(inner: DB, sink: &'a RefCell<SvgText>) -> Self {
        register_with_plotters();
        Self {
            inner,
            svg_glyphs: Some(sink),
        }
    }

    fn rasterise(&mut self, job: &Placed<'_>) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Placed {
            line,
            font,
            size,
            origin: (ox, oy),
            transform: t,
            pos,
            color,
        } = *job;
        let scaled = font.as_scaled(PxScale::from(size));
        let (w, h) = self.inner.get_size();
        for &(id, pen) in &line.glyphs {
            let glyph = id.with_scale_and_position(scaled.scale(), point(ox + pen, oy));
            let Some(outlined) = font.outline_glyph(glyph) else {
                continue;
            };
            let bounds = outlined.px_bounds();
            let (bx, by) = (bounds.min.x as i32, bounds.min.y as i32);
            let mut cells = Vec::new();
            outlined.draw(|x, y, coverage| {
                if coverage > 0.0 {
                    cells.push((bx + x as i32, by + y as i32, coverage));
                }
            });
            for (x, y, coverage) in cells {
                let (rx, ry) = rotate_cell(t, x, y);
                let (px, py) = (pos.0 + rx, pos.1 + ry);
                if px < 0 || py < 0 || px >= w as i32 || py >= h as i32 {
                    continue;
                }
                let c = BackendColor {
                    alpha: color.alpha * f64::from(coverage.min(1.0)),
                    rgb: color.rgb,
                };
                self.inner.draw_pixel((px, py), c)?;
            }
        }
        Ok(())
    }
}

/// Text collected for an SVG document: each glyph's outline is defined once (in font
/// units) and every occurrence is a `<use>` with a transform, which keeps charts with
/// hundreds of node names small.
#[derive(Default)]
pub(crate) struct SvgText {
    outlines: BTreeMap<u16, String>,
    body: String,
}

/// Characters that cannot appear literally in XML attribute values or text.
pub(crate) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn outline_path(font: &FontRef<'static>, id: GlyphId) -> String {
    let mut d = String::new();
    let Some(outline) = font.outline(id) else {
        return d;
    };
    let mut current: Option<ab_glyph::Point> = None;
    for curve in &outline.curves {
        let (start, end) = match curve {
            OutlineCurve::Line(a, b) | OutlineCurve::Quad(a, _, b) => (*a, *b),
            OutlineCurve::Cubic(a, _, _, b) => (*a, *b),
        };
        // Outlines do not mark contour ends: a curve not starting where the previous
        // one ended opens a new contour.
        if current != Some(start) {
            if current.is_some() {
                d.push('Z');
            }
            let _ = write!(d, "M{} {}", start.x, start.y);
        }
        let _ = match curve {
            OutlineCurve::Line(_, b) => write!(d, "L{} {}", b.x, b.y),
            OutlineCurve::Quad(_, c, b) => write!(d, "Q{} {} {} {}", c.x, c.y, b.x, b.y),
            OutlineCurve::Cubic(_, c1, c2, b) => {
                write!(d, "C{} {} {} {} {} {}", c1.x, c1.y, c2.x, c2.y, b.x, b.y)
            }
        };
        current = Some(end);
    }
    if current.is_some() {
        d.push('Z');
    }
    d
}

impl SvgText {
    fn add(&mut self, text: &str, job: &Placed<'_>) {
        let Placed {
            line,
            font,
            size,
            origin: (ox, oy),
            transform: t,
            pos,
            color,
        } = *job;
        let scaled = font.as_scaled(PxScale::from(size));
        let (sx, sy) = (scaled.h_scale_factor(), scaled.v_scale_factor());
        // Columns of the turn's matrix, from where it sends the unit vectors.
        let (r00, r10) = rotate(t, 1.0, 0.0);
        let (r01, r11) = rotate(t, 0.0, 1.0);
        let (r, g, b) = color.rgb;
        let _ = writeln!(
            self.body,
            r##"<g aria-label="{}" fill="#{r:02X}{g:02X}{b:02X}" fill-opacity="{:.3}">"##,
            xml_escape(text),
            color.alpha
        );
        for &(id, pen) in &line.glyphs {
            let outline = self
                .outlines
                .entry(id.0)
                .or_insert_with(|| outline_path(font, id));
            if outline.is_empty() {
                continue;
            }
            // Font units are y-up, pixels y-down: scale y by -sy, then turn, then move.
            let (lx, ly) = (ox + pen, oy);
            let e = pos.0 as f32 + r00 * lx + r01 * ly;
            let f = pos.1 as f32 + r10 * lx + r11 * ly;
            let _ = writeln!(
                self.body,
                r##"<use href="#g{0}" xlink:href="#g{0}" transform="matrix({1:.5} {2:.5} {3:.5} {4:.5} {5:.2} {6:.2})"/>"##,
                id.0,
                r00 * sx,
                r10 * sx,
                -r01 * sy,
                -r11 * sy,
                e,
                f
            );
        }
        self.body.push_str("</g>\n");
    }

    /// The markup to put at the end of the document: glyph definitions, then the text.
    pub(crate) fn into_markup(self) -> String {
        let mut out = String::from(
            "<g class=\"text\" xmlns:xlink=\"http://www.w3.org/1999/xlink\">\n<defs>\n",
        );
        for (id, d) in self.outlines.iter().filter(|(_, d)| !d.is_empty()) {
            let _ = writeln!(out, r#"<path id="g{id}" d="{d}"/>"#);
        }
        out.push_str("</defs>\n");
        out.push_str(&self.body);
        out.push_str("</g>\n");
        out
    }
}

fn font_error<E: std::error::Error + Send + Sync>(e: FontParseError) -> DrawingErrorKind<E> {
    DrawingErrorKind::FontError(Box::new(e))
}

impl<DB: DrawingBackend> DrawingBackend for TextBackend<'_, DB> {
    type ErrorType = DB::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 || text.is_empty() {
            return Ok(());
        }
        let font = font().map_err(font_error)?;
        let size = style.size() as f32;
        let line = layout(font, size, text);
        let anchor = style.anchor();
        let job = Placed {
            origin: origin(&line, anchor.h_pos, anchor.v_pos),
            line: &line,
            font,
            size,
            transform: Turn::from(&style.transform()),
            pos,
            color,
        };
        match self.svg_glyphs {
            Some(sink) => {
                sink.borrow_mut().add(text, &job);
                Ok(())
            }
            None => self.rasterise(&job),
        }
    }

    fn estimate_text_size<TStyle: BackendTextStyle>(
        &self,
        text: &str,
        style: &TStyle,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        measure(style.size(), text).map_err(font_error)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        (iw, ih): (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, (iw, ih), src)
    }
}
