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
