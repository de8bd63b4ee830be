//! Renders every figure for real and inspects the decoded pixels / SVG text.

use std::collections::HashSet;
use std::path::Path;

use hmct_plot::*;
use image::RgbImage;

fn load(path: &Path) -> RgbImage {
    image::open(path).expect("decodable PNG").to_rgb8()
}

fn distinct_colours(img: &RgbImage) -> usize {
    img.pixels().map(|p| p.0).collect::<HashSet<_>>().len()
}

/// Pixels of exactly `c` inside the rectangle.
fn count_colour(img: &RgbImage, c: Rgb, (x0, y0, x1, y1): (u32, u32, u32, u32)) -> usize {
    let mut n = 0;
    for y in y0..y1.min(img.height()) {
        for x in x0..x1.min(img.width()) {
            if img.get_pixel(x, y).0 == [c.0, c.1, c.2] {
                n += 1;
            }
        }
    }
    n
}

/// Pixels clearly darker than the white background inside the rectangle.
fn count_ink(img: &RgbImage, (x0, y0, x1, y1): (u32, u32, u32, u32)) -> usize {
    let mut n = 0;
    for y in y0..y1.min(img.height()) {
        for x in x0..x1.min(img.width()) {
            let p = img.get_pixel(x, y).0;
            if p.iter().map(|v| u32::from(*v)).sum::<u32>() < 3 * 160 {
                n += 1;
            }
        }
    }
    n
}

fn whole(img: &RgbImage) -> (u32, u32, u32, u32) {
    (0, 0, img.width(), img.height())
}

fn middle(img: &RgbImage) -> (u32, u32, u32, u32) {
    let (w, h) = img.dimensions();
    (w / 5, h / 5, w * 3 / 5, h * 3 / 5)
}

fn node_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("/encoder/_blocks.{}/_depthwise_conv/Conv_{}", i / 4, i % 4))
        .collect()
}

fn ramp(n: usize, start: f64, step: f64) -> Vec<f64> {
    (0..n).map(|i| start - step * i as f64).collect()
}

/// Deterministic bell-shaped values.
fn bell(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            let mut acc = 0.0;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                acc += s as f32 / u32::MAX as f32;
            }
            (acc - 2.0) * scale
        })
        .collect()
}

#[test]
fn line_chart_png_has_curves_legend_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acc.png");
    let spec = LineChart {
        figure: Figure::new("accumulated error", "node", "cosine-similarity"),
        x_labels: node_names(40),
        series: vec![
            LineSeries::new("weight_quantized", ramp(40, 1.0, 0.0005)),
            LineSeries::new("activation_quantized", ramp(40, 1.0, 0.001)),
        ],
        baseline: Some(Baseline::new(1.0, "float")),
    };
    let info = line_chart(&spec, &path, Format::Png).unwrap();
    assert_eq!(info.skipped_non_finite, 0);
    assert!(info.notes.is_empty());
    let img = load(&path);
    assert_eq!(img.dimensions(), (info.width, info.height));
    assert!(
        distinct_colours(&img) > 50,
        "{} colours",
        distinct_colours(&img)
    );
    // Both curves in their default colours, and the baseline in blue.
    assert!(count_colour(&img, Rgb::cycle(0), whole(&img)) > 200);
    assert!(count_colour(&img, Rgb::cycle(1), whole(&img)) > 200);
    assert!(count_colour(&img, Rgb::BLUE, whole(&img)) > 100);
    assert!(count_ink(&img, middle(&img)) > 100);
}

