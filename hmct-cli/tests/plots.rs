//! plot-acc-error, plot-distribution and get-channelwise-data-distribution through the
//! built binary: the seeds' flags and list spellings, the files written (decoded PNGs,
//! JSON, CSV), and the mistakes (one line, exit status 2 for usage, 1 for an
//! unwritable folder, nothing left behind). Needs ../shared/models.

mod common;

use common::{fixture, ok};
use std::path::Path;
use std::process::Output;

/// The one `error: ...` line of a failed run with exit status `code`.
fn fails(out: &Output, code: i32) -> String {
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(out.stdout.is_empty());
    lines[0].to_string()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Decodes a PNG and checks it is a real, drawn picture.
fn picture(path: &Path, min_w: u32, min_h: u32) {
    let img = image::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8();
    assert!(
        img.width() >= min_w && img.height() >= min_h,
        "{}: {:?}",
        path.display(),
        img.dimensions()
    );
    let ink = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    assert!(ink > 5_000, "{}: {ink} non-white pixels", path.display());
}

#[test]
fn acc_error_flat_nested_and_special_lists() {
    let Some(f) = fixture() else { return };
    // The seeds' spelling, with the default save folder.
    let stdout = ok(&f.run("plot-acc-error", &["-q", "['conv2d','conv2d_2']"]));
    assert!(
        stdout.contains("accumulated error (cosine-similarity, 1 sample(s), 5 points)"),
        "{stdout}"
    );
    let stem = "quantize_node_accumulate_err_of_node_cosine-similarity";
    assert_eq!(
        files(&f.path("debug_result")),
        vec![format!("{stem}.json"), format!("{stem}.png")]
    );
    picture(&f.path(&format!("debug_result/{stem}.png")), 640, 400);
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.path(&format!("debug_result/{stem}.json"))).unwrap(),
    )
    .unwrap();
    let labels: Vec<&str> = json["curves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["conv2d", "conv2d_2"]);

    // Nested -q and -nq at once (the shell ate the quotes), average mode, mse, into
    // a folder of our choosing.
    let out = f.path("both");
    let stdout = ok(&f.run(
        "plot-acc-error",
        &[
            "-q",
            "[[conv2d],[conv2d,conv2d_2]]",
            "-nq",
            "[conv2d_1]",
            "-m",
            "mse",
            "-a",
            "True",
            "-s",
            out.to_str().unwrap(),
            "--json",
            f.path("all.json").to_str().unwrap(),
        ],
    ));
    assert!(stdout.contains("partial_qmodel_1"), "{stdout}");
    assert!(stdout.contains("calibrated_model"), "{stdout}");
    assert_eq!(
        files(&out),
        vec![
            "average_non_quantize_node_accumulate_err_of_node_mse.json",
            "average_non_quantize_node_accumulate_err_of_node_mse.png",
            "average_quantize_node_accumulate_err_of_partial_qmodel_mse.json",
            "average_quantize_node_accumulate_err_of_partial_qmodel_mse.png",
        ]
    );
    for name in files(&out).iter().filter(|n| n.ends_with(".png")) {
        picture(&out.join(name), 640, 400);
    }
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.path("all.json")).unwrap()).unwrap();
    assert_eq!(all["metric"], "mse");
    assert_eq!(all["average_mode"], true);
    assert_eq!(all["figures"].as_array().unwrap().len(), 2);

    // The special values, with the long flag names and a bare -a.
    let out = f.path("special");
    ok(&f.run(
        "plot-acc-error",
        &[
            "--quantize-node",
            "['weight','activation']",
            "--save_dir",
            out.to_str().unwrap(),
            "-a",
        ],
    ));
    assert_eq!(
        files(&out),
        vec![
            "average_weight_activation_quantized_separately_cosine-similarity.json",
            "average_weight_activation_quantized_separately_cosine-similarity.png",
        ]
    );
    let out = f.path("weight_only");
    ok(&f.run(
        "plot-acc-error",
        &["-q", "weight", "-s", out.to_str().unwrap()],
    ));
    assert_eq!(
        files(&out),
        vec![
            "weight_quantized_cosine-similarity.json",
            "weight_quantized_cosine-similarity.png"
        ]
    );
}

#[test]
fn acc_error_mistakes() {
    let Some(f) = fixture() else { return };
    let save = f.path("out");
    let save_arg = save.to_str().unwrap();
    let line = fails(&f.run("plot-acc-error", &["-s", save_arg]), 2);
    assert!(line.contains("-q") && line.contains("-nq"), "{line}");
    let line = fails(
        &f.run("plot-acc-error", &["-nq", "['weight']", "-s", save_arg]),
        2,
    );
    assert!(line.contains("'weight'"), "{line}");
    let line = fails(
        &f.run("plot-acc-error", &["-q", "['conv2d_7']", "-s", save_arg]),
        2,
    );
    assert!(
        line.contains("'conv2d_7'") && line.contains("did you mean"),
        "{line}"
    );
    let line = fails(
        &f.run(
            "plot-acc-error",
            &["-q", "conv2d", "-m", "cosine", "-s", save_arg],
        ),
        2,
    );
    assert!(line.contains("cosine-similarity"), "{line}");
    let line = fails(
        &f.run("plot-acc-error", &["-q", "[conv2d", "-s", save_arg]),
        2,
    );
    assert!(line.contains("--quantize_node"), "{line}");
    // None of this created the folder.
    assert!(!save.exists());

    // A file where the folder should be: not a usage mistake, nothing written.
    let blocked = f.path("blocked");
    std::fs::write(&blocked, b"x").unwrap();
    let target = blocked.join("out");
    let line = fails(
        &f.run(
            "plot-acc-error",
            &["-q", "conv2d", "-s", target.to_str().unwrap()],
        ),
        1,
    );
    assert!(line.contains("blocked"), "{line}");
    assert_eq!(std::fs::read(&blocked).unwrap(), b"x");
}

