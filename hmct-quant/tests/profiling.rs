//! Per-node timing: off unless asked for, and counting only the nodes a run executes;
//! which shows that a raised cancel flag stops a run before its next node (the
//! Python package's Ctrl-C).

use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, model, node};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hmct_quant::{Capture, Config, RunError, Session, plan_model};
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
    Session::new(plan_model(&model).unwrap(), 1).unwrap()
}

fn input() -> Vec<(&'static str, Tensor)> {
    vec![(
        "x",
        Tensor::from_f32(&[2, 3], vec![-1.0, 2.0, -3.0, 4.0, -5.0, 6.0]).unwrap(),
    )]
}

#[test]
fn timing_is_off_unless_asked_for() {
    let s = session();
    s.run(&input(), &Config::float()).unwrap();
    assert!(s.node_times().is_none());
}

#[test]
fn each_run_counts_the_nodes_it_executes() {
    let s = session().with_profiling();
    let zero = s.node_times().unwrap();
    assert_eq!(zero.calls, vec![0, 0, 0]);
    for _ in 0..3 {
        s.run(&input(), &Config::float()).unwrap();
    }
    assert_eq!(s.node_times().unwrap().calls, vec![3, 3, 3]);

    // Once `b` is known, only its reader runs.
    let bound = s.bind_inputs(&input()).unwrap();
    let plan = s.plan();
    let (a, b, y) = (
        plan.value("a").unwrap(),
        plan.value("b").unwrap(),
        plan.value("y").unwrap(),
    );
    let captured = s
        .run_from(&bound, None, &Config::float(), &[b], Capture::All)
        .unwrap();
    assert!(captured.get(a).is_some());
    let times = s.node_times().unwrap();
    assert_eq!(times.calls, vec![4, 4, 3]);
    s.run_from(
        &captured,
        Some(&Config::float()),
        &Config::float(),
        &[y],
        Capture::Wanted,
    )
    .unwrap();
    let times = s.node_times().unwrap();
    assert_eq!(times.calls, vec![4, 4, 4]);
    assert!(times.total.iter().all(|t| !t.is_zero()));
}

#[test]
fn a_raised_flag_stops_the_run_before_any_node() {
    let mut s = session().with_profiling();
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
