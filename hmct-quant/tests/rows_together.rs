//! Samples run together (`Session::run_many_from`) equal samples run alone, bit for
//! bit: a classifier head's products of one row by a constant matrix run for all the
//! samples in one pass over the weight (Gemm with and without a bias, transposed and
//! not), the nodes after them in lockstep, on 1 and 2 threads, for an odd number of
//! samples (a group of four rows and one alone).

use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, int_attr, ints_attr, model, named_value, node};
use hmct_quant::{Capture, Config, Override, Session, plan_model};
use hmct_tensor::{Tensor, tensor_to_proto};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// A 1x1 conv 64 -> 96 on a 7x7 map, Relu, global average pool, Flatten, then a Gemm
/// 96 -> 700 (weight transposed, bias), Relu (a graph output too), a Gemm 700 -> 300
/// (no bias) and a Softmax, with calibration nodes on the conv; beside them, the Relu's
/// 700 values as a 1-D vector times a 700 x 120 MatMul weight (a product that stays
/// off the single-row kernel when run alone, so it must stay off it together).
fn classifier() -> Model {
    let weight = |name: &str, shape: &[usize], seed| {
        let t = Tensor::from_f32(shape, values(shape.iter().product(), seed)).unwrap();
        tensor_to_proto(&t, name)
    };
    let mut conv = node("conv", "Conv", &["x", "wc"], &["c"]);
    conv.attribute.push(ints_attr("kernel_shape", vec![1, 1]));
    let mut fc1 = node("fc1", "Gemm", &["f", "w1", "b1"], &["g1"]);
    fc1.attribute.push(int_attr("transB", 1));
    let proto = model(
        vec![float_value("x", &[1, 64, 7, 7])],
        vec![
            conv,
            node("relu", "Relu", &["c"], &["r"]),
            node("pool", "GlobalAveragePool", &["r"], &["p"]),
            node("flat", "Flatten", &["p"], &["f"]),
            fc1,
            node("relu1", "Relu", &["g1"], &["h1"]),
            node("fc2", "Gemm", &["h1", "w2"], &["g2"]),
            node("soft", "Softmax", &["g2"], &["y"]),
            node("flat1", "Reshape", &["h1", "vec_shape"], &["v"]),
            node("fc3", "MatMul", &["v", "w3"], &["z"]),
        ],
        vec![
            weight("wc", &[96, 64, 1, 1], 1),
            weight("w1", &[700, 96], 2),
            weight("b1", &[700], 3),
            weight("w2", &[700, 300], 4),
            weight("w3", &[700, 120], 5),
            tensor_to_proto(&Tensor::from_i64(&[1], vec![700]).unwrap(), "vec_shape"),
        ],
        vec![named_value("h1"), named_value("y"), named_value("z")],
    );
    let model = Model::from_proto(proto, None).unwrap();
    hmct_ir::testing::calibrate_for_tests(model, 0.5).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn samples_run_together_equal_samples_run_alone() {
    let model = classifier();
    for threads in [1, 2] {
        let session = Session::new(plan_model(&model).unwrap(), threads)
            .unwrap()
            .with_profiling();
        let plan = session.plan();
        let outputs = plan.outputs().to_vec();
        let inputs: Vec<Tensor> = (0..5)
            .map(|s| Tensor::from_f32(&[1, 64, 7, 7], values(64 * 49, 100 + s)).unwrap())
            .collect();
        let captures: Vec<_> = inputs
            .iter()
            .map(|x| {
                let bound = session.bind_inputs(&[("x", x.clone())]).unwrap();
                session
                    .run_from(&bound, None, &Config::float(), &outputs, Capture::All)
                    .unwrap()
            })
            .collect();
        let knowns: Vec<_> = captures.iter().collect();
        let float = Config::float();
        let n_cal = plan.calibrations().len();
        assert!(n_cal >= 2, "the conv has calibration nodes");
        let mut configs = vec![Config::float(), Config::calibrated()];
        configs.extend((0..n_cal).map(|c| Config::float().with(c, Override::On)));
        for cfg in &configs {
            let together = session
                .run_many_from(&knowns, Some(&float), cfg, &outputs, Capture::Wanted)
                .unwrap();
            assert_eq!(together.len(), inputs.len());
            for (s, many) in together.iter().enumerate() {
                let full = session.run(&[("x", inputs[s].clone())], cfg).unwrap();
                for (k, &o) in outputs.iter().enumerate() {
                    assert_eq!(
                        bits(&session.value(many, o).unwrap()),
                        bits(&full[k]),
                        "sample {s}, output {k}, {threads} thread(s)"
                    );
                }
            }
        }
        let times = session.node_times().unwrap();
        for name in ["fc1", "fc2"] {
            let i = plan.nodes().iter().position(|n| n.name == name).unwrap();
            assert!(
                times.rows_calls[i] > 0,
                "{name} ran for the samples together"
            );
        }
    }
}
