//! What every figure shares: output format, titles, colours, the returned info and the
//! render-then-rename pipeline.

use std::cell::RefCell;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use image::ImageEncoder as _;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::PlotError;
use crate::text::{SvgText, TextBackend, xml_escape};

/// Output file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Png,
    /// SVG with all text drawn as filled paths (no font needed to view it).
    Svg,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Svg => "svg",
        }
    }

    /// The format a file name asks for by its extension, if it is one we write.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "png" => Some(Format::Png),
            "svg" => Some(Format::Svg),
            _ => None,
        }
    }
}

/// An RGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    // Close to matplotlib's single-letter colours ('r', 'b', 'g') that the original
    // tool's reference lines use, and distinct from every colour of the cycle.
    pub const BLACK: Rgb = Rgb(0, 0, 0);
    pub const RED: Rgb = Rgb(230, 0, 0);
    pub const BLUE: Rgb = Rgb(0, 0, 230);
    pub const GREEN: Rgb = Rgb(0, 150, 0);
    pub const GRAY: Rgb = Rgb(127, 127, 127);

    /// The `i`-th colour of the default cycle (matplotlib's "tab10", then "tab20"'s
    /// light shades), so figures look familiar to users of the original tool.
    pub fn cycle(i: usize) -> Rgb {
        const CYCLE: [Rgb; 20] = [
            Rgb(31, 119, 180),
            Rgb(255, 127, 14),
            Rgb(44, 160, 44),
            Rgb(214, 39, 40),
            Rgb(148, 103, 189),
            Rgb(140, 86, 75),
            Rgb(227, 119, 194),
            Rgb(127, 127, 127),
            Rgb(188, 189, 34),
            Rgb(23, 190, 207),
            Rgb(174, 199, 232),
            Rgb(255, 187, 120),
            Rgb(152, 223, 138),
            Rgb(255, 152, 150),
            Rgb(197, 176, 213),
            Rgb(196, 156, 148),
            Rgb(247, 182, 210),
            Rgb(199, 199, 199),
            Rgb(219, 219, 141),
            Rgb(158, 218, 229),
        ];
        CYCLE[i % CYCLE.len()]
    }

    pub(crate) fn to_plotters(self) -> RGBColor {
        RGBColor(self.0, self.1, self.2)
    }
}

/// Texts and size common to all figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figure {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Image size in pixels; `None` lets the figure pick one that suits its data.
    pub size: Option<(u32, u32)>,
}

impl Figure {
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        Figure {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            size: None,
        }
    }

    pub fn with_size(mut self, width: u32, height: u32) -> Self {
        self.size = Some((width, height));
        self
    }
}

/// What was written, and what had to be left out of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderInfo {
    pub path: PathBuf,
    pub format: Format,
    pub width: u32,
    pub height: u32,
    /// NaN or infinite values that were not drawn.
    pub skipped_non_finite: usize,
    /// One line per thing a reader of the figure should know was altered or left out.
    pub notes: Vec<String>,
}

/// Largest image we agree to allocate (an RGB buffer of this many pixels is ~400 MB).
const MAX_PIXELS: u64 = 16_384 * 8_192;

/// A figure ready to draw on any backend.
pub(crate) trait Scene {
    fn size(&self) -> (u32, u32);
    fn title(&self) -> &str;
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>;
}

fn draw_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draws `scene` and writes it to `path` in `format`, replacing the file only once the
/// whole image is ready (temp file in the same folder, then rename).
pub(crate) fn render(
    scene: &impl Scene,
    path: &Path,
    format: Format,
) -> Result<(u32, u32), PlotError> {
    let (width, height) = scene.size();
    if width == 0 || height == 0 || u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(PlotError::TooLarge { width, height });
    }
    let bytes = match format {
        Format::Png => render_png(scene, width, height)?,
        Format::Svg => render_svg(scene, width, height, scene.title())?.into_bytes(),
    };
    write_atomically(path, &bytes)?;
    Ok((width, height))
}

fn render_png(scene: &impl Scene, width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let mut pixels = vec![255u8; width as usize * height as usize * 3];
    {
        let backend = TextBackend::raster(BitMapBackend::with_buffer(&mut pixels, (width, height)));
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        scene.draw(&root).map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&pixels, width, height, image::ExtendedColorType::Rgb8)
        .map_err(|e| PlotError::Encode(e.to_string()))?;
    Ok(png)
}

fn render_svg(
    scene: &impl Scene,
    width: u32,
    height: u32,
    title: &str,
) -> Result<String, PlotError> {
    let glyphs = RefCell::new(SvgText::default());
    let mut svg = String::new();
    {
        let backend =
            TextBackend::vector(SVGBackend::with_string(&mut svg, (width, height)), &glyphs);
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        scene.draw(&root).map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    // Text goes last, so it sits above every shape, which is where labels belong anyway.
    let end = svg
        .rfind("</svg>")
        .ok_or_else(|| PlotError::Draw("SVG backend produced no closing tag".into()))?;
    svg.insert_str(end, &glyphs.into_inner().into_markup());
    // The document's accessible name, and a way to find the figure by its title.
    let open_end = svg
        .find("<svg")
        .and_then(|i| svg[i..].find('>').map(|j| i + j + 1));
    if let Some(open_end) = open_end.filter(|_| !title.is_empty()) {
        svg.insert_str(open_end, &format!("\n<title>{}</title>", xml_escape(title)));
    }
    Ok(svg)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    if path.file_name().is_none() {
        return Err(PlotError::BadPath(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let io = |source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    };
    // A device or pipe is written in place: renaming over it would replace it with a
    // regular file.
    if let Ok(m) = std::fs::metadata(path)
        && !m.is_file()
        && !m.is_dir()
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io)?;
        return f.write_all(bytes).and_then(|()| f.flush()).map_err(io);
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".hmct-plot-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| io(without_temp_name(e)))?;
    tmp.write_all(bytes).map_err(io)?;
    // Temp files are created owner-only; a figure is an ordinary output file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
    }
    tmp.flush().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// tempfile's errors end with the random name of the file it tried to create, which
/// the user never asked for; the error names the target instead.
fn without_temp_name(e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    match text.rfind(" at path \"") {
        Some(i) => std::io::Error::new(e.kind(), &text[..i]),
        None => e,
    }
}
