//! A model over 2 GiB of weights, end to end: a MatMul whose 2.15 GB weight lives in
//! an external data file is calibrated, run float and calibrated, saved into another
//! folder, and the same model with its weight embedded is saved (it cannot be one
//! protobuf message, so the weight goes to a side file).
//!
//! Writes about 6.5 GB to a temporary folder and needs about 8 GB of memory, so it
//! runs only with `HMCT_BIG_TESTS=1`:
//! `HMCT_BIG_TESTS=1 cargo test -p hmct-cli --test big_model -- --nocapture`.
//! The small-file external-data paths are tested in CI (hmct-ir/tests/save.rs,
//! hmct-tensor/tests/external.rs).

use std::io::Write;
use std::path::Path;
use std::process::Command;

use hmct_ir::testing::build::{self, float_value, node};
use hmct_proto::Message;
use hmct_proto::onnx::{
    ModelProto, StringStringEntryProto, TensorProto, tensor_proto::DataLocation,
};
use hmct_tensor::Tensor;
use hmct_tensor::ndarray::{ArrayD, IxDyn};

const K: usize = 1 << 14;
/// K x N x 4 bytes = 2.15e9, just over the 2 GiB (2^31 - 1) protobuf limit.
const N: usize = 32_800;

/// Multiples of 1/8 in [-1, 1]: every partial sum of a column is exact in f32, so the
/// product with a vector of ones does not depend on the summation order.
fn weight(k: usize, n: usize) -> f32 {
    ((k * 7 + n * 13) % 17) as f32 / 8.0 - 1.0
}

fn model(weight: TensorProto) -> ModelProto {
    build::model(
        vec![float_value("x", &[1, K as i64])],
        vec![node("matmul", "MatMul", &["x", "w"], &["y"])],
        vec![weight],
        vec![float_value("y", &[1, N as i64])],
    )
}

fn weight_proto() -> TensorProto {
    TensorProto {
        name: Some("w".into()),
        data_type: Some(1),
        dims: vec![K as i64, N as i64],
        ..TensorProto::default()
    }
}

fn weight_bytes_row(k: usize, row: &mut Vec<u8>) {
    row.clear();
    for n in 0..N {
        row.extend_from_slice(&weight(k, n).to_le_bytes());
    }
}

fn hmct(args: &[&str], dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn output(dir: &Path) -> Vec<f32> {
    let t = hmct_tensor::read_npy(&dir.join("y/0.npy")).unwrap();
    t.as_f32().unwrap().iter().copied().collect()
}

#[test]
fn a_model_over_2_gib_loads_runs_calibrates_and_saves() {
    if std::env::var_os("HMCT_BIG_TESTS").is_none() {
        hmct_ir::testing::skip("set HMCT_BIG_TESTS=1 to run it (writes ~6.5 GB)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();

    // The weight in `big.onnx.weights`, after a 16-byte header so its offset is not
    // page-aligned.
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(root.join("big.onnx.weights")).unwrap());
    file.write_all(&[0u8; 16]).unwrap();
    let mut row = Vec::with_capacity(N * 4);
    for k in 0..K {
        weight_bytes_row(k, &mut row);
        file.write_all(&row).unwrap();
    }
    file.into_inner().unwrap().sync_all().unwrap();
    let entry = |key: &str, value: String| StringStringEntryProto {
        key: Some(key.into()),
        value: Some(value),
    };
    let mut w = weight_proto();
    w.data_location = Some(DataLocation::External as i32);
    w.external_data = vec![
        entry("location", "big.onnx.weights".into()),
        entry("offset", "16".into()),
        entry("length", (K * N * 4).to_string()),
    ];
    std::fs::write(root.join("big.onnx"), model(w).encode_to_vec()).unwrap();

    let x = Tensor::F32(ArrayD::from_elem(IxDyn(&[1, K]), 1.0f32));
    std::fs::create_dir_all(root.join("data/x")).unwrap();
    hmct_tensor::write_npy(&root.join("data/x/0.npy"), &x).unwrap();
    let expected: Vec<f32> = (0..N).map(|n| (0..K).map(|k| weight(k, n)).sum()).collect();

    // Calibrated next to the weights: the new model refers to the same file.
    hmct(&["calibrate", "big.onnx", "data", "-o", "cal.onnx"], root);
    let cal_size = std::fs::metadata(root.join("cal.onnx")).unwrap().len();
    assert!(
        cal_size < 1 << 20,
        "cal.onnx embeds the weight: {cal_size} bytes"
    );
    hmct(&["run", "cal.onnx", "data", "-o", "float", "--float"], root);
    assert_eq!(output(&root.join("float")), expected);
    hmct(&["run", "cal.onnx", "data", "-o", "calibrated"], root);
    let quantized = output(&root.join("calibrated"));
    let dot: f64 = quantized
        .iter()
        .zip(&expected)
        .map(|(a, b)| f64::from(a * b))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|a| f64::from(a * a)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&quantized) * norm(&expected));
    assert!(cosine > 0.99, "calibrated output cosine {cosine}");

    // Saved into another folder, the weight comes along into a side file.
    let other = root.join("elsewhere");
    std::fs::create_dir(&other).unwrap();
    let cal = hmct_ir::load_model(root.join("cal.onnx")).unwrap();
    hmct_ir::save_model(&cal, other.join("cal.onnx")).unwrap();
    drop(cal);
    assert!(
        std::fs::metadata(other.join("cal.onnx.data"))
            .unwrap()
            .len()
            >= (K * N * 4) as u64
    );
    std::fs::remove_file(root.join("big.onnx.weights")).unwrap();
    hmct(
        &[
            "run",
            "elsewhere/cal.onnx",
            "data",
            "-o",
            "moved",
            "--float",
        ],
        root,
    );
    assert_eq!(output(&root.join("moved")), expected);
    std::fs::remove_dir_all(&other).unwrap();

    // Embedded, the model is too big for one message: saving moves the weight out.
    let mut w = weight_proto();
    let mut raw = Vec::with_capacity(K * N * 4);
    for k in 0..K {
        weight_bytes_row(k, &mut row);
        raw.extend_from_slice(&row);
    }
    w.raw_data = Some(raw);
    let embedded = hmct_ir::Model::from_proto(model(w), None).unwrap();
    hmct_ir::save_model(&embedded, root.join("embedded.onnx")).unwrap();
    drop(embedded);
    let size = std::fs::metadata(root.join("embedded.onnx")).unwrap().len();
    assert!(
        size < 1 << 20,
        "embedded.onnx holds the weight: {size} bytes"
    );
    hmct(
        &["run", "embedded.onnx", "data", "-o", "embedded", "--float"],
        root,
    );
    assert_eq!(output(&root.join("embedded")), expected);
}
