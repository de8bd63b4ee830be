//! Timing of a full forward pass of the PP-OCRv4 detector (640x640 DBNet) on one
//! thread, for comparison with onnxruntime (`ort: 1 thread, graph optimisations off`).
//! Ignored by default: `cargo test --release -p hmct-quant --test kernels_det_timing
//! -- --ignored --nocapture`.

use std::time::Instant;

use hmct_ir::load_model;
use hmct_quant::{Config, Session, plan_model};
use hmct_tensor::read_npy;

#[test]
#[ignore]
fn det_forward_one_thread() {
    let Some(dir) = hmct_ir::testing::shared_path("models/rapidocr_ppocrv4_det") else {
        return;
    };
    let model = load_model(dir.join("ch_PP-OCRv4_det_infer.onnx")).unwrap();
    let session = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    let name = session.plan().inputs()[0].name.clone();
    let x = read_npy(&dir.join("calibration_data").join(&name).join("0.npy")).unwrap();
    let run = || {
        session
            .run(&[(name.as_str(), x.clone())], &Config::float())
            .unwrap()
    };
    run();
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    eprintln!("det 640x640 forward, 1 thread: {ms:.1} ms");
}
