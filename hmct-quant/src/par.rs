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
use std::sync::atomic::{AtomicBool, Ordering};

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
/// look for work without ever going to sleep, until `f` returns.
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
    rayon::scope(|scope| {
        for _ in 1..rayon::current_num_threads() {
            scope.spawn(|_| {
                // This thread may pick the job up itself while it waits inside `f`:
                // it must not spin there, or `f` would never return.
                if rayon::current_thread_index() == Some(me) {
                    return;
                }
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
        f()
    })
}
