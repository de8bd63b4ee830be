//! Writes one of each figure to a folder (default /tmp/plot_examples) for eyeballing.

use std::path::PathBuf;

use hmct_plot::*;

/// Deterministic pseudo-normal values (sum of uniforms from an LCG).
fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                acc += (s >> 40) as f32 / (1u64 << 24) as f32;
            }
            (acc - 2.0) * scale
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/tmp/plot_examples".into()),
    );
    std::fs::create_dir_all(&dir)?;

    // Accumulated error over 600 long node names, two curves.
    let names: Vec<String> = (0..600)
        .map(|i| {
            format!(
                "/encoder/_blocks.{}/_depthwise_conv/Conv_output_{}",
                i / 10,
                i % 10
            )
        })
        .collect();
    let w: Vec<f64> = (0..600)
        .map(|i| 1.0 - 0.00002 * i as f64 - 0.0004 * ((i as f64) / 37.0).sin().abs())
        .collect();
    let a: Vec<f64> = (0..600)
        .map(|i| {
            if i == 300 {
                f64::NAN
            } else {
                1.0 - 0.00004 * i as f64
            }
        })
        .collect();
    let spec = LineChart {
        figure: Figure::new(
            "Accumulated error (cosine-similarity)",
            "node output",
            "cosine-similarity",
        ),
        x_labels: names,
        series: vec![
            LineSeries::new("weight_quantized", w),
            LineSeries::new("activation_quantized", a),
        ],
        baseline: None,
    };
    let info = line_chart(&spec, &dir.join("accumulate_error_600.png"), Format::Png)?;
    println!("{info:?}");
    line_chart(&spec, &dir.join("accumulate_error_600.svg"), Format::Svg)?;

    // Partial quantization chart.
    let x: Vec<String> = [
        "none",
        "Conv_2",
        "Conv_7",
        "Conv_92",
        "mnasnet_1/lead_cell_1/op_0/depthwise_0/depthwise",
        "Conv_110",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let spec = LineChart {
        figure: Figure::new("partial quantization", "node", "cosine-similarity"),
        x_labels: x,
        series: vec![
            LineSeries::new(
                "single-node quantization",
                vec![0.99, 0.9995, 0.9991, 0.9989, 0.9997, 0.9999],
            )
            .color(Rgb::GREEN)
            .line(LineKind::None)
            .marker(Marker::Cross),
            LineSeries::new(
                "cumulative de-quantization",
                vec![0.99, 0.992, 0.994, 0.995, 0.998, 0.999],
            )
            .color(Rgb::RED),
        ],
        baseline: Some(Baseline::new(1.0, "baseline (float model)")),
    };
    line_chart(&spec, &dir.join("partial_quantization.png"), Format::Png)?;

    // Histograms.
    let fl = noise(20000, 1, 2.0);
    let q: Vec<f32> = fl.iter().map(|v| (v * 8.0).round() / 8.0).collect();
    let diff: Vec<f32> = fl.iter().zip(&q).map(|(a, b)| a - b).collect();
    let mut spec = Histogram::new(
        Figure::new(
            "node_output_/encoder/_blocks.0/_depthwise_conv/Conv_output_0  cosine=0.998731",
            "value",
            "count",
        ),
        vec![
            HistSeries::new("float", fl.clone()),
            HistSeries::new("calibrated", q),
            HistSeries::new("difference", diff),
        ],
    );
    spec.threshold = Some(VLine::new(4.2, "threshold 4.2"));
    spec.max_marker = Some(VLine::new(-5.3, "max |x| = 5.3"));
    histogram(&spec, &dir.join("histogram.png"), Format::Png)?;
    histogram(&spec, &dir.join("histogram.svg"), Format::Svg)?;
    spec.log_y = true;
    histogram(&spec, &dir.join("histogram_log.png"), Format::Png)?;

    // Box plots.
    for (n, per) in [(3usize, 4000usize), (96, 500), (2000, 200)] {
        let boxes: Vec<BoxStats> = (0..n)
            .map(|c| {
                let mut v = noise(per, c as u64 + 7, 1.0 + (c % 7) as f32 * 0.3);
                if c % 13 == 0 {
                    v[0] = 9.0 + c as f32 % 5.0;
                }
                BoxStats::from_values(&v, BoxStats::DEFAULT_MAX_OUTLIERS)
            })
            .collect::<Result<_, _>>()?;
        let spec = BoxPlot {
            figure: Figure::new(
                format!("input of 317_HzCalibration ({n} channels)"),
                "channel",
                "value",
            ),
            boxes,
            labels: None,
        };
        let info = box_plot(&spec, &dir.join(format!("boxplot_{n}.png")), Format::Png)?;
        if n == 96 {
            box_plot(&spec, &dir.join("boxplot_96.svg"), Format::Svg)?;
        }
        println!("{info:?}");
    }
    Ok(())
}
