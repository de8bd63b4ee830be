//! `cargo xtask example`: builds examples/tiny_cnn from scratch.
//!
//! 1. A small float CNN written with the hmct-proto types: Conv(+folded BN)/ReLU
//!    blocks, a residual Add, a depthwise Conv, global pooling and a Gemm classifier,
//!    with deterministic weights from a seeded PRNG. Per output channel the weights
//!    spread like BN-folded weights do, and a few channels are 10x larger than the
//!    rest, so that per-tensor int8 would hurt and some activations have outlier
//!    channels.
//! 2. Eight structured 32x32 images (gradients, stripes, checkerboard, rings, shapes)
//!    written as PNG.
//! 3. `hmct-debugger make-data` turns them into calibration data, and
//!    `hmct-debugger calibrate` writes the calibrated model: the example is made by
//!    our own commands, through the same code paths users run.
//!
//! `--check` rebuilds into a temporary folder and fails if any file differs from the
//! committed one (everything is deterministic).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use hmct_benches::{int, ints};
use hmct_proto::Message;
use hmct_proto::onnx::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};

/// Arguments of `cargo xtask example`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output folder (default: examples/tiny_cnn of the repository).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Rebuild into a temporary folder and compare with the committed files.
    #[arg(long)]
    pub check: bool,
}

const SIZE: usize = 32;
const CLASSES: usize = 10;
const SAMPLES: usize = 8;
/// ImageNet statistics in 0-255 pixel units, as most CNN pipelines normalize.
const MEAN: &str = "123.675,116.28,103.53";
const STD: &str = "58.395,57.12,57.375";
/// The files the example consists of (README.md is written by hand).
const GENERATED: &[&str] = &["float_model.onnx", "calibrated_model.onnx"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_path_buf()
}

pub fn run(args: &Args) -> Result<()> {
    let committed = args
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("examples/tiny_cnn"));
    if args.check {
        let tmp = tempfile::tempdir()?;
        build(tmp.path())?;
        let mut differ = Vec::new();
        for rel in generated_files(tmp.path())? {
            let fresh = std::fs::read(tmp.path().join(&rel))?;
            let old = std::fs::read(committed.join(&rel)).unwrap_or_default();
            if fresh != old {
                differ.push(rel.display().to_string());
            }
        }
        if !differ.is_empty() {
            bail!(
                "{} differs from a fresh build: {}",
                committed.display(),
                differ.join(", ")
            );
        }
        eprintln!("{}: up to date", committed.display());
        return Ok(());
    }
    build(&committed)
}

/// Every generated file under `dir`, relative to it.
fn generated_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = GENERATED.iter().map(PathBuf::from).collect();
    for sub in ["images", "calibration_data/input"] {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir.join(sub))?
            .flatten()
            .map(|e| Path::new(sub).join(e.file_name()))
            .collect();
        names.sort();
        out.extend(names);
    }
    Ok(out)
}

fn build(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for stale in ["calibration_data", "images"] {
        let p = dir.join(stale);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| p.display().to_string())?;
        }
    }
    std::fs::create_dir_all(dir.join("images"))?;
    let model = tiny_cnn();
    std::fs::write(dir.join("float_model.onnx"), model.encode_to_vec())?;
    for i in 0..SAMPLES {
        let img = image_for(i);
        let path = dir.join("images").join(format!("{i}.png"));
        image::save_buffer(
            &path,
            &img,
            SIZE as u32,
            SIZE as u32,
            image::ColorType::Rgb8,
        )
        .with_context(|| path.display().to_string())?;
    }
    debugger(
        dir,
        &[
            "make-data",
            "float_model.onnx",
            "images",
            "-o",
            "calibration_data",
            "--mean",
            MEAN,
            "--std",
            STD,
        ],
    )?;
    debugger(
        dir,
        &[
            "calibrate",
            "float_model.onnx",
            "calibration_data",
            "-o",
            "calibrated_model.onnx",
        ],
    )?;
    Ok(())
}

