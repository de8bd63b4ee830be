//! The metrics' one pass over a (float, probe) pair of values, as every probe of a
//! sensitivity sweep runs it per compared value and sample: `cargo bench -p
//! hmct-benches --bench metrics`. Sizes: DeepLabV3's 21x512x512 segmentation output
//! and a classifier's 1000 logits; throughput in element pairs.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hmct_metrics::{Metric, PairStats};

fn pair(n: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n)
        .map(|i| (i * 7919 % 1000) as f32 * 0.01 - 5.0)
        .collect();
    let y = x.iter().map(|v| v + 0.001).collect();
    (x, y)
}

fn pair_stats(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair_stats");
    for (name, n) in [
        ("deeplab_21x512x512", 21 * 512 * 512),
        ("logits_1000", 1000),
    ] {
        let (x, y) = pair(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut stats = PairStats::new();
                stats.update(&x, &y).expect("same lengths");
                stats.metric(Metric::CosineSimilarity)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pair_stats);
criterion_main!(benches);