#[test]
fn line_chart_with_600_long_labels_stays_bounded_and_labelled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acc600.png");
    let spec = LineChart {
        figure: Figure::new("accumulated error", "node output", "cosine-similarity"),
        x_labels: node_names(600),
        series: vec![LineSeries::new("calibrated_model", ramp(600, 1.0, 0.00003))],
        baseline: None,
    };
    let info = line_chart(&spec, &path, Format::Png).unwrap();
    let img = load(&path);
    assert!(img.width() <= 4000, "width {}", img.width());
    assert!(img.height() <= 1200, "height {}", img.height());
    // The rotated tick labels fill the band under the plot with ink.
    let (w, h) = img.dimensions();
    let band = (w / 10, h * 2 / 3, w * 8 / 10, h - 40);
    assert!(
        count_ink(&img, band) > 5_000,
        "{} ink pixels",
        count_ink(&img, band)
    );
    assert!(count_colour(&img, Rgb::cycle(0), whole(&img)) > 1000);
    assert_eq!(info.skipped_non_finite, 0);
}

#[test]
fn non_finite_points_are_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gaps.png");
    let mut values = ramp(10, 1.0, 0.01);
    values[3] = f64::NAN;
    values[7] = f64::INFINITY;
    let spec = LineChart {
        figure: Figure::new("gaps", "node", "cosine"),
        x_labels: node_names(10),
        series: vec![LineSeries::new("s", values)],
        baseline: None,
    };
    let info = line_chart(&spec, &path, Format::Png).unwrap();
    assert_eq!(info.skipped_non_finite, 2);
    assert_eq!(info.notes.len(), 1);
    assert!(info.notes[0].contains("'s'"), "{:?}", info.notes);
    assert!(path.exists());

    let all_nan = LineChart {
        series: vec![LineSeries::new("s", vec![f64::NAN; 10])],
        ..spec.clone()
    };
    let err = line_chart(&all_nan, &dir.path().join("nan.png"), Format::Png).unwrap_err();
    assert!(matches!(err, PlotError::NoFiniteData(_)), "{err}");
    assert!(!dir.path().join("nan.png").exists());
}

#[test]
fn bad_specs_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.png");
    let empty = LineChart::default();
    assert!(matches!(
        line_chart(&empty, &out, Format::Png),
        Err(PlotError::EmptyData(_))
    ));
    let mismatched = LineChart {
        x_labels: node_names(3),
        series: vec![LineSeries::new("s", vec![1.0, 2.0])],
        ..Default::default()
    };
    assert!(matches!(
        line_chart(&mismatched, &out, Format::Png),
        Err(PlotError::InvalidSpec(_))
    ));
    let no_bins = Histogram {
        bins: 0,
        ..Histogram::new(Figure::default(), vec![HistSeries::new("a", vec![1.0])])
    };
    assert!(matches!(
        histogram(&no_bins, &out, Format::Png),
        Err(PlotError::InvalidSpec(_))
    ));
    let no_values = Histogram::new(Figure::default(), vec![HistSeries::new("a", vec![])]);
    assert!(matches!(
        histogram(&no_values, &out, Format::Png),
        Err(PlotError::EmptyData(_))
    ));
    assert!(matches!(
        box_plot(&BoxPlot::default(), &out, Format::Png),
        Err(PlotError::EmptyData(_))
    ));
    assert!(!out.exists());
}

#[test]
fn unwritable_path_is_an_io_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/folder/plot.png");
    let spec = LineChart {
        figure: Figure::new("t", "x", "y"),
        x_labels: node_names(3),
        series: vec![LineSeries::new("s", vec![1.0, 0.9, 0.8])],
        baseline: None,
    };
    match line_chart(&spec, &missing, Format::Png) {
        Err(PlotError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected an Io error, got {other:?}"),
    }
    // A folder in the way of the file name.
    let blocked = dir.path().join("blocked.png");
    std::fs::create_dir(&blocked).unwrap();
    assert!(matches!(
        line_chart(&spec, &blocked, Format::Png),
        Err(PlotError::Io { .. })
    ));
    // Neither attempt left a temp file behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1);
    // The error names the target, never tempfile's random name.
    let err = line_chart(&spec, &missing, Format::Png).unwrap_err();
    assert!(!err.to_string().contains(".hmct-plot-"), "{err}");
}

