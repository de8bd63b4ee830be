//! Per-node timing: off unless asked for, and counting only the nodes a run executes.

use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, model, node};
use hmct_quant::{Capture, Config, Session, plan_model};
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
