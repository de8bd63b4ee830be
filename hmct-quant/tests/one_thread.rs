//! A session of one thread runs on its caller's thread and hands no work to rayon.
//!
//! rayon's global pool in this test binary has one worker that never takes a job, so a
//! kernel that still went parallel inside a one-thread run would wait forever; a
//! timeout turns that into a failure naming the model. The runs must also equal a
//! two-thread session's bit for bit. The models are big enough that every parallel
//! site they reach would split its work (the 640x640 detector, calibrated so that fake
//! quantization runs on large activations too).

mod common;

use common::kernel::f32_bits;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use hmct_ir::load_model;
use hmct_ir::testing::{calibrate_for_tests, shared_dir};
use hmct_quant::{Config, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

/// Runs `model_path` (calibrated when asked) on its first sample under the float and
/// the calibrated configuration on one and on two threads, and compares the outputs.
fn one_thread_equals_two(models: &Path, dir: &str, file: &str, calibrate: bool) {
    let mut model = load_model(models.join(dir).join(file)).unwrap();
    if calibrate {
        model = calibrate_for_tests(model, 4.0).unwrap();
    }
    let one = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    let two = Session::new(plan_model(&model).unwrap(), 2).unwrap();
    let data = Dataset::open(
        &models.join(dir).join("calibration_data"),
        &one.plan().input_specs(),
    )
    .unwrap();
    let inputs = data.sample(0).unwrap();
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let configs = if calibrate {
        vec![Config::float(), Config::calibrated()]
    } else {
        vec![Config::float()]
    };
    for config in &configs {
        let a = one.run(&refs, config).unwrap();
        let b = two.run(&refs, config).unwrap();
        for (k, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                f32_bits(a),
                f32_bits(b),
                "{dir}: output {k}, 1 vs 2 threads"
            );
        }
    }
}

#[test]
fn one_thread_runs_hand_no_work_to_rayon() {
    let Some(shared) = shared_dir() else {
        return;
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .start_handler(|_| {
            loop {
                std::thread::park();
            }
        })
        .build_global()
        .expect("the global pool is set up before anything uses it");
    let models = shared.join("models");
    let cases = [
        ("rapidocr_ppocrv4_det", "ch_PP-OCRv4_det_infer.onnx", true),
        ("mtcnn_onet", "onet.onnx", true),
        (
            "rapidocr_ppocr_cls",
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            false,
        ),
    ];
    for (dir, file, calibrate) in cases {
        let (done, finished) = mpsc::channel();
        let models = models.clone();
        std::thread::spawn(move || {
            one_thread_equals_two(&models, dir, file, calibrate);
            done.send(()).unwrap();
        });
        match finished.recv_timeout(Duration::from_secs(120)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{dir}: the run failed"),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{dir}: no result after 120 s; a kernel waits on rayon's global pool")
            }
        }
    }
}
