//! Kernel benchmarks: fake quantization (in and out of cache), Conv (the shapes of the
//! detector and of MTCNN), MaxPool (MTCNN's), MatMul 512³, and the element-wise chains
//! that follow PP-OCR's convs, fused and node by node. Run with
//! `cargo bench -p hmct-quant`; with `HMCT_BENCH_THREADS=1` the Conv, MaxPool and MatMul
//! kernels run on the calling thread, as in a one-thread session (otherwise on rayon's
//! global pool).

#[path = "../tests/common/kernel.rs"]
#[allow(dead_code)]
mod common_kernel;

use common_kernel::{int, ints};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hmct_proto::onnx::AttributeProto;
use hmct_quant::fake_quant::{FakeQuant, QType};
use hmct_quant::ops::{Attrs, Kernel, NodeSpec, build_kernel, on_calling_thread};
use hmct_tensor::Tensor;

fn kernel(op: &str, attrs: &[AttributeProto], n_in: usize) -> Box<dyn Kernel> {
    let present = vec![true; n_in];
    let consts = vec![None; n_in];
    let spec = NodeSpec {
        name: op,
        op_type: op,
        domain: "",
        opset: 17,
        attrs: Attrs::new(attrs),
        num_inputs: n_in,
        inputs_present: &present,
        num_outputs: 1,
        const_inputs: &consts,
        stable_inputs: &consts.iter().map(Option::is_some).collect::<Vec<_>>(),
    };
    build_kernel(&spec).expect("kernel builds")
}

/// Deterministic pseudo-random values in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// Runs a kernel once, on the calling thread when `HMCT_BENCH_THREADS=1`.
fn run_kernel(k: &dyn Kernel, inputs: &[Option<&Tensor>]) -> Vec<Tensor> {
    static ONE_THREAD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let one = *ONE_THREAD.get_or_init(|| std::env::var("HMCT_BENCH_THREADS").as_deref() == Ok("1"));
    if one {
        on_calling_thread(|| k.run(inputs).unwrap())
    } else {
        k.run(inputs).unwrap()
    }
}

fn tensor(shape: &[usize], seed: u32) -> Tensor {
    Tensor::from_f32(shape, data(shape.iter().product(), seed)).unwrap()
}

fn fake_quant(c: &mut Criterion) {
    let fq = FakeQuant::symmetric(
        QType::Int {
            bits: 8,
            signed: true,
        },
        &[0.9],
        None,
    )
    .unwrap();
    let mut g = c.benchmark_group("fake_quant_int8");
    for n in [16 << 10, 64 << 20] {
        let src = data(n, 7);
        let mut buf = src.clone();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("{n}"), |b| {
            b.iter(|| {
                // Re-quantizing quantized data is the same work; no copy in the loop.
                fq.apply_in_place(&mut buf, &[n]).unwrap();
            })
        });
    }
    g.finish();
}