/// A full disk: a link to /dev/full (a device, written in place rather than renamed
/// over, so the device and the link stay what they were) gives an Io error.
#[cfg(target_os = "linux")]
#[test]
fn a_full_device_is_an_io_error_and_is_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    if !Path::new("/dev/full").exists() {
        hmct_ir::testing::skip("no /dev/full device");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("full.png");
    std::os::unix::fs::symlink("/dev/full", &link).unwrap();
    let spec = LineChart {
        figure: Figure::new("t", "x", "y"),
        x_labels: node_names(3),
        series: vec![LineSeries::new("s", vec![1.0, 0.9, 0.8])],
        baseline: None,
    };
    assert!(matches!(
        line_chart(&spec, &link, Format::Png),
        Err(PlotError::Io { .. })
    ));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        std::fs::metadata("/dev/full")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn rewriting_replaces_the_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.png");
    std::fs::write(&path, b"old contents").unwrap();
    let spec = LineChart {
        figure: Figure::new("t", "x", "y"),
        x_labels: node_names(3),
        series: vec![LineSeries::new("s", vec![1.0, 0.9, 0.8])],
        baseline: None,
    };
    line_chart(&spec, &path, Format::Png).unwrap();
    load(&path);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("p.png")]);
}

#[test]
fn histogram_shows_series_threshold_and_max_marker() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.png");
    let float = bell(20_000, 1, 2.0);
    let quant: Vec<f32> = float.iter().map(|v| (v * 4.0).round() / 4.0).collect();
    let mut spec = Histogram::new(
        Figure::new("node_output cosine=0.999123", "value", "count"),
        vec![
            HistSeries::new("float", float.clone()),
            HistSeries::new("calibrated", quant),
        ],
    );
    spec.bins = 80;
    spec.threshold = Some(VLine::new(3.5, "threshold"));
    spec.max_marker = Some(VLine::new(-3.9, "max |x|"));
    let info = histogram(&spec, &path, Format::Png).unwrap();
    let img = load(&path);
    assert_eq!(img.dimensions(), (info.width, info.height));
    assert!(distinct_colours(&img) > 50);
    let all = whole(&img);
    assert!(count_colour(&img, Rgb::RED, all) > 150, "threshold line");
    assert!(count_colour(&img, Rgb::BLUE, all) > 30, "max marker");
    assert!(
        count_colour(&img, Rgb::cycle(0), all) > 100,
        "float outline"
    );
    assert!(count_ink(&img, middle(&img)) > 100);

    spec.log_y = true;
    let log_path = dir.path().join("h_log.png");
    histogram(&spec, &log_path, Format::Png).unwrap();
    let log_img = load(&log_path);
    assert!(count_colour(&log_img, Rgb::RED, whole(&log_img)) > 150);
    assert_ne!(
        log_img.as_raw(),
        img.as_raw(),
        "log scale must change the picture"
    );
}

#[test]
fn histogram_skips_non_finite_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.png");
    let mut values = bell(1000, 3, 1.0);
    values[0] = f32::NAN;
    values[1] = f32::NEG_INFINITY;
    let spec = Histogram::new(
        Figure::new("t", "v", "n"),
        vec![HistSeries::new("a", values)],
    );
    let info = histogram(&spec, &path, Format::Png).unwrap();
    assert_eq!(info.skipped_non_finite, 2);
    let nan_only = Histogram::new(
        Figure::new("t", "v", "n"),
        vec![HistSeries::new("a", vec![f32::NAN; 4])],
    );
    assert!(matches!(
        histogram(&nan_only, &path, Format::Png),
        Err(PlotError::NoFiniteData(_))
    ));
}

