//! `run --profile`: time per op type and the slowest nodes, on the calibrated P-Net.
//! Needs ../shared/models.

mod common;

use common::{fixture, ok};

/// The rows of the table under `heading`, split on whitespace, up to the blank line.
fn table<'a>(out: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn profile_lists_every_op_type_and_the_slowest_nodes() {
    let Some(f) = fixture() else { return };
    let out = ok(&f.run("run", &["--profile", "--repeat", "2", "--threads", "1"]));

    let model = hmct_ir::load_model(&f.model).unwrap();
    let nodes = &model.graph_proto().node;
    let count = |op: &str| nodes.iter().filter(|n| n.op_type() == op).count();
    let by_op = table(&out, "time per run by op type");
    assert!(!by_op.is_empty(), "{out}");
    let mut shares = 0.0;
    for row in &by_op {
        let [op, n, ms, share] = row[..] else {
            panic!("row {row:?} in {out}")
        };
        assert_eq!(n.parse::<usize>().unwrap(), count(op), "{op} in {out}");
        assert!(ms.parse::<f64>().unwrap() >= 0.0);
        shares += share.trim_end_matches('%').parse::<f64>().unwrap();
    }
    assert!(
        (shares - 100.0).abs() < 0.5,
        "shares sum to {shares}: {out}"
    );
    let listed: usize = by_op.iter().map(|r| r[1].parse::<usize>().unwrap()).sum();
    assert_eq!(listed, nodes.len(), "{out}");

    let slowest = table(&out, "slowest nodes");
    assert_eq!(slowest.len(), 10.min(nodes.len()), "{out}");
    let ms: Vec<f64> = slowest.iter().map(|r| r[2].parse().unwrap()).collect();
    assert!(
        ms.windows(2).all(|w| w[0] >= w[1]),
        "not slowest first: {out}"
    );
    for row in &slowest {
        assert!(
            nodes
                .iter()
                .any(|n| n.name() == row[0] && n.op_type() == row[1]),
            "{row:?}"
        );
    }
}

#[test]
fn no_profile_without_the_flag() {
    let Some(f) = fixture() else { return };
    let out = ok(&f.run("run", &["--threads", "1"]));
    assert!(!out.contains("op type"), "{out}");
}

#[test]
fn slowest_sets_how_many_nodes_are_listed() {
    let Some(f) = fixture() else { return };
    let out = ok(&f.run("run", &["--profile", "--slowest", "3", "--threads", "1"]));
    assert_eq!(table(&out, "slowest nodes").len(), 3, "{out}");
    let all = ok(&f.run(
        "run",
        &["--profile", "--slowest", "100000", "--threads", "1"],
    ));
    let model = hmct_ir::load_model(&f.model).unwrap();
    // Every node of the P-Net runs, so each is listed once.
    assert_eq!(
        table(&all, "slowest nodes").len(),
        model.graph_proto().node.len(),
        "{all}"
    );
}