/// Conv shapes: the generic 3x3 and 1x1 of a mid-sized CNN, then the detector's
/// heaviest kinds (its 3x3 head convs, its first stride-2 conv, a pointwise conv with
/// few input channels on a large plane), MTCNN's and the classifier's depthwise.
fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv");
    g.sample_size(20);
    // (name, input channels, output channels, group, kernel, stride, pad, input height
    // and width)
    type Shape = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
    );
    let shapes: [Shape; 14] = [
        ("3x3_64to64_160x160", 64, 64, 1, 3, 1, 1, [160, 160]),
        ("depthwise3x3_64_160x160", 64, 64, 64, 3, 1, 1, [160, 160]),
        ("1x1_64to64_160x160", 64, 64, 1, 1, 1, 0, [160, 160]),
        ("3x3_96to24_160x160", 96, 24, 1, 3, 1, 1, [160, 160]),
        ("3x3s2_3to16_640x640", 3, 16, 1, 3, 2, 1, [640, 640]),
        ("1x1_16to32_320x320", 16, 32, 1, 1, 1, 0, [320, 320]),
        ("1x1_384to384_20x20", 384, 384, 1, 1, 1, 0, [20, 20]),
        // MTCNN's: O-Net's four convs, R-Net's second.
        ("3x3_3to32_48x48", 3, 32, 1, 3, 1, 0, [48, 48]),
        ("3x3_32to64_23x23", 32, 64, 1, 3, 1, 0, [23, 23]),
        ("3x3_64to64_10x10", 64, 64, 1, 3, 1, 0, [10, 10]),
        ("2x2_64to128_4x4", 64, 128, 1, 2, 1, 0, [4, 4]),
        ("3x3_28to48_11x11", 28, 48, 1, 3, 1, 0, [11, 11]),
        // The PP-OCR classifier's heaviest: 5x5 depthwise on planes 2 or 3 rows high.
        ("depthwise5x5_200_2x96", 200, 200, 200, 5, 1, 2, [2, 96]),
        ("depthwise5x5_88_3x96", 88, 88, 88, 5, 1, 2, [3, 96]),
    ];
    for (i, (name, ci, co, group, k, s, p, [h, width])) in shapes.into_iter().enumerate() {
        let seed = 10 * i as u32;
        let x = tensor(&[1, ci, h, width], seed + 1);
        let w = tensor(&[co, ci / group, k, k], seed + 2);
        let b = tensor(&[co], seed + 3);
        let attrs = [
            ints("pads", &[p as i64; 4]),
            ints("strides", &[s as i64; 2]),
            int("group", group as i64),
        ];
        let kc = kernel("Conv", &attrs, 3);
        let out = |size: usize| (size + 2 * p - k) / s + 1;
        g.throughput(Throughput::Elements(
            (2 * co * ci / group * k * k * out(h) * out(width)) as u64,
        ));
        g.bench_function(name, |bch| {
            bch.iter(|| run_kernel(&*kc, &[Some(&x), Some(&w), Some(&b)]))
        });
    }
    g.finish();
}

fn max_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("max_pool");
    // (name, channels, input size, kernel, stride, ceil mode); throughput in input
    // elements. O-Net's and R-Net's pools round up (ceil mode); R-Net's second one has
    // 4x4 outputs per plane.
    let shapes: [(&str, usize, usize, usize, usize, bool); 5] = [
        ("3x3s2_32_46x46", 32, 46, 3, 2, false),
        ("3x3s2_ceil_32_46x46", 32, 46, 3, 2, true),
        ("3x3s2_64_21x21", 64, 21, 3, 2, false),
        ("3x3s2_ceil_48_9x9", 48, 9, 3, 2, true),
        ("2x2s2_10_158x158", 10, 158, 2, 2, false),
    ];
    for (i, (name, ch, size, k, s, ceil)) in shapes.into_iter().enumerate() {
        let x = tensor(&[1, ch, size, size], 100 + i as u32);
        let attrs = [
            ints("kernel_shape", &[k as i64; 2]),
            ints("strides", &[s as i64; 2]),
            int("ceil_mode", ceil as i64),
        ];
        let kp = kernel("MaxPool", &attrs, 1);
        g.throughput(Throughput::Elements((ch * size * size) as u64));
        g.bench_function(name, |bch| bch.iter(|| run_kernel(&*kp, &[Some(&x)])));
    }
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    let a = tensor(&[512, 512], 8);
    let bm = tensor(&[512, 512], 9);
    let k = kernel("MatMul", &[], 2);
    g.throughput(Throughput::Elements(2 * 512 * 512 * 512));
    g.bench_function("512x512x512", |bch| {
        bch.iter(|| run_kernel(&*k, &[Some(&a), Some(&bm)]))
    });
    g.finish();
}