fn boxes(n: usize) -> Vec<BoxStats> {
    (0..n)
        .map(|c| {
            let mut v = bell(300, c as u32 + 1, 1.0 + (c % 5) as f32 * 0.5);
            v[0] = 8.0;
            BoxStats::from_values(&v, BoxStats::DEFAULT_MAX_OUTLIERS).unwrap()
        })
        .collect()
}

#[test]
fn box_plot_with_3_channels() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b3.png");
    let spec = BoxPlot {
        figure: Figure::new("317_HzCalibration", "channel", "value"),
        boxes: boxes(3),
        labels: None,
    };
    let info = box_plot(&spec, &path, Format::Png).unwrap();
    let img = load(&path);
    assert_eq!(img.dimensions(), (info.width, info.height));
    assert!(img.width() < 1200);
    assert!(distinct_colours(&img) > 30);
    let all = whole(&img);
    // Three medians (red) and three means (blue), each a few dozen pixels wide.
    assert!(count_colour(&img, Rgb::RED, all) > 3 * 40);
    assert!(count_colour(&img, Rgb::BLUE, all) > 3 * 20);
    // Box outlines and whiskers inside the plot area (left of the legend).
    let (w, h) = img.dimensions();
    assert!(count_ink(&img, (w / 10, h / 10, w * 3 / 4, h * 4 / 5)) > 400);
}

#[test]
fn box_plot_with_2000_channels_grows_wide_but_capped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b2000.png");
    let spec = BoxPlot {
        figure: Figure::new("wide", "channel", "value"),
        boxes: boxes(2000),
        labels: None,
    };
    let info = box_plot(&spec, &path, Format::Png).unwrap();
    let img = load(&path);
    assert_eq!(img.dimensions(), (info.width, info.height));
    assert!(img.width() >= 2000 * 6, "width {}", img.width());
    assert!(img.width() <= 16_384, "width {}", img.width());
    // Medians all along the axis: every tenth of the width has some red.
    let h = img.height();
    for k in 0..10 {
        let x0 = img.width() * k / 10;
        let strip = (x0.max(150), 0, x0 + img.width() / 10 - 200, h);
        assert!(count_colour(&img, Rgb::RED, strip) > 50, "strip {k}");
    }
}

#[test]
fn box_plot_skips_non_finite_boxes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.png");
    let mut b = boxes(4);
    b[1].median = f64::NAN;
    b[2].outliers.push(f64::INFINITY);
    let spec = BoxPlot {
        figure: Figure::new("t", "c", "v"),
        boxes: b,
        labels: Some(vec!["a".into(), "b".into(), "c".into(), "d".into()]),
    };
    let info = box_plot(&spec, &path, Format::Png).unwrap();
    assert_eq!(info.skipped_non_finite, 2);
    let bad_labels = BoxPlot {
        labels: Some(vec!["a".into()]),
        ..spec
    };
    assert!(matches!(
        box_plot(&bad_labels, &path, Format::Png),
        Err(PlotError::InvalidSpec(_))
    ));
}

