//! The HTML report and the health checks through the binary: runall on the bundled
//! example writes `health.json` and a self-contained `report.html` naming every
//! node; markup in node names is escaped; a planted threshold problem is printed as a
//! warning and shown in the page; `report` re-renders the same page; and, when a
//! `chromium` is on PATH, the page renders to a non-blank screenshot.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hmct_ir::Model;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn")
}

fn bin(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

fn runall(model: &Path, save_dir: &Path, extra: &[&str]) -> Output {
    let data = example().join("calibration_data");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "runall".as_ref(),
        model.as_os_str(),
        data.as_os_str(),
        "-s".as_ref(),
        save_dir.as_os_str(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    let out = bin(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Nothing the page loads comes from elsewhere.
fn assert_self_contained(html: &str) {
    let lower = html.to_ascii_lowercase();
    for bad in [
        "src=\"http",
        "src='http",
        "href=\"http",
        "href='http",
        "href=\"//",
        "src=\"//",
        "<script src",
        "<link",
        "url(http",
        "@import",
    ] {
        assert!(!lower.contains(bad), "the page references '{bad}'");
    }
    assert!(lower.starts_with("<!doctype html>"));
    assert!(lower.trim_end().ends_with("</html>"));
}

#[test]
fn runall_writes_a_self_contained_report_naming_every_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("result");
    let model = example().join("calibrated_model.onnx");
    let out = runall(&model, &dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("report.html"), "{stdout}");
    // The example is calibrated with max: nothing to warn about.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning:"), "{stderr}");

    let summary = json(&dir.join("summary.json"));
    assert_eq!(summary["steps"][0]["name"], "health checks");
    assert_eq!(summary["steps"][0]["files"][0], "health.json");
    assert_eq!(summary["health"]["file"], "health.json");
    assert_eq!(summary["health"]["warnings"], 0);
    assert_eq!(summary["report"], "report.html");
    assert!(
        summary["tool"]
            .as_str()
            .unwrap()
            .starts_with("hmct-debugger ")
    );
    assert_eq!(summary["command"][1], "runall");

    let health = json(&dir.join("health.json"));
    let calibrations = health["calibrations"].as_array().unwrap();
    assert_eq!(calibrations.len(), 17);

    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_self_contained(&html);
    for c in calibrations {
        let name = c["node"].as_str().unwrap();
        assert!(html.contains(&escape(name)), "{name} missing from the page");
    }
    for node in ["stem_conv", "fc", "gap", "res_add", "softmax"] {
        assert!(html.contains(node), "{node} missing from the page");
    }
    // The tool version and the command line that made the folder.
    assert!(html.contains(&format!("hmct-debugger {}", env!("CARGO_PKG_VERSION"))));
    assert!(html.contains(&escape(&dir.display().to_string())));
    // Two sortable rankings, the charts as inline SVG, the figures of the top nodes.
    assert_eq!(html.matches("<table class=\"sortable\">").count(), 3);
    assert!(html.contains("addEventListener('click'"));
    assert!(html.matches("<svg").count() >= 2, "charts missing");
    assert_eq!(
        html.matches("data:image/png;base64,").count(),
        20,
        "10 distributions and 10 box plots"
    );
    assert_eq!(html.matches("<details").count(), 17);
    // Names wrap between words only, every chart scales to the page, and the
    // partial-quantization table has no column repeating another.
    assert!(!html.contains("overflow-wrap:anywhere"));
    assert!(!html.contains("class=\"wide\"") && !html.contains("max-width:none"));
    let partial = &html[html.find("<section id=\"partial\">").unwrap()..];
    let partial = &partial[..partial.find("</section>").unwrap()];
    if partial.contains("<table") {
        assert!(!partial.contains("<th>sensitivity</th>"), "{partial}");
    } else {
        assert!(partial.contains("nothing to analyse"), "{partial}");
    }

    // `report` re-renders the same page.
    let again = tmp.path().join("again.html");
    let out = bin(&[
        "report".as_ref(),
        dir.as_os_str(),
        "-o".as_ref(),
        again.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&again).unwrap(), html);

    // Default output: RESULT_DIR/report.html, replaced in place.
    std::fs::remove_file(dir.join("report.html")).unwrap();
    let out = bin(&["report".as_ref(), dir.as_os_str()]);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("report.html")).unwrap(),
        html
    );

    if let Some(png) = screenshot(&dir.join("report.html"), tmp.path()) {
        let img = image::open(&png).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (1280, 2000));
        let mut colours: Vec<[u8; 3]> = img.pixels().map(|p| p.0).collect();
        colours.sort_unstable();
        colours.dedup();
        assert!(
            colours.len() > 16,
            "{} colours: a blank page?",
            colours.len()
        );
        let ink = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
        assert!(ink > 20_000, "only {ink} non-white pixels");
    }
}