#[test]
fn distribution_of_each_kind_of_node() {
    let Some(f) = fixture() else { return };
    let out = f.path("dist");
    let stdout = ok(&f.run(
        "plot-distribution",
        &[
            "-n",
            "['p_re_lu/add:0_pooling0_HzCalibration','conv2d_1/kernel:0_HzCalibration','conv2d_1']",
            "-s",
            out.to_str().unwrap(),
            "--json",
            f.path("dist.json").to_str().unwrap(),
        ],
    ));
    assert_eq!(
        files(&out),
        vec![
            "activation_p_re_lu_add_0_pooling0_HzCalibration.png",
            "node_output_convolution_output3_of_conv2d_1.png",
            "weight_conv2d_1_kernel_0_HzCalibration.png",
        ]
    );
    assert!(stdout.contains("threshold 4.00000"), "{stdout}");
    assert!(stdout.contains("cosine 0.99"), "{stdout}");
    picture(
        &out.join("activation_p_re_lu_add_0_pooling0_HzCalibration.png"),
        800,
        450,
    );
    picture(
        &out.join("weight_conv2d_1_kernel_0_HzCalibration.png"),
        800,
        450,
    );
    picture(
        &out.join("node_output_convolution_output3_of_conv2d_1.png"),
        1400,
        450,
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.path("dist.json")).unwrap()).unwrap();
    let kinds: Vec<&str> = json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["activation", "weight", "node"]);

    // SVG on request.
    let svg = f.path("svg");
    ok(&f.run(
        "plot-distribution",
        &[
            "-n",
            "conv2d",
            "-s",
            svg.to_str().unwrap(),
            "--format",
            "svg",
        ],
    ));
    let text =
        std::fs::read_to_string(svg.join("node_output_convolution_output4_of_conv2d.svg")).unwrap();
    assert!(
        text.starts_with("<svg") && text.contains("<title>"),
        "{}",
        &text[..200]
    );

    let line = fails(
        &f.run(
            "plot-distribution",
            &["-n", "['conv2d_9']", "-s", out.to_str().unwrap()],
        ),
        2,
    );
    assert!(line.contains("'conv2d_9'"), "{line}");
    let line = fails(&f.run("plot-distribution", &["-n", "[]"]), 2);
    assert!(line.contains("empty"), "{line}");
    assert!(!f.path("debug_result").exists());
}

#[test]
fn channelwise_box_plots_and_csv() {
    let Some(f) = fixture() else { return };
    let out = f.path("boxes");
    let stdout = ok(&f.run(
        "get-channelwise-data-distribution",
        &[
            "-n",
            "['conv2d_2/kernel:0_HzCalibration','p_re_lu_1/add:0_HzCalibration']",
            "-s",
            out.to_str().unwrap(),
        ],
    ));
    assert!(
        stdout.contains("conv2d_2/kernel:0_HzCalibration: 32 channels on axis 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("p_re_lu_1/add:0_HzCalibration: 16 channels on axis 1"),
        "{stdout}"
    );
    assert_eq!(
        files(&out),
        vec![
            "conv2d_2_kernel_0_HzCalibration_boxplot.png",
            "conv2d_2_kernel_0_HzCalibration_channel_stats.csv",
            "p_re_lu_1_add_0_HzCalibration_boxplot.png",
            "p_re_lu_1_add_0_HzCalibration_channel_stats.csv",
        ]
    );
    picture(
        &out.join("conv2d_2_kernel_0_HzCalibration_boxplot.png"),
        600,
        400,
    );
    let csv =
        std::fs::read_to_string(out.join("conv2d_2_kernel_0_HzCalibration_channel_stats.csv"))
            .unwrap();
    assert_eq!(csv.lines().count(), 33);
    assert_eq!(
        csv.lines().next().unwrap(),
        "channel,count,min,q1,median,mean,q3,max,max_abs"
    );

    // A negative axis.
    let neg = f.path("neg");
    let stdout = ok(&f.run(
        "get-channelwise-data-distribution",
        &[
            "-n",
            "p_re_lu_1/add:0_HzCalibration",
            "-a",
            "-1",
            "-s",
            neg.to_str().unwrap(),
        ],
    ));
    assert!(stdout.contains("on axis 3"), "{stdout}");

    // A regular node is not a calibration node; the message names its calibration nodes.
    let line = fails(
        &f.run(
            "get-channelwise-data-distribution",
            &["-n", "conv2d_2", "-s", f.path("x").to_str().unwrap()],
        ),
        2,
    );
    assert!(
        line.contains("'conv2d_2'")
            && line.contains("not a calibration node")
            && line.contains("conv2d_2/kernel:0_HzCalibration"),
        "{line}"
    );
    let line = fails(
        &f.run(
            "get-channelwise-data-distribution",
            &[
                "-n",
                "p_re_lu_1/add:0_HzCalibration",
                "-a",
                "7",
                "-s",
                f.path("x").to_str().unwrap(),
            ],
        ),
        2,
    );
    assert!(line.contains("axis 7"), "{line}");
    assert!(!f.path("x").exists());
}
