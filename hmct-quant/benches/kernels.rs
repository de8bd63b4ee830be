//! Kernel benchmarks: fake quantization (in and out of cache), Conv (the shapes of the
//! detector and of MTCNN), MaxPool (MTCNN's), MatMul 512³. Run with
//! `cargo bench -p hmct-quant`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hmct_proto::onnx::AttributeProto;
use hmct_proto::onnx::attribute_proto::AttributeType;
use hmct_quant::fake_quant::{FakeQuant, QType};
use hmct_quant::ops::{Attrs, Kernel, NodeSpec, build_kernel};
use hmct_tensor::Tensor;

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

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
/// few input channels on a large plane).
fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv");
    g.sample_size(20);
    // (name, input channels, output channels, group, kernel, stride, pad, input size)
    let shapes: [(&str, usize, usize, usize, usize, usize, usize, usize); 9] = [
        ("3x3_64to64_160x160", 64, 64, 1, 3, 1, 1, 160),
        ("depthwise3x3_64_160x160", 64, 64, 64, 3, 1, 1, 160),
        ("1x1_64to64_160x160", 64, 64, 1, 1, 1, 0, 160),
        ("3x3_96to24_160x160", 96, 24, 1, 3, 1, 1, 160),
        ("3x3s2_3to16_640x640", 3, 16, 1, 3, 2, 1, 640),
        ("1x1_16to32_320x320", 16, 32, 1, 1, 1, 0, 320),
        ("1x1_384to384_20x20", 384, 384, 1, 1, 1, 0, 20),
        ("3x3_32to64_23x23", 32, 64, 1, 3, 1, 0, 23),
        ("3x3_64to64_10x10", 64, 64, 1, 3, 1, 0, 10),
    ];
    for (i, (name, ci, co, group, k, s, p, size)) in shapes.into_iter().enumerate() {
        let seed = 10 * i as u32;
        let x = tensor(&[1, ci, size, size], seed + 1);
        let w = tensor(&[co, ci / group, k, k], seed + 2);
        let b = tensor(&[co], seed + 3);
        let attrs = [
            ints("pads", &[p as i64; 4]),
            ints("strides", &[s as i64; 2]),
            int("group", group as i64),
        ];
        let kc = kernel("Conv", &attrs, 3);
        let out = (size + 2 * p - k) / s + 1;
        g.throughput(Throughput::Elements(
            (2 * co * ci / group * k * k * out * out) as u64,
        ));
        g.bench_function(name, |bch| {
            bch.iter(|| kc.run(&[Some(&x), Some(&w), Some(&b)]).unwrap())
        });
    }
    g.finish();
}

fn max_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("max_pool");
    // (name, channels, input size, kernel, stride); throughput in input elements.
    let shapes: [(&str, usize, usize, usize, usize); 3] = [
        ("3x3s2_32_46x46", 32, 46, 3, 2),
        ("3x3s2_64_21x21", 64, 21, 3, 2),
        ("2x2s2_10_158x158", 10, 158, 2, 2),
    ];
    for (i, (name, ch, size, k, s)) in shapes.into_iter().enumerate() {
        let x = tensor(&[1, ch, size, size], 100 + i as u32);
        let attrs = [
            ints("kernel_shape", &[k as i64; 2]),
            ints("strides", &[s as i64; 2]),
        ];
        let kp = kernel("MaxPool", &attrs, 1);
        g.throughput(Throughput::Elements((ch * size * size) as u64));
        g.bench_function(name, |bch| bch.iter(|| kp.run(&[Some(&x)]).unwrap()));
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
        bch.iter(|| k.run(&[Some(&a), Some(&bm)]).unwrap())
    });
    g.finish();
}

criterion_group!(benches, fake_quant, conv, max_pool, matmul);
criterion_main!(benches);
