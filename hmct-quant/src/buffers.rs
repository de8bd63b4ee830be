//! Recycling of large f32 buffers between the nodes of a run.
//!
//! A probe re-runs the same nodes thousands of times; each node's output is a fresh
//! multi-megabyte allocation that the allocator hands back as new pages, so every run
//! paid for page faults and kernel zeroing before a kernel wrote a single value. The
//! executor gives the buffers of values it drops (when it holds the only reference) to
//! a per-thread pool, and kernels whose output is large take from it. A recycled
//! buffer holds stale values: a kernel takes one with [`take`] only when it writes
//! every element, or fills it with [`take_filled`], so results never depend on what
//! was recycled.

use std::any::{Any, TypeId};
use std::cell::RefCell;

use hmct_tensor::Tensor;

/// Buffers smaller than this (elements, 64 KiB of f32) come from the allocator, which
/// serves them cheaply from its own free lists. Larger ones do not stay there: glibc
/// maps blocks from 128 KiB on afresh or trims them back, so a ShuffleNet's 45,000-value
/// channel halves faulted in new pages on every run (its Slices 0.60 -> 0.13 ms per
/// run once pooled from 16,384 values rather than 65,536).
const MIN_LEN: usize = 1 << 14;
/// Most elements a thread's pool holds (256 MiB of f32, several times what the
/// DBNet head keeps alive at once); beyond it, buffers are freed. Pools live as long
/// as their threads (the session's worker threads, or the caller's for a one-thread
/// session).
const MAX_POOLED: usize = 1 << 26;

thread_local! {
    static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A recycled f32 buffer of exactly `n` elements (stale contents), if one of close
/// size is pooled on this thread.
fn take_f32(n: usize) -> Option<Vec<f32>> {
    if n < MIN_LEN {
        return None;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        // The smallest buffer that fits and wastes at most a quarter.
        let best = p
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len() >= n && v.len() - n <= n / 4)
            .min_by_key(|(_, v)| v.len())
            .map(|(i, _)| i)?;
        let mut v = p.swap_remove(best);
        v.truncate(n);
        Some(v)
    })
}

/// A buffer of `n` elements whose contents are unspecified (stale values of an
/// earlier run, or zeros). Only for kernels that overwrite every element.
pub(crate) fn take<T: Clone + Default + 'static>(n: usize) -> Vec<T> {
    if TypeId::of::<T>() == TypeId::of::<f32>()
        && let Some(v) = take_f32(n)
        && let Ok(v) = (Box::new(v) as Box<dyn Any>).downcast::<Vec<T>>()
    {
        return *v;
    }
    let mut v = vec![T::default(); n];
    poison(&mut v);
    v
}

/// In unit tests, fresh f32 buffers from [`take`] hold NaN rather than zeros, so a
/// kernel that leaves a value unwritten (a padding cell, say) fails its test instead
/// of passing on the allocator's zeros.
fn poison<T: 'static>(v: &mut Vec<T>) {
    #[cfg(test)]
    if let Some(f) = (v as &mut dyn Any).downcast_mut::<Vec<f32>>() {
        f.fill(f32::NAN);
    }
    #[cfg(not(test))]
    let _ = v;
}

/// A buffer of `n` elements all equal to `value`.
pub(crate) fn take_filled<T: Copy + Default + 'static>(n: usize, value: T) -> Vec<T> {
    let mut v = take::<T>(n);
    v.fill(value);
    v
}

/// Hands a buffer that is no longer needed to this thread's pool (f32 only; other
/// types are freed).
pub(crate) fn give_vec<T: 'static>(v: Vec<T>) {
    if let Ok(v) = (Box::new(v) as Box<dyn Any>).downcast::<Vec<f32>>() {
        give_f32(*v);
    }
}

fn give_f32(v: Vec<f32>) {
    if v.len() < MIN_LEN {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let held: usize = p.iter().map(Vec::len).sum();
        if held + v.len() <= MAX_POOLED {
            p.push(v);
        }
    });
}

/// Hands a tensor that is no longer needed to this thread's pool (f32 only).
pub(crate) fn give(t: Tensor) {
    if let Tensor::F32(a) = t
        && a.len() >= MIN_LEN
        && a.is_standard_layout()
    {
        let (v, offset) = a.into_raw_vec_and_offset();
        if offset.is_none_or(|o| o == 0) {
            give_f32(v);
        }
    }
}
