//! `hmct-debugger make-data MODEL IMAGES_DIR -o DATA`: turns a folder of PNG/JPEG
//! images into a calibration-data folder for one float image input of MODEL
//! (HZCALIBRATION.md §6): each image is resized to the input's height and width,
//! normalized per channel as `(pixel - mean) / std` with pixels in 0..=255, laid out
//! NCHW or NHWC with a batch of 1, and written as `DATA/<input>/<i>.npy` in the
//! natural order of the image file names.

use std::cmp::Ordering;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use hmct_ir::Dim;
use hmct_tensor::{Tensor, sanitize_name, write_npy};
use image::imageops::FilterType;

use crate::UsageError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    Nchw,
    Nhwc,
}

/// Arguments of `make-data`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model the data is for (its input name, shape and layout are used).
    pub model: PathBuf,
    /// Folder of .png / .jpg / .jpeg images.
    pub images: PathBuf,
    /// The calibration-data folder to write (created if missing).
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Per-channel mean in pixel units (one value, or one per channel, comma-separated).
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub mean: String,
    /// Per-channel standard deviation in pixel units (one value or one per channel).
    #[arg(long, default_value = "1")]
    pub std: String,
    /// Layout of the model input (default: guessed from where its 1 or 3 channels are).
    #[arg(long, value_enum)]
    pub layout: Option<Layout>,
    /// Image size HxW (default: the model input's fixed height and width).
    #[arg(long, value_name = "HxW")]
    pub size: Option<String>,
    /// The model input to write (default: the model's only input).
    #[arg(long)]
    pub input: Option<String>,
    /// Channel order BGR instead of RGB.
    #[arg(long)]
    pub bgr: bool,
}

/// What one sample looks like.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    input: String,
    layout: Layout,
    channels: usize,
    height: usize,
    width: usize,
}

fn fixed(d: &Dim) -> Option<usize> {
    match d {
        Dim::Fixed(v) if *v > 0 => Some(*v as usize),
        _ => None,
    }
}

fn target(model: &hmct_ir::Model, args: &Args) -> Result<Target> {
    let input = match &args.input {
        Some(name) => {
            if !model.inputs().iter().any(|i| i == name) {
                return Err(UsageError(format!(
                    "--input '{name}': the model's inputs are {}",
                    model.inputs().join(", ")
                ))
                .into());
            }
            name.clone()
        }
        None => match model.inputs() {
            [one] => one.clone(),
            many => {
                return Err(UsageError(format!(
                    "the model has {} inputs ({}); choose one with --input",
                    many.len(),
                    many.join(", ")
                ))
                .into());
            }
        },
    };
    let ty = model.value_type(&input);
    if let Some(t) = &ty
        && t.elem_type != 1
    {
        bail!("model input '{input}' is {t}; make-data writes float32 images");
    }
    let dims = ty.and_then(|t| t.shape).unwrap_or_default();
    if !dims.is_empty() && dims.len() != 4 {
        bail!(
            "model input '{input}' has rank {}; images need a rank-4 input",
            dims.len()
        );
    }
    let at = |k: usize| dims.get(k).and_then(fixed);
    let is_channels = |k: usize| matches!(at(k), Some(1 | 3));
    let layout = match args.layout {
        Some(l) => l,
        None if is_channels(1) => Layout::Nchw,
        None if is_channels(3) => Layout::Nhwc,
        None => {
            return Err(UsageError(format!(
                "cannot tell the layout of input '{input}'; give --layout nchw or nhwc"
            ))
            .into());
        }
    };
    let (c, h, w) = match layout {
        Layout::Nchw => (1, 2, 3),
        Layout::Nhwc => (3, 1, 2),
    };
    let channels = at(c).unwrap_or(3);
    if !matches!(channels, 1 | 3) {
        bail!("model input '{input}' has {channels} channels; images give 1 or 3");
    }
    let (height, width) = match &args.size {
        Some(s) => parse_size(s)?,
        None => match (at(h), at(w)) {
            (Some(h), Some(w)) => (h, w),
            _ => {
                return Err(UsageError(format!(
                    "input '{input}' has no fixed height and width; give --size HxW"
                ))
                .into());
            }
        },
    };
    for (k, want) in [(h, height), (w, width)] {
        if let Some(d) = at(k)
            && d != want
        {
            return Err(UsageError(format!(
                "--size {height}x{width} does not match model input '{input}' ({})",
                dims.iter()
                    .map(Dim::to_string)
                    .collect::<Vec<_>>()
                    .join("x")
            ))
            .into());
        }
    }
    Ok(Target {
        input,
        layout,
        channels,
        height,
        width,
    })
}

fn parse_size(s: &str) -> Result<(usize, usize)> {
    let bad = || UsageError(format!("--size '{s}': expected HxW, e.g. 224x224"));
    let (h, w) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let h: usize = h.trim().parse().map_err(|_| bad())?;
    let w: usize = w.trim().parse().map_err(|_| bad())?;
    if h == 0 || w == 0 {
        return Err(bad().into());
    }
    Ok((h, w))
}