/// Runs `hmct-debugger` (built by cargo from this workspace) in `dir`.
fn debugger(dir: &Path, args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = repo_root().join("Cargo.toml");
    let status = Command::new(cargo)
        .args(["run", "--quiet", "--release", "--manifest-path"])
        .arg(&manifest)
        .args(["-p", "hmct-cli", "--bin", "hmct-debugger", "--"])
        .args(args)
        .current_dir(dir)
        .status()
        .context("running cargo")?;
    ensure!(status.success(), "hmct-debugger {} failed", args.join(" "));
    Ok(())
}

// ---- weights ----

/// SplitMix64: tiny, seedable, and stable across platforms and versions.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// A conv weight `[out, in_per_group, k, k]` with He scaling, a log-normal spread
/// per output channel (what folding BatchNorm leaves), the channels in `loud` ten
/// times larger, and a small bias.
fn conv_weight(
    rng: &mut Rng,
    out: usize,
    in_per_group: usize,
    k: usize,
    loud: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let fan_in = (in_per_group * k * k) as f64;
    let he = (2.0 / fan_in).sqrt();
    let per = in_per_group * k * k;
    let mut w = Vec::with_capacity(out * per);
    let mut b = Vec::with_capacity(out);
    for c in 0..out {
        let spread = (0.35 * rng.normal()).exp();
        let gain = if loud.contains(&c) { 10.0 } else { 1.0 };
        for _ in 0..per {
            w.push((rng.normal() * he * spread * gain) as f32);
        }
        b.push((0.05 * rng.normal()) as f32);
    }
    (w, b)
}

