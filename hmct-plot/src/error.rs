use std::path::PathBuf;

/// Why a figure could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The spec holds nothing to draw (no series, no x labels, no boxes...).
    #[error("nothing to plot: {0}")]
    EmptyData(String),
    /// There was data, but every value was NaN or infinite.
    #[error("no finite values to plot: {0}")]
    NoFiniteData(String),
    /// The spec contradicts itself (e.g. a series longer than the x labels).
    #[error("invalid figure: {0}")]
    InvalidSpec(String),
    /// The output path cannot be written (missing folder, no permission, ...): the
    /// I/O error is the `source`.
    #[error("cannot write {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The output path has no file name or no parent folder to write into.
    #[error("not a file path: {}", .0.display())]
    BadPath(PathBuf),
    /// The figure is larger than we agree to allocate.
    #[error("figure of {width}x{height} pixels is too large")]
    TooLarge { width: u32, height: u32 },
    /// plotters or the glyph renderer failed while drawing.
    #[error("drawing failed: {0}")]
    Draw(String),
    /// The PNG encoder failed.
    #[error("PNG encoding failed: {0}")]
    Encode(String),
}