/// One value per channel from `1` or `channels` comma-separated numbers.
fn per_channel(flag: &str, s: &str, channels: usize) -> Result<Vec<f32>> {
    let values: Vec<f32> = s
        .split(',')
        .map(|v| v.trim().parse::<f32>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            UsageError(format!(
                "--{flag} '{s}': expected numbers separated by commas"
            ))
        })?;
    match values.len() {
        1 => Ok(vec![values[0]; channels]),
        n if n == channels => Ok(values),
        n => Err(UsageError(format!(
            "--{flag} '{s}': {n} values for {channels} channels (give 1 or {channels})"
        ))
        .into()),
    }
}

/// File names compared with their digit runs as numbers (`2.png` < `10.png`).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((da, sa), (db, sb)) in ca.iter().zip(&cb) {
        let ord = if *da && *db {
            let (ta, tb) = (sa.trim_start_matches('0'), sb.trim_start_matches('0'));
            ta.len().cmp(&tb.len()).then(ta.cmp(tb))
        } else {
            sa.cmp(sb)
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len()).then(a.cmp(b))
}

fn image_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir)
        .with_context(|| format!("{}: cannot read the image folder", dir.display()))?;
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension().is_some_and(|e| {
                    let e = e.to_string_lossy().to_ascii_lowercase();
                    matches!(e.as_str(), "png" | "jpg" | "jpeg")
                })
        })
        .collect();
    files.sort_by(|a, b| {
        natural_cmp(
            &a.file_name().unwrap_or_default().to_string_lossy(),
            &b.file_name().unwrap_or_default().to_string_lossy(),
        )
    });
    if files.is_empty() {
        bail!("{}: no .png, .jpg or .jpeg images", dir.display());
    }
    Ok(files)
}

/// One image as a `[1, C, H, W]` or `[1, H, W, C]` float tensor.
fn image_tensor(path: &Path, t: &Target, mean: &[f32], std: &[f32], bgr: bool) -> Result<Tensor> {
    let img = image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .with_context(|| path.display().to_string())?
        .decode()
        .with_context(|| format!("{}: cannot decode the image", path.display()))?;
    let img = img.resize_exact(t.width as u32, t.height as u32, FilterType::Triangle);
    let (h, w, c) = (t.height, t.width, t.channels);
    let pixels: Vec<u8> = if c == 1 {
        img.to_luma8().into_raw()
    } else {
        img.to_rgb8().into_raw()
    };
    let mut data = vec![0f32; c * h * w];
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let src = if bgr { c - 1 - ch } else { ch };
                let p = f32::from(pixels[(y * w + x) * c + src]);
                let v = (p - mean[ch]) / std[ch];
                let at = match t.layout {
                    Layout::Nchw => (ch * h + y) * w + x,
                    Layout::Nhwc => (y * w + x) * c + ch,
                };
                data[at] = v;
            }
        }
    }
    let shape = match t.layout {
        Layout::Nchw => [1, c, h, w],
        Layout::Nhwc => [1, h, w, c],
    };
    Ok(Tensor::from_f32(&shape, data)?)
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let model = hmct_ir::load_model(&args.model)?;
    let t = target(&model, args)?;
    let mean = per_channel("mean", &args.mean, t.channels)?;
    let std = per_channel("std", &args.std, t.channels)?;
    if let Some(bad) = std.iter().find(|s| !(s.is_finite() && **s != 0.0)) {
        return Err(UsageError(format!("--std: {bad} is not a usable standard deviation")).into());
    }
    let files = image_files(&args.images)?;
    let final_dir = args.output.join(sanitize_name(&t.input));
    if final_dir.exists() && std::fs::read_dir(&final_dir)?.next().is_some() {
        bail!(
            "{}: already holds files; remove it or choose another -o",
            final_dir.display()
        );
    }
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("{}: cannot create the folder", args.output.display()))?;
    // Written into a temporary folder beside the target and renamed at the end, so a
    // bad image leaves nothing half-made behind.
    let tmp = tempfile::Builder::new()
        .prefix(".make-data-")
        .tempdir_in(&args.output)
        .with_context(|| args.output.display().to_string())?;
    for (i, file) in files.iter().enumerate() {
        let tensor = image_tensor(file, &t, &mean, &std, args.bgr)?;
        write_npy(&tmp.path().join(format!("{i}.npy")), &tensor)?;
    }
    if final_dir.exists() {
        std::fs::remove_dir(&final_dir).with_context(|| final_dir.display().to_string())?;
    }
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, &final_dir).with_context(|| final_dir.display().to_string())?;
    let layout = match t.layout {
        Layout::Nchw => format!("[1, {}, {}, {}]", t.channels, t.height, t.width),
        Layout::Nhwc => format!("[1, {}, {}, {}]", t.height, t.width, t.channels),
    };
    writeln!(
        out,
        "wrote {} samples {layout} for input '{}' to {}",
        files.len(),
        t.input,
        final_dir.display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut v = vec![
            "10.png",
            "2.png",
            "1.png",
            "a.png",
            "img_3.jpg",
            "img_12.jpg",
            "01.png",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            [
                "01.png",
                "1.png",
                "2.png",
                "10.png",
                "a.png",
                "img_3.jpg",
                "img_12.jpg"
            ]
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("48x192").unwrap(), (48, 192));
        assert!(parse_size("48").is_err());
        assert!(parse_size("0x3").is_err());
    }
}