fn tensor(name: &str, dims: &[usize], data: Vec<f32>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(1),
        raw_data: Some(data.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn float_value(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Builds the graph layer by layer.
struct Builder {
    rng: Rng,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
}

impl Builder {
    /// Conv (+ bias) named `name`, reading `input`, writing `name` + `_out`.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        name: &str,
        input: &str,
        cin: usize,
        cout: usize,
        k: usize,
        stride: i64,
        group: usize,
        loud: &[usize],
    ) -> String {
        let (w, b) = conv_weight(&mut self.rng, cout, cin / group, k, loud);
        let (wn, bn, out) = (
            format!("{name}.weight"),
            format!("{name}.bias"),
            format!("{name}_out"),
        );
        self.inits.push(tensor(&wn, &[cout, cin / group, k, k], w));
        self.inits.push(tensor(&bn, &[cout], b));
        let pad = (k / 2) as i64;
        let mut n = node(name, "Conv", &[input, &wn, &bn], &[&out]);
        n.attribute = vec![
            ints("kernel_shape", &[k as i64, k as i64]),
            ints("strides", &[stride, stride]),
            ints("pads", &[pad, pad, pad, pad]),
            int("group", group as i64),
        ];
        self.nodes.push(n);
        out
    }

    fn unary(&mut self, name: &str, op: &str, input: &str) -> String {
        let out = format!("{name}_out");
        self.nodes.push(node(name, op, &[input], &[&out]));
        out
    }
}

/// The float model: input `input` [1, 3, 32, 32]; outputs `logits` and `prob` [1, 10].
pub fn tiny_cnn() -> ModelProto {
    let mut g = Builder {
        rng: Rng(0x5EED_0F_C0FFEE),
        nodes: Vec::new(),
        inits: Vec::new(),
    };
    let x = g.conv("stem_conv", "input", 3, 16, 3, 1, 1, &[3, 11]);
    let x = g.unary("stem_relu", "Relu", &x);
    let x = g.conv("down_conv", &x, 16, 32, 3, 2, 1, &[]);
    let skip = g.unary("down_relu", "Relu", &x);
    let x = g.conv("res_conv1", &skip, 32, 32, 3, 1, 1, &[]);
    let x = g.unary("res_relu1", "Relu", &x);
    let x = g.conv("res_conv2", &x, 32, 32, 3, 1, 1, &[7]);
    g.nodes
        .push(node("res_add", "Add", &[&x, &skip], &["res_add_out"]));
    let x = g.unary("res_relu2", "Relu", "res_add_out");
    let x = g.conv("dw_conv", &x, 32, 32, 3, 2, 32, &[5, 20]);
    let x = g.unary("dw_relu", "Relu", &x);
    let x = g.conv("pw_conv", &x, 32, 64, 1, 1, 1, &[9]);
    let x = g.unary("pw_relu", "Relu", &x);
    let x = g.unary("gap", "GlobalAveragePool", &x);
    let x = g.unary("flatten", "Flatten", &x);
    let w: Vec<f32> = (0..CLASSES * 64)
        .map(|_| (g.rng.normal() / 200.0) as f32)
        .collect();
    let b: Vec<f32> = (0..CLASSES)
        .map(|_| (0.1 * g.rng.normal()) as f32)
        .collect();
    g.inits.push(tensor("fc.weight", &[CLASSES, 64], w));
    g.inits.push(tensor("fc.bias", &[CLASSES], b));
    let mut fc = node("fc", "Gemm", &[&x, "fc.weight", "fc.bias"], &["logits"]);
    fc.attribute = vec![int("transB", 1)];
    g.nodes.push(fc);
    let mut softmax = node("softmax", "Softmax", &["logits"], &["prob"]);
    softmax.attribute = vec![int("axis", 1)];
    g.nodes.push(softmax);

    ModelProto {
        ir_version: Some(8),
        producer_name: Some("hmct-rs xtask example".into()),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("tiny_cnn".into()),
            node: g.nodes,
            initializer: g.inits,
            input: vec![float_value("input", &[1, 3, SIZE as i64, SIZE as i64])],
            output: vec![
                float_value("logits", &[1, CLASSES as i64]),
                float_value("prob", &[1, CLASSES as i64]),
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---- images ----

/// Image `i` of the calibration set, RGB8, row-major: eight kinds of structure.
fn image_for(i: usize) -> Vec<u8> {
    let mut rng = Rng(1000 + i as u64);
    let s = SIZE as f64;
    // Random but fixed colours and phases per image.
    let c1: [f64; 3] = std::array::from_fn(|_| rng.uniform() * 255.0);
    let c2: [f64; 3] = std::array::from_fn(|_| rng.uniform() * 255.0);
    let phase = rng.uniform() * std::f64::consts::TAU;
    let rects: Vec<[f64; 4]> = (0..4)
        .map(|_| {
            let (x, y) = (rng.uniform() * s, rng.uniform() * s);
            [
                x,
                y,
                x + 4.0 + rng.uniform() * 12.0,
                y + 4.0 + rng.uniform() * 12.0,
            ]
        })
        .collect();
    let mut out = Vec::with_capacity(SIZE * SIZE * 3);
    for y in 0..SIZE {
        for x in 0..SIZE {
            let (fx, fy) = (x as f64 / s, y as f64 / s);
            // t in [0, 1]: how much of colour 2 the pixel gets.
            let t = match i % SAMPLES {
                0 => fx,
                1 => f64::from(u8::from((x / 4) % 2 == 0)),
                2 => f64::from(u8::from(((x / 8) + (y / 8)) % 2 == 0)),
                3 => {
                    let r = ((fx - 0.5).powi(2) + (fy - 0.5).powi(2)).sqrt();
                    0.5 + 0.5 * (r * 40.0 + phase).sin()
                }
                4 => (fx + fy) / 2.0,
                5 => {
                    let r = ((fx - 0.4).powi(2) + (fy - 0.6).powi(2)).sqrt();
                    f64::from(u8::from(r < 0.25))
                }
                6 => {
                    let inside = rects.iter().any(|r| {
                        (r[0]..r[2]).contains(&(x as f64)) && (r[1]..r[3]).contains(&(y as f64))
                    });
                    f64::from(u8::from(inside))
                }
                _ => 0.5 + 0.25 * (fx * 9.0 + phase).sin() + 0.25 * (fy * 7.0 - phase).cos(),
            };
            for ch in 0..3 {
                let v = c1[ch] * (1.0 - t) + c2[ch] * t;
                out.push(v.round().clamp(0.0, 255.0) as u8);
            }
        }
    }
    out
}
