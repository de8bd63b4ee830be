//! `cargo xtask peak`: measures the machine's arithmetic peak per core with loops
//! whose operands never leave the registers, so the figure is what the execution
//! units deliver, not what memory does: f32 FMA with AVX-512 and with AVX2,
//! AVX512_BF16 `vdpbf16ps`, and AMX-BF16 `tdpbf16ps` where the CPU has it.
//!
//! Each loop keeps 12-16 independent accumulators (more than FMA latency x ports
//! on current x86 cores: 4 cycles x 2 ports), runs for about `SLICE` seconds, and is
//! timed by the thread's own CPU clock (`CLOCK_THREAD_CPUTIME_ID`), so time the
//! thread spent descheduled on a shared machine is not counted; the best of
//! `ROUNDS` is kept. At two threads both run at once and their rates are added.
//! The f32 figure is cached in `target/peak.json` for `bench-ort`.

use std::path::Path;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;

const ROUNDS: usize = 7;
/// Seconds per timed round (about; the loop count is set from a first calibration).
const SLICE: f64 = 0.15;

/// One register-resident loop: `flops_per_iter` floating-point operations per
/// iteration (an FMA is two), `run(iters)` executes it.
struct Kernel {
    name: &'static str,
    flops_per_iter: f64,
    run: fn(u64),
}

/// Rates in GFLOP/s: per thread, by its CPU time (best round), and the sum over
/// threads running together.
pub struct Measured {
    pub name: &'static str,
    /// `(threads, sum of per-thread rates, by wall time)` per thread count.
    pub rates: Vec<(usize, f64, f64)>,
}

fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best rate of `k` in GFLOP/s on this thread (CPU time), and the wall time of the
/// timed rounds.
fn best_rate(k: &Kernel, iters: u64) -> (f64, f64) {
    let mut best = 0.0f64;
    let mut wall_best = 0.0f64;
    for _ in 0..ROUNDS {
        let w = Instant::now();
        let t = thread_cpu_secs();
        (k.run)(iters);
        let cpu = thread_cpu_secs() - t;
        let w = w.elapsed().as_secs_f64();
        let flops = k.flops_per_iter * iters as f64;
        best = best.max(flops / cpu * 1e-9);
        wall_best = wall_best.max(flops / w * 1e-9);
    }
    (best, wall_best)
}

/// Loop count for about `SLICE` seconds of `k` on one core.
fn calibrate_iters(k: &Kernel) -> u64 {
    let mut iters = 1u64 << 16;
    loop {
        let t = thread_cpu_secs();
        (k.run)(iters);
        let secs = thread_cpu_secs() - t;
        if secs > 0.02 {
            return ((iters as f64) * SLICE / secs).max(1.0) as u64;
        }
        iters *= 4;
    }
}

