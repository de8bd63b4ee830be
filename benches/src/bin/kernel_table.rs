//! GFLOP/s and percentage of the measured f32 FMA peak for the standard conv and
//! MatMul shapes of `hmct_benches` (ResNet-50, mobile CNNs, YOLO, RegNet, DeepLab,
//! BERT-base) and classifier rows run together (`rows_`), and GB/s of input read for
//! the zoo's MaxPools and AveragePools (`max`, `avg`), each kernel on the calling
//! thread:
//! `kernel_table [FILTER] [--runs N] [--cold]` (`cargo build --release -p
//! hmct-benches --bin kernel_table`). Times are the least thread CPU time of N runs
//! (default 20), so other processes on the core do not inflate them. With `--cold`,
//! 64 MiB are written between runs, so weights and inputs come from memory, as they
//! do inside a model whose other nodes ran in between. With `--threads N` (N > 1) each
//! kernel runs in a pool of N threads and times are wall-clock (the least of the runs),
//! against N times the one-core peak: how a kernel splits its work, not how one core
//! runs it.

use hmct_benches::{
    CONV_SHAPES, Case, MATMUL_SHAPES, POOL_SHAPES, ROWS_SHAPES, fma_peak_gflops, min_time_after,
};

/// Large buffers on cache lines, as in `hmct-debugger` (see `hmct_quant::alloc`).
#[global_allocator]
static ALLOC: hmct_quant::CacheLineAlloc = hmct_quant::CacheLineAlloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 20;
    let mut filter = String::new();
    let mut cold = false;
    let mut threads = 1;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => match it.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => runs = n,
                _ => {
                    eprintln!("error: --runs takes a positive number");
                    std::process::exit(2);
                }
            },
            "--cold" => cold = true,
            "--threads" => match it.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => threads = n,
                _ => {
                    eprintln!("error: --threads takes a positive number");
                    std::process::exit(2);
                }
            },
            other if other.starts_with('-') => {
                eprintln!(
                    "error: unknown option {other}; usage: kernel_table [FILTER] [--runs N] [--cold] [--threads N]"
                );
                std::process::exit(2);
            }
            other => filter = other.to_string(),
        }
    }
    let core_peak = fma_peak_gflops();
    println!("f32 FMA peak of one core (measured): {core_peak:.1} GFLOP/s");
    let peak = core_peak * threads as f64;
    let pool = (threads > 1).then(|| {
        println!("{threads} threads: wall-clock times, against {peak:.1} GFLOP/s");
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    });
    println!(
        "{:<28} {:>9} {:>9} {:>7}",
        "shape", "ms", "GFLOP/s", "% peak"
    );
    let mut evict = vec![0u8; if cold { 64 << 20 } else { 0 }];
    let mut time = |case: &Case| {
        if let Some(pool) = &pool {
            // Wall-clock, not the calling thread's CPU time: the kernel's tasks run on
            // the pool's threads. Workers may sleep between runs (with `--cold`,
            // surely), so a run can include waking them.
            return pool.install(|| {
                std::hint::black_box(case.run(false));
                (0..runs)
                    .map(|_| {
                        evict.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                        std::hint::black_box(&evict);
                        let t = std::time::Instant::now();
                        std::hint::black_box(case.run(false));
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            });
        }
        min_time_after(
            runs,
            || {
                evict.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                std::hint::black_box(&evict);
            },
            || {
                std::hint::black_box(case.run(true));
            },
        )
    };
    let mut row = |name: &str, flops: f64, case: &Case| {
        let secs = time(case);
        let gflops = flops / secs / 1e9;
        println!(
            "{name:<28} {:>9.3} {gflops:>9.1} {:>6.0}%",
            secs * 1e3,
            100.0 * gflops / peak
        );
    };
    for (i, sh) in CONV_SHAPES.iter().enumerate() {
        if sh.name.contains(&filter) {
            row(sh.name, sh.flops(), &Case::conv(sh, 10 * i as u32));
        }
    }
    for (i, sh) in MATMUL_SHAPES.iter().enumerate() {
        if sh.name.contains(&filter) {
            row(sh.name, sh.flops(), &Case::matmul(sh, 500 + 10 * i as u32));
        }
    }
    for (i, sh) in ROWS_SHAPES.iter().enumerate() {
        if sh.name.contains(&filter) {
            row(sh.name, sh.flops(), &Case::rows(sh, 900 + 10 * i as u32));
        }
    }
    // Pools do little arithmetic: their rate is the input read per second.
    let mut printed_header = false;
    for (i, sh) in POOL_SHAPES.iter().enumerate() {
        if sh.name.contains(&filter) {
            if !printed_header {
                println!("{:<28} {:>9} {:>9}", "pool", "ms", "GB/s in");
                printed_header = true;
            }
            let secs = time(&Case::pool(sh, 700 + 10 * i as u32));
            println!(
                "{:<28} {:>9.3} {:>9.1}",
                sh.name,
                secs * 1e3,
                sh.input_bytes() / secs / 1e9
            );
        }
    }
}