/// A model of one element-wise chain after a conv, as PP-OCR's exports write them:
/// the classifier's BatchNormalization + hard-swish, or the detector's folded
/// batch norm (Mul/Add), hard-swish, then a per-channel scale and shift.
fn chain_model(detector: bool, shape: &[usize]) -> hmct_quant::Plan {
    use hmct_ir::testing::build::{float_value, model, named_value, node};
    use hmct_tensor::tensor_to_proto;
    let c = shape[1];
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let channel = |name: &str, seed: u32, offset: f32| {
        let v = data(c, seed).iter().map(|v| v + offset).collect();
        tensor_to_proto(&Tensor::from_f32(&[c, 1, 1], v).unwrap(), name)
    };
    let scalar =
        |name: &str, v: f32| tensor_to_proto(&Tensor::from_f32(&[], vec![v]).unwrap(), name);
    let mut inits = vec![
        scalar("three", 3.0),
        scalar("zero", 0.0),
        scalar("six", 6.0),
    ];
    let mut nodes = Vec::new();
    // Both forms write the batch-normalized value as `h`.
    if detector {
        inits.extend([channel("s1", 1, 0.0), channel("b1", 2, 0.0)]);
        inits.extend([channel("s2", 3, 0.0), channel("b2", 4, 0.0)]);
        nodes.push(node("m1", "Mul", &["s1", "x"], &["a"]));
        nodes.push(node("a1", "Add", &["a", "b1"], &["h"]));
    } else {
        for (i, (n, off)) in [("scale", 0.0), ("bias", 0.0), ("mean", 0.0), ("var", 2.0)]
            .into_iter()
            .enumerate()
        {
            let mut t = channel(n, 10 + i as u32, off);
            t.dims = vec![c as i64];
            inits.push(t);
        }
        nodes.push(node(
            "bn",
            "BatchNormalization",
            &["x", "scale", "bias", "mean", "var"],
            &["h"],
        ));
    }
    nodes.push(node("p3", "Add", &["h", "three"], &["t"]));
    nodes.push(node("clip", "Clip", &["t", "zero", "six"], &["u"]));
    nodes.push(node("mul", "Mul", &["h", "u"], &["v"]));
    nodes.push(node(
        "div",
        "Div",
        &["v", "six"],
        if detector { &["w"] } else { &["y"] },
    ));
    if detector {
        nodes.push(node("m2", "Mul", &["s2", "w"], &["z"]));
        nodes.push(node("a2", "Add", &["z", "b2"], &["y"]));
    }
    let proto = model(
        vec![float_value("x", &dims)],
        nodes,
        inits,
        vec![named_value("y")],
    );
    let m = hmct_ir::Model::from_proto(proto, None).unwrap();
    hmct_quant::plan_model(&m).unwrap()
}

fn element_chain(c: &mut Criterion) {
    use hmct_quant::{Capture, Config, Session};
    let mut g = c.benchmark_group("element_chain");
    let cases: [(&str, bool, [usize; 4]); 2] = [
        ("cls_bn_hardswish_200x2x96", false, [1, 200, 2, 96]),
        ("det_8_nodes_16x160x160", true, [1, 16, 160, 160]),
    ];
    for (name, detector, shape) in cases {
        let x = tensor(&shape, 77);
        g.throughput(Throughput::Elements(shape.iter().product::<usize>() as u64));
        for fused in [true, false] {
            let session = Session::new(chain_model(detector, &shape), 1).unwrap();
            let session = if fused {
                session
            } else {
                session.without_fusion()
            };
            let label = format!("{name}/{}", if fused { "fused" } else { "node_by_node" });
            // Inputs bound once, so that the time is the chain's and not a copy of x.
            let bound = session.bind_inputs(&[("x", x.clone())]).unwrap();
            let wanted = session.plan().outputs().to_vec();
            g.bench_function(label, |b| {
                b.iter(|| {
                    session
                        .run_from(&bound, None, &Config::float(), &wanted, Capture::Wanted)
                        .unwrap()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, fake_quant, conv, max_pool, matmul, element_chain);
criterion_main!(benches);