/// Renders `html` with a headless chromium when one is on PATH.
fn screenshot(html: &Path, dir: &Path) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("chromium").is_file()))
        .unwrap_or(false);
    if !found {
        hmct_ir::testing::skip("the screenshot (no chromium on PATH)");
        return None;
    }
    let png = dir.join("shot.png");
    let status = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,2000",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "chromium failed");
    Some(png)
}

#[test]
fn markup_in_names_is_escaped_and_findings_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    // The example with a node and a calibration node renamed to hold markup, and one
    // activation threshold cut to a tenth of what the data reaches.
    let mut proto = hmct_ir::load_model(example().join("calibrated_model.onnx"))
        .unwrap()
        .into_proto();
    let graph = proto.graph.as_mut().unwrap();
    let evil_node = "fc<script>alert('x')</script>";
    let evil_cal = "pw<b>&\"relu\"_HzCalibration";
    for n in &mut graph.node {
        if n.name() == "fc" {
            n.name = Some(evil_node.into());
        } else if n.name() == "pw_relu_out_HzCalibration" {
            n.name = Some(evil_cal.into());
        }
    }
    let mut model = Model::from_proto(proto, None).unwrap();
    let id = model.node_id(evil_cal).unwrap();
    let threshold = model.calibration(id).unwrap().thresholds()[0];
    model
        .calibration_mut(id)
        .unwrap()
        .set_thresholds(vec![threshold / 10.0])
        .unwrap();
    let path = tmp.path().join("evil.onnx");
    hmct_ir::save_model(&model, &path).unwrap();

    let dir = tmp.path().join("result");
    let out = runall(&path, &dir, &["--format", "svg"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("warning: {evil_cal}: max|activation|")),
        "{stderr}"
    );

    let health = json(&dir.join("health.json"));
    let finding = &health["findings"][0];
    assert_eq!(finding["check"], "heavy-clipping");
    assert_eq!(finding["node"], evil_cal);
    assert!((finding["numbers"]["ratio"].as_f64().unwrap() - 10.0).abs() < 1e-3);
    assert_eq!(json(&dir.join("summary.json"))["health"]["warnings"], 1);

    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_self_contained(&html);
    assert!(!html.contains(evil_node), "raw markup in the page");
    assert!(!html.contains(evil_cal), "raw markup in the page");
    assert!(html.contains(&escape(evil_node)));
    assert!(html.contains(&escape(evil_cal)));
    // The only scripts are the page's own sorting code.
    assert_eq!(html.matches("<script").count(), 1);
    // The finding is in the health table; the SVG figures are inlined, each with
    // its own id prefix so glyph references do not cross figures.
    assert!(html.contains("<tr class=\"warning\">"));
    assert!(html.contains("heavy-clipping"));
    assert!(html.contains("id=\"f1-") && html.contains("href=\"#f2-"));
}

#[test]
fn runall_can_skip_the_report_and_report_refuses_other_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("result");
    let model = example().join("calibrated_model.onnx");
    runall(&model, &dir, &["--report", "False", "-nt", "weight"]);
    assert!(!dir.join("report.html").exists());
    assert!(dir.join("health.json").exists());
    assert!(json(&dir.join("summary.json"))["report"].is_null());

    // A folder without summary.json: exit 2, one line, nothing written.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = bin(&["report".as_ref(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("summary.json"), "{stderr}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);

    // A summary.json that is not JSON: exit 1, named.
    std::fs::write(empty.join("summary.json"), b"{not json").unwrap();
    let out = bin(&["report".as_ref(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("summary.json"));
    assert!(!empty.join("report.html").exists());

    // A folder with only the weight ranking still renders, noting what is absent.
    let out = bin(&["report".as_ref(), dir.as_os_str()]);
    assert!(out.status.success());
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_self_contained(&html);
    assert!(html.contains("weight (7 candidates"));
    assert!(!html.contains("activation (10 candidates"));
}
