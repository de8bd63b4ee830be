//! Criterion benchmarks of the standard conv and MatMul shapes (see
//! `hmct_benches::CONV_SHAPES` and `MATMUL_SHAPES`), throughput in FLOP/s:
//! `cargo bench -p hmct-benches --bench kernel_shapes [-- FILTER]`. With
//! `HMCT_BENCH_THREADS=1` the kernels run on the calling thread, as in a one-thread
//! session. `kernel_table` prints the same shapes against the measured FMA peak.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hmct_benches::{CONV_SHAPES, Case, MATMUL_SHAPES};

fn one_thread() -> bool {
    std::env::var("HMCT_BENCH_THREADS").as_deref() == Ok("1")
}

fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv");
    g.sample_size(20);
    for (i, sh) in CONV_SHAPES.iter().enumerate() {
        let case = Case::conv(sh, 10 * i as u32);
        g.throughput(Throughput::Elements(sh.flops() as u64));
        g.bench_function(sh.name, |b| b.iter(|| case.run(one_thread())));
    }
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    g.sample_size(20);
    for (i, sh) in MATMUL_SHAPES.iter().enumerate() {
        let case = Case::matmul(sh, 500 + 10 * i as u32);
        g.throughput(Throughput::Elements(sh.flops() as u64));
        g.bench_function(sh.name, |b| b.iter(|| case.run(one_thread())));
    }
    g.finish();
}

criterion_group!(benches, conv, matmul);
criterion_main!(benches);