fn measure(k: &Kernel, threads: &[usize], setup: fn() -> bool) -> Measured {
    let iters = calibrate_iters(k);
    let rates = threads
        .iter()
        .map(|&n| {
            let barrier = Barrier::new(n);
            let per_thread: Vec<(f64, f64)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|_| {
                        s.spawn(|| {
                            // Per-thread state (AMX tile permission) first.
                            setup();
                            barrier.wait();
                            best_rate(k, iters)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let cpu: f64 = per_thread.iter().map(|r| r.0).sum();
            let wall: f64 = per_thread.iter().map(|r| r.1).sum();
            (n, cpu, wall)
        })
        .collect();
    Measured {
        name: k.name,
        rates,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// Inputs of the loops: small, normal values (no denormals, no overflow in the
    /// run lengths used).
    static AB: [f32; 2] = [1.0e-7, 0.999];

    /// The loop every vector kernel runs: broadcast the two inputs into `$a` and `$b`,
    /// zero the accumulators, then per iteration `$op acc, $a, $b` into each
    /// accumulator in turn, `$iters` times. Reads `AB`; every register written is
    /// declared. `zmm` stands for the AVX-512 registers: inputs in zmm30 and zmm31,
    /// 16 accumulators.
    macro_rules! register_loop {
        ($iters:expr, $op:literal, zmm) => {
            register_loop!(
                $iters,
                $op,
                "zmm30",
                "zmm31",
                [
                    "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9",
                    "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15",
                ]
            )
        };
        ($iters:expr, $op:literal, $a:tt, $b:tt, [$($acc:tt),+ $(,)?]) => {
            asm!(
                concat!("vbroadcastss ", $a, ", dword ptr [{p}]"),
                concat!("vbroadcastss ", $b, ", dword ptr [{p} + 4]"),
                $(concat!("vxorps ", $acc, ", ", $acc, ", ", $acc),)+
                "2:",
                $(concat!($op, " ", $acc, ", ", $a, ", ", $b),)+
                "dec {n}",
                "jnz 2b",
                p = in(reg) AB.as_ptr(),
                n = inout(reg) $iters => _,
                $(out($acc) _,)+
                out($a) _, out($b) _,
                options(nostack, readonly),
            )
        };
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn fma512_inner(iters: u64) {
        // SAFETY: see `register_loop`.
        unsafe {
            register_loop!(iters, "vfmadd231ps", zmm);
        }
    }

    /// 16 FMAs of 16 lanes per iteration.
    pub fn fma512(iters: u64) {
        // SAFETY: only called when the CPU has AVX-512F (see `kernels`).
        unsafe { fma512_inner(iters) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma256_inner(iters: u64) {
        // SAFETY: see `register_loop`.
        unsafe {
            register_loop!(
                iters,
                "vfmadd231ps",
                "ymm14",
                "ymm15",
                [
                    "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9",
                    "ymm10", "ymm11",
                ]
            );
        }
    }

    /// 12 FMAs of 8 lanes per iteration.
    pub fn fma256(iters: u64) {
        // SAFETY: only called when the CPU has AVX2 and FMA.
        unsafe { fma256_inner(iters) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dpbf16_inner(iters: u64) {
        // SAFETY: see `register_loop`. The broadcast f32 bit patterns read as pairs
        // of bf16 values; which values does not change the timing (no denormals).
        unsafe {
            register_loop!(iters, "vdpbf16ps", zmm);
        }
    }

    /// 16 `vdpbf16ps` per iteration: 16 lanes x 2 products x 2 operations each.
    pub fn dpbf16(iters: u64) {
        // SAFETY: only called when the CPU has AVX512_BF16.
        unsafe { dpbf16_inner(iters) }
    }

    /// AMX-TILE and AMX-BF16 (CPUID.(EAX=7,ECX=0):EDX bits 24 and 22).
    pub fn has_amx_bf16() -> bool {
        let l7 = std::arch::x86_64::__cpuid_count(7, 0);
        l7.edx & (1 << 24) != 0 && l7.edx & (1 << 22) != 0
    }

    /// Asks Linux for the AMX tile state of this thread's process
    /// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); false if refused.
    pub fn request_amx() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a system call with integer arguments.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }

    /// Tile configuration (palette 1): tiles 0-7 of 16 rows x 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    #[repr(C, align(64))]
    struct Tile([u16; 512]);

    /// Four `tdpbf16ps` per iteration into four independent C tiles (0-3) from A
    /// tiles 4-5 and B tiles 6-7, loaded once: each is 16 x 16 outputs x 32 bf16
    /// products x 2 operations. The instructions are written as bytes (checked with
    /// GNU as 2.40) since the AMX target features are not stable in Rust.
    pub fn amx_bf16(iters: u64) {
        let mut cfg = TileConfig([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64; // colsb, u16 little-endian
            cfg.0[48 + t] = 16; // rows
        }
        let data = Tile([0x3f80; 512]); // bf16 1.0
        // SAFETY: only called after has_amx_bf16() and request_amx() succeeded; the
        // tile config and data are valid for the loads; tilerelease at the end.
        unsafe {
            asm!(
                ".byte 0xc4,0xe2,0x78,0x49,0x07", // ldtilecfg [rdi]
                ".byte 0xc4,0xe2,0x7b,0x49,0xc0", // tilezero tmm0
                ".byte 0xc4,0xe2,0x7b,0x49,0xc8", // tilezero tmm1
                ".byte 0xc4,0xe2,0x7b,0x49,0xd0", // tilezero tmm2
                ".byte 0xc4,0xe2,0x7b,0x49,0xd8", // tilezero tmm3
                ".byte 0xc4,0xe2,0x7b,0x4b,0x24,0x16", // tileloadd tmm4, [rsi+rdx]
                ".byte 0xc4,0xe2,0x7b,0x4b,0x2c,0x16", // tileloadd tmm5, [rsi+rdx]
                ".byte 0xc4,0xe2,0x7b,0x4b,0x34,0x16", // tileloadd tmm6, [rsi+rdx]
                ".byte 0xc4,0xe2,0x7b,0x4b,0x3c,0x16", // tileloadd tmm7, [rsi+rdx]
                "2:",
                ".byte 0xc4,0xe2,0x4a,0x5c,0xc4", // tdpbf16ps tmm0, tmm4, tmm6
                ".byte 0xc4,0xe2,0x42,0x5c,0xcc", // tdpbf16ps tmm1, tmm4, tmm7
                ".byte 0xc4,0xe2,0x4a,0x5c,0xd5", // tdpbf16ps tmm2, tmm5, tmm6
                ".byte 0xc4,0xe2,0x42,0x5c,0xdd", // tdpbf16ps tmm3, tmm5, tmm7
                "dec rcx",
                "jnz 2b",
                ".byte 0xc4,0xe2,0x78,0x49,0xc0", // tilerelease
                in("rdi") cfg.0.as_ptr(),
                in("rsi") data.0.as_ptr(),
                in("rdx") 0usize,
                inout("rcx") iters => _,
                options(nostack),
            );
        }
    }
}

fn no_setup() -> bool {
    true
}

#[cfg(target_arch = "x86_64")]
fn amx_setup() -> bool {
    x86::request_amx()
}

/// Measures every kernel the CPU has at the given thread counts and prints a line
/// for each one it lacks.
pub fn measure_all(threads: &[usize]) -> Vec<Measured> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            let k = Kernel {
                name: "AVX-512 f32 FMA (vfmadd231ps zmm)",
                flops_per_iter: 16.0 * 16.0 * 2.0,
                run: x86::fma512,
            };
            out.push(measure(&k, threads, no_setup));
        } else {
            println!("AVX-512 f32 FMA: the CPU has no AVX-512F");
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let k = Kernel {
                name: "AVX2 f32 FMA (vfmadd231ps ymm)",
                flops_per_iter: 12.0 * 8.0 * 2.0,
                run: x86::fma256,
            };
            out.push(measure(&k, threads, no_setup));
        } else {
            println!("AVX2 f32 FMA: the CPU has no AVX2/FMA");
        }
        if is_x86_feature_detected!("avx512bf16") {
            let k = Kernel {
                name: "AVX512_BF16 (vdpbf16ps zmm)",
                flops_per_iter: 16.0 * 16.0 * 2.0 * 2.0,
                run: x86::dpbf16,
            };
            out.push(measure(&k, threads, no_setup));
        } else {
            println!("AVX512_BF16 vdpbf16ps: the CPU has no AVX512_BF16");
        }
        if !x86::has_amx_bf16() {
            println!("AMX-BF16 tdpbf16ps: the CPU has no AMX (cpuid 7.0 EDX bits 22/24 clear)");
        } else if !x86::request_amx() {
            println!(
                "AMX-BF16 tdpbf16ps: the CPU has AMX but Linux refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
            );
        } else {
            let k = Kernel {
                name: "AMX-BF16 (tdpbf16ps)",
                flops_per_iter: 4.0 * 16.0 * 16.0 * 32.0 * 2.0,
                run: x86::amx_bf16,
            };
            out.push(measure(&k, threads, amx_setup));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("peak: only x86-64 kernels are written");
    out
}

/// The CPU's model name, family and model from /proc/cpuinfo (a VM may show only
/// the vendor's brand in the name).
fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    match (field("model name"), field("cpu family"), field("model")) {
        (Some(n), Some(f), Some(m)) => format!("{n} (family {f} model {m})"),
        (Some(n), _, _) => n,
        _ => "unknown CPU".into(),
    }
}

fn cache_path(root: &Path) -> std::path::PathBuf {
    root.join("target/peak.json")
}

/// The best f32 FMA rate (AVX-512 if the CPU has it, else AVX2) at each thread count
/// in `rows`.
fn f32_peak(rows: &[Measured]) -> Vec<(usize, f64)> {
    rows.iter()
        .filter(|m| m.name.contains("f32"))
        .flat_map(|m| m.rates.iter().map(|&(t, r, _)| (t, r)))
        .fold(Vec::<(usize, f64)>::new(), |mut acc, (t, r)| {
            match acc.iter_mut().find(|(u, _)| *u == t) {
                Some(e) => e.1 = e.1.max(r),
                None => acc.push((t, r)),
            }
            acc
        })
}

/// `cargo xtask peak`: measures, prints and caches.
pub fn run(root: &Path, threads: &[usize]) -> Result<()> {
    println!("CPU: {}", cpu_name());
    println!(
        "register-resident loops, best of {ROUNDS} rounds of about {SLICE} s, timed by each thread's CPU clock"
    );
    let rows = measure_all(threads);
    print!("{:<36}", "kernel");
    for t in threads {
        print!(" {:>12} {:>12}", format!("{t} thr GFLOP/s"), "(by wall)");
    }
    println!();
    for m in &rows {
        print!("{:<36}", m.name);
        for (_, cpu, wall) in &m.rates {
            print!(" {cpu:>12.1} {wall:>12.1}");
        }
        println!();
    }
    let f32 = f32_peak(&rows);
    let cache = json!({
        "cpu": cpu_name(),
        "method": "register-resident FMA loop, best of rounds by thread CPU time",
        "f32_gflops": f32.iter().map(|(t, r)| (t.to_string(), json!(r))).collect::<serde_json::Map<_, _>>(),
        "kernels": rows.iter().map(|m| json!({
            "name": m.name,
            "gflops": m.rates.iter().map(|(t, r, w)| json!({"threads": t, "cpu": r, "wall": w})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    let path = cache_path(root);
    std::fs::create_dir_all(path.parent().context("target")?)?;
    std::fs::write(&path, serde_json::to_string_pretty(&cache)?)?;
    println!("f32 peak cached in {}", path.display());
    Ok(())
}

/// The f32 peak in GFLOP/s at `threads` threads: from `target/peak.json` if it was
/// measured on this CPU at that thread count, else measured now (a few seconds) and
/// cached.
pub fn f32_gflops(root: &Path, threads: usize) -> Result<f64> {
    let cached = std::fs::read(cache_path(root))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter(|v| v["cpu"].as_str() == Some(cpu_name().as_str()))
        .and_then(|v| v["f32_gflops"][threads.to_string()].as_f64());
    if let Some(g) = cached {
        return Ok(g);
    }
    eprintln!("measuring the f32 peak (cargo xtask peak)");
    run(root, &[1, 2.max(threads)])?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(cache_path(root))?)?;
    v["f32_gflops"][threads.to_string()]
        .as_f64()
        .context("no f32 FMA kernel on this CPU")
}