#[test]
fn svg_output_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let title = "partial quantization <cosine & more>";
    let spec = LineChart {
        figure: Figure::new(title, "node", "cosine-similarity"),
        x_labels: vec!["none".into(), "Conv_2".into(), "Conv_7".into()],
        series: vec![
            LineSeries::new("single", vec![0.99, 0.995, 0.993])
                .color(Rgb::GREEN)
                .line(LineKind::None)
                .marker(Marker::Cross),
            LineSeries::new("cumulative", vec![0.99, 0.996, 0.999]).color(Rgb::RED),
        ],
        baseline: Some(Baseline::new(1.0, "baseline")),
    };
    let path = dir.path().join("p.svg");
    let info = line_chart(&spec, &path, Format::Svg).unwrap();
    assert_eq!(info.format, Format::Svg);
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("<title>partial quantization &lt;cosine &amp; more&gt;</title>"));
    assert!(svg.contains(r#"aria-label="Conv_2""#));
    // Text is drawn from glyph outlines, never left to the viewer's fonts.
    assert!(!svg.contains("<text"));
    assert!(!svg.contains("font-family"));
    assert!(svg.contains(r#"<path id="g"#));
    assert!(svg.matches("<use ").count() > 50);
    // Every glyph used is defined.
    for chunk in svg.split("href=\"#g").skip(1) {
        let id: String = chunk.chars().take_while(|c| c.is_ascii_digit()).collect();
        assert!(
            svg.contains(&format!("<path id=\"g{id}\"")),
            "glyph {id} undefined"
        );
    }
    // Crude well-formedness: every opened group is closed.
    assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());

    let hist = Histogram::new(
        Figure::new("hist title", "v", "n"),
        vec![HistSeries::new("a", bell(500, 9, 1.0))],
    );
    histogram(&hist, &dir.path().join("h.svg"), Format::Svg).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("h.svg")).unwrap();
    assert!(svg.contains("<title>hist title</title>"));
    let bp = BoxPlot {
        figure: Figure::new("box title", "c", "v"),
        boxes: boxes(5),
        labels: None,
    };
    box_plot(&bp, &dir.path().join("b.svg"), Format::Svg).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("b.svg")).unwrap();
    assert!(svg.contains("<title>box title</title>"));
}

#[test]
fn format_from_path() {
    assert_eq!(Format::from_path(Path::new("a/b.PNG")), Some(Format::Png));
    assert_eq!(Format::from_path(Path::new("a/b.svg")), Some(Format::Svg));
    assert_eq!(Format::from_path(Path::new("a/b.jpg")), None);
    assert_eq!(Format::default(), Format::Png);
}

/// Title-band ink of a small chart titled `title`.
fn title_band(dir: &Path, title: &str) -> (usize, RgbImage) {
    let path = dir.join(format!("{}.png", title.len()));
    let spec = LineChart {
        figure: Figure::new(title, "x", "y").with_size(600, 400),
        x_labels: vec!["a".into(), "b".into()],
        series: vec![LineSeries::new("s", vec![1.0, 2.0])],
        baseline: None,
    };
    let info = line_chart(&spec, &path, Format::Png).unwrap();
    assert_eq!((info.width, info.height), (600, 400));
    let img = load(&path);
    (count_ink(&img, (0, 0, 600, 40)), img)
}

/// Re-runs itself in a child process whose fontconfig points at an empty configuration
/// and whose data folders are empty: the embedded font must still draw the title, and
/// no font library may be loaded into the process.
#[test]
fn text_renders_without_system_fonts() {
    const CHILD: &str = "HMCT_PLOT_NO_SYSTEM_FONTS_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let empty = tempfile::tempdir().unwrap();
        let conf = empty.path().join("fonts.conf");
        std::fs::write(
            &conf,
            "<?xml version=\"1.0\"?>\n<fontconfig></fontconfig>\n",
        )
        .unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "text_renders_without_system_fonts",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env("FONTCONFIG_FILE", &conf)
            .env("FONTCONFIG_PATH", empty.path())
            .env("XDG_DATA_DIRS", empty.path())
            .env("XDG_DATA_HOME", empty.path())
            .env("HOME", empty.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The child really ran the test (and did not filter it away).
        assert!(stdout.contains("1 passed"), "{stdout}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ink_long, long) = title_band(
        dir.path(),
        "Accumulated error of the partially quantized model",
    );
    let (ink_short, short) = title_band(dir.path(), "Hi");
    assert!(
        ink_long > 300,
        "title glyphs missing: {ink_long} ink pixels"
    );
    assert!(ink_long > 5 * ink_short, "{ink_long} vs {ink_short}");
    assert_ne!(long.as_raw(), short.as_raw());
    #[cfg(target_os = "linux")]
    {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for lib in ["fontconfig", "freetype"] {
            assert!(!maps.contains(lib), "{lib} is loaded into the process");
        }
    }
}
