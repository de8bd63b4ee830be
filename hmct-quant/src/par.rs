//! Whether kernels may split their work across threads.
//!
//! A session of one thread runs on its caller's thread rather than handing every run
//! to a one-thread pool: on a VM, waking the pool's thread and then the waiting caller
//! costs up to a tenth of a millisecond per run, as much as a small model's whole run
//! (docs/performance.md, item 18). Kernels use rayon's parallel
//! iterators, which outside a pool would run on rayon's global pool, so every parallel
//! site asks [`enabled`] first and otherwise runs its tasks in order on the current
//! thread. Each task computes the same values whichever thread runs it and in whatever
//! order, so this never changes a result.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

thread_local! {
    static SEQUENTIAL: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread may hand work to rayon (false inside [`sequential`]).
#[inline]
pub(crate) fn enabled() -> bool {
    !SEQUENTIAL.with(Cell::get)
}

/// How many threads a parallel site here would run on: 1 inside [`sequential`],
/// otherwise the current rayon pool's size. Only for choosing how to split work whose
/// results do not depend on the split.
pub(crate) fn threads() -> usize {
    if enabled() {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// Units per chunk when `units` (panels of positions, row tiles, rows of Winograd
/// tiles) are split into chunks of at most `most`, as equal as whole units allow, for
/// `others` tasks per chunk (images, groups, blocks of columns). With more than one
/// thread, where the fewest chunks leave one thread more than 5% over an even share
/// of the tasks, the fewest chunks that give every thread as many tasks: a matrix
/// product of 17 row tiles ran as chunks of 16 and 1, and a 3x3 conv whose 7 rows of
/// tiles fit one chunk as one task, each about as long on two threads as on one.
/// Only for work whose results do not depend on the split.
pub(crate) fn even_chunk(units: usize, most: usize, others: usize) -> usize {
    let threads = threads();
    let fewest = units.div_ceil(most.max(1)).max(1);
    let tasks = |chunks: usize| others * units.div_ceil(units.div_ceil(chunks));
    let longest_share = |tasks: usize| tasks.div_ceil(threads) * threads;
    let chunks = if threads > 1 && longest_share(tasks(fewest)) * 20 > tasks(fewest) * 21 {
        (fewest..=units)
            .find(|&c| tasks(c).is_multiple_of(threads))
            .unwrap_or(fewest)
    } else {
        fewest
    };
    units.div_ceil(chunks).max(1)
}

/// Runs `f` in a new pool of `threads` threads: for tests that a kernel gives the
/// same bits at any thread count.
#[cfg(test)]
pub(crate) fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(f)
}

/// Whether `a` and `b` hold the same values bit for bit.
#[cfg(test)]
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())
}

/// Runs `f` on this thread with parallel sites switched off, and switches them back
/// to what they were afterwards (also when `f` panics).
pub(crate) fn sequential<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEQUENTIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SEQUENTIAL.with(|s| s.replace(true)));
    f()
}

