// Temporary perf probe (not committed): times hot f32 kernels.
use std::time::Instant;
use hmct_quant::ops::{Attrs, NodeSpec, build_kernel};
use hmct_tensor::Tensor;
use hmct_proto::onnx::AttributeProto;

fn kernel(op: &str, opset: i64, attrs: &[AttributeProto], n_in: usize) -> Box<dyn hmct_quant::ops::Kernel> {
    let present = vec![true; n_in];
    let consts: Vec<Option<&Tensor>> = vec![None; n_in];
    let spec = NodeSpec { name: "n", op_type: op, domain: "", opset, attrs: Attrs::new(attrs),
        num_inputs: n_in, inputs_present: &present, num_outputs: 1, const_inputs: &consts };
    build_kernel(&spec).unwrap()
}

fn t(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape, (0..n).map(|i| ((i * 7919 % 1000) as f32) * 0.01 - 5.0).collect()).unwrap()
}

fn time(name: &str, k: &dyn hmct_quant::ops::Kernel, ins: &[&Tensor], bytes: usize) {
    let args: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
    for _ in 0..3 { k.run(&args).unwrap(); }
    let reps = 30;
    let t0 = Instant::now();
    for _ in 0..reps { std::hint::black_box(k.run(&args).unwrap()); }
    let dt = t0.elapsed().as_secs_f64() / reps as f64;
    eprintln!("{name:40} {:8.3} ms  {:6.2} GB/s", dt * 1e3, bytes as f64 / dt / 1e9);
}

#[test]
#[ignore]
fn perf_probe() {
    let x = t(&[1, 64, 112, 112]);
    let y = t(&[1, 64, 112, 112]);
    let c = t(&[64, 1, 1]);
    let s = t(&[1]);
    let n = x.len() * 4;
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            eprintln!("threads={threads}");
            time("Add same", &*kernel("Add", 13, &[], 2), &[&x, &y], 3 * n);
            time("Mul per-channel [C,1,1]", &*kernel("Mul", 13, &[], 2), &[&x, &c], 2 * n);
            time("Add scalar", &*kernel("Add", 13, &[], 2), &[&x, &s], 2 * n);
            time("Relu", &*kernel("Relu", 14, &[], 1), &[&x], 2 * n);
            time("Sigmoid", &*kernel("Sigmoid", 13, &[], 1), &[&x], 2 * n);
            time("Softmax last axis", &*kernel("Softmax", 13, &[], 1), &[&x], 2 * n);
            time("ReduceMean HW (attr axes)", &*kernel("ReduceMean", 13, &[AttributeProto{name: Some("axes".into()), ints: vec![2,3], r#type: Some(7), ..Default::default()}], 1), &[&x], n);
            time("Transpose 0231", &*kernel("Transpose", 13, &[AttributeProto{name: Some("perm".into()), ints: vec![0,2,3,1], r#type: Some(7), ..Default::default()}], 1), &[&x], 2 * n);
        });
    }
}
