//! Kernel benchmarks: fake quantization (in and out of cache), Conv (3x3 dense and
//! depthwise at 160x160), MatMul 512³. Run with `cargo bench -p hmct-quant`.

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

fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv");
    g.sample_size(20);
    let x = tensor(&[1, 64, 160, 160], 1);
    let w = tensor(&[64, 64, 3, 3], 2);
    let b = tensor(&[64], 3);
    let k = kernel("Conv", &[ints("pads", &[1, 1, 1, 1])], 3);
    g.throughput(Throughput::Elements(2 * 64 * 64 * 9 * 160 * 160));
    g.bench_function("3x3_64to64_160x160", |bch| {
        bch.iter(|| k.run(&[Some(&x), Some(&w), Some(&b)]).unwrap())
    });
    let wd = tensor(&[64, 1, 3, 3], 4);
    let kd = kernel("Conv", &[ints("pads", &[1, 1, 1, 1]), int("group", 64)], 3);
    g.throughput(Throughput::Elements(2 * 64 * 9 * 160 * 160));
    g.bench_function("depthwise3x3_64_160x160", |bch| {
        bch.iter(|| kd.run(&[Some(&x), Some(&wd), Some(&b)]).unwrap())
    });
    let w1 = tensor(&[64, 64, 1, 1], 5);
    let k1 = kernel("Conv", &[], 3);
    g.throughput(Throughput::Elements(2 * 64 * 64 * 160 * 160));
    g.bench_function("1x1_64to64_160x160", |bch| {
        bch.iter(|| k1.run(&[Some(&x), Some(&w1), Some(&b)]).unwrap())
    });
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

criterion_group!(benches, fake_quant, conv, matmul);
criterion_main!(benches);
