//! A raised cancel flag stops a run before its next node, and a lowered one is
//! harmless: the Python package's Ctrl-C relies on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, model, node};
use hmct_quant::{Config, RunError, Session, plan_model};
use hmct_tensor::Tensor;

fn session() -> Session {
    let proto = model(
        vec![float_value("x", &[2, 3])],
        vec![
            node("relu", "Relu", &["x"], &["a"]),
            node("neg", "Neg", &["a"], &["b"]),
            node("abs", "Abs", &["b"], &["y"]),
        ],
        vec![],
        vec![float_value("y", &[2, 3])],
    );
    let model = Model::from_proto(proto, None).unwrap();
    Session::new(plan_model(&model).unwrap(), 1)
        .unwrap()
        .with_profiling()
}

fn input() -> Vec<(&'static str, Tensor)> {
    vec![(
        "x",
        Tensor::from_f32(&[2, 3], vec![-1.0, 2.0, -3.0, 4.0, -5.0, 6.0]).unwrap(),
    )]
}

#[test]
fn a_raised_flag_stops_the_run_before_any_node() {
    let mut s = session();
    let flag = Arc::new(AtomicBool::new(true));
    s.set_cancel_flag(flag.clone());
    let e = s.run(&input(), &Config::float()).unwrap_err();
    assert!(matches!(e, RunError::Cancelled), "{e}");
    assert_eq!(s.node_times().unwrap().calls, vec![0, 0, 0]);

    flag.store(false, Ordering::Relaxed);
    let out = s.run(&input(), &Config::float()).unwrap();
    let plain = session().run(&input(), &Config::float()).unwrap();
    assert_eq!(out[0].as_f32(), plain[0].as_f32());
    assert_eq!(s.node_times().unwrap().calls, vec![1, 1, 1]);
}