/// Runs `f` on the current thread of a rayon pool while the pool's other threads
/// look for work without ever going to sleep, until `f` returns, each thread on a
/// CPU of its own (see [`Placement`]).
///
/// Between two parallel kernels a run does serial work (small element-wise nodes,
/// the executor's own), long enough for rayon's idle threads to go to sleep; waking a
/// sleeping thread for the next kernel costs a system call on each side and, on a VM,
/// the halted virtual CPU's wake-up. onnxruntime's pool spins the same way. At two
/// threads (`run --threads 2`, alternating rounds) MobileNetV3 went 5.05-5.33 ->
/// 4.72-4.96 ms per run and RegNet-Y 10.9-11.2 -> 9.3-9.9, with half the system time.
pub(crate) fn with_workers_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    let done = AtomicBool::new(false);
    let placement = Placement::new(rayon::current_num_threads());
    let _mine = placement.as_ref().map(|p| pin_to(p.run_cpu));
    rayon::scope(|scope| {
        for _ in 1..rayon::current_num_threads() {
            scope.spawn(|_| {
                // This thread may pick the job up itself while it waits inside `f`:
                // it must not spin there, or `f` would never return.
                let Some(index) = rayon::current_thread_index().filter(|&i| i != me) else {
                    return;
                };
                let _pinned = placement.as_ref().map(|p| {
                    // The pool's threads but `me`, in order, on the CPUs but the run's.
                    let nth = if index < me { index } else { index - 1 };
                    pin_to(p.others[nth % p.others.len()])
                });
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        // Set however `f` ends: the scope waits for the spinning threads, also when
        // `f` panics.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _done = Done(&done);
        let result = f();
        RUN_ENDED.store(micros_now(), Ordering::Relaxed);
        result
    })
}

/// When the last run of [`with_workers_awake`] ended, in µs after [`micros_now`]'s
/// start (0: none yet).
static RUN_ENDED: AtomicU64 = AtomicU64::new(0);

/// Microseconds since the first call, at least 1.
fn micros_now() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// Where the threads of a run go: the thread that runs it stays on the CPU it is on,
/// each spinning thread goes to another CPU the process may use, for the run only.
///
/// Some kernels put a thread that wakes on the CPU of the thread that woke it while
/// the other CPUs are idle, and pull it back there when it moves (the VMs this was
/// measured on have `kernel.sched_vcpu_pack`, which packs work onto few virtual
/// CPUs). A run's spinning thread then shares its CPU with the run's own thread in 4
/// ms slices: `cargo xtask bench-ort --threads 2`, whose single runs each follow 100
/// ms of idle, gave EfficientNet-B0 24.5 ms single against 7.2 warm with
/// `HMCT_PIN_THREADS=off`, 7.7 against 10.9 (a noisier minute) pinned for the run;
/// onnxruntime 7.0 and 6.9 single. One-thread runs, with nothing to wake, take the
/// same time after idle as back to back. Between runs every thread gets its own
/// affinity back, so nothing stays pinned while other work could use the CPUs.
/// `HMCT_PIN_THREADS=off` leaves placement to the kernel.
///
/// The packing starts once the CPUs were idle for 15 ms there (`tools/idle_wake.c`,
/// two threads meeting 100 times: after 5-10 ms of idle no meeting waits for a
/// slice; after 15 ms some runs do, after 100 ms every one, 15-24 ms against 4.6-8.8;
/// pinned, 4.7), and pinning costs a run about 10 µs of system calls (MTCNN R-Net at
/// two threads 0.087 -> 0.096 ms back to back, in a build that pinned every run), so
/// a run that starts within `WARM` of the last one is not pinned.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct Placement {
    run_cpu: usize,
    /// The CPUs this process may use, but `run_cpu`.
    others: Vec<usize>,
}

impl Placement {
    /// A placement for a pool of `threads` threads, if they can each have a CPU and
    /// the last run ended `WARM` ago or more.
    #[cfg(target_os = "linux")]
    fn new(threads: usize) -> Option<Placement> {
        /// Runs closer together than this find the threads awake where they were.
        const WARM: u64 = 5_000;
        static OFF: OnceLock<bool> = OnceLock::new();
        let ended = RUN_ENDED.load(Ordering::Relaxed);
        if ended != 0 && micros_now() - ended < WARM
            || *OFF.get_or_init(|| std::env::var("HMCT_PIN_THREADS").as_deref() == Ok("off"))
        {
            return None;
        }
        // SAFETY: sched_getcpu takes no arguments; a failure is a negative value.
        let run_cpu = usize::try_from(unsafe { libc::sched_getcpu() }).ok()?;
        let others: Vec<usize> = allowed_cpus()?
            .into_iter()
            .filter(|&c| c != run_cpu)
            .collect();
        (others.len() + 1 >= threads && !others.is_empty()).then_some(Placement { run_cpu, others })
    }

    #[cfg(not(target_os = "linux"))]
    fn new(_threads: usize) -> Option<Placement> {
        None
    }
}

/// A thread pinned for a run; dropping it gives the thread its affinity back.
struct Pinned {
    #[cfg(target_os = "linux")]
    old: libc::cpu_set_t,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `old` is the set sched_getaffinity returned for this thread.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &self.old);
        }
    }
}

/// Pins the calling thread to `cpu` until the guard is dropped.
#[cfg(target_os = "linux")]
fn pin_to(cpu: usize) -> Option<Pinned> {
    let old = affinity()?;
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it, and
    // sched_setaffinity reads it.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        (libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) == 0)
            .then_some(Pinned { old })
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to(_cpu: usize) -> Option<Pinned> {
    None
}

/// The CPUs the calling thread may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Option<Vec<usize>> {
    let set = affinity()?;
    // SAFETY: `c` is below the set's size.
    Some(
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect(),
    )
}

/// The calling thread's affinity.
#[cfg(target_os = "linux")]
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid set for sched_getaffinity to fill in.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn cpus() -> Vec<usize> {
        allowed_cpus().unwrap()
    }

    #[test]
    fn a_run_pins_its_threads_to_cpus_of_their_own_and_gives_their_affinity_back() {
        let allowed = cpus();
        if allowed.len() < 2 || std::env::var("HMCT_PIN_THREADS").as_deref() == Ok("off") {
            eprintln!("skipped: one CPU, or HMCT_PIN_THREADS=off");
            return;
        }
        // Where threads may not set their affinity, runs are not pinned either.
        if pin_to(allowed[0]).is_none() {
            eprintln!("skipped: this thread may not set its affinity");
            return;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let observe = || {
            pool.install(|| {
                let during = with_workers_awake(|| {
                    // The other thread spins until this returns, pinned once it has
                    // taken up its spinning; ask it where it is until then. (A thread
                    // that waits in rayon runs jobs of its own queue: give the other
                    // one time to take its spinning job before this one could.)
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    let me = rayon::current_thread_index().unwrap();
                    let start = std::time::Instant::now();
                    loop {
                        let theirs = pool.broadcast(|ctx| (ctx.index(), cpus()));
                        let pinned = theirs.iter().all(|(i, c)| *i == me || c.len() == 1);
                        if pinned || start.elapsed().as_secs() >= 1 {
                            break (me, cpus(), theirs);
                        }
                    }
                });
                (during, pool.broadcast(|_| cpus()))
            })
        };
        // Other tests' runs that end just before this one's start leave it unpinned
        // (runs close together are not pinned): try again after a pause.
        let (during, after) = (0..10)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                observe()
            })
            .find(|((_, mine, _), _)| mine.len() == 1)
            .unwrap_or_else(observe);
        let (me, mine, all) = during;
        assert_eq!(mine.len(), 1, "the run's thread is on one CPU: {mine:?}");
        let (_, other) = all.iter().find(|(i, _)| *i != me).unwrap();
        assert_eq!(
            other.len(),
            1,
            "the spinning thread is on one CPU: {other:?}"
        );
        assert_ne!(mine, *other, "the two threads share a CPU");
        for cpus in after {
            assert_eq!(cpus, allowed, "a thread kept its pin after the run");
        }
    }
}
