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

/// A recycled buffer serves a value of `1 / MAX_WASTE` its length at least, so a
/// small value does not hold a buffer that a large one needs next.
const MAX_WASTE: usize = 8;
/// Buffers lent out shorter than they are, remembered at most.
const MAX_LENT: usize = 256;

thread_local! {
    /// Pooled buffers, in the order they were given back.
    static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    static LENT: RefCell<Vec<Lent>> = const { RefCell::new(Vec::new()) };
}

/// A pooled buffer lent out truncated: given back with the same address, capacity
/// and length, it is pooled at its full length again.
struct Lent {
    ptr: usize,
    capacity: usize,
    len: usize,
    full: usize,
}

/// A recycled f32 buffer of exactly `n` elements (stale contents), if one that holds
/// them is pooled on this thread: the one given back last, whose values are the
/// likeliest still in cache. Taking the best fit instead (the smallest, wasting at
/// most a quarter) kept each value in its own buffer, so a run wrote far more memory
/// than the caches hold: MobileNetV2/V3 and EfficientNet-B0 0.935-0.945 of the time
/// per run once values reuse what was freed last (`tools/ab_models.sh 3`, 11f882e
/// against its parent, both with `CacheLineAlloc`), as onnxruntime's memory planner
/// has them do.
fn take_f32(n: usize) -> Option<Vec<f32>> {
    if n < MIN_LEN {
        return None;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let last = p
            .iter()
            .rposition(|v| v.len() >= n && v.len() <= n * MAX_WASTE)?;
        let mut v = p.remove(last);
        if v.len() > n {
            LENT.with(|l| {
                let mut l = l.borrow_mut();
                if l.len() >= MAX_LENT {
                    l.remove(0);
                }
                l.push(Lent {
                    ptr: v.as_ptr() as usize,
                    capacity: v.capacity(),
                    len: n,
                    full: v.len(),
                });
            });
            // Truncation keeps the values past `n`: `give_f32` takes them back.
            v.truncate(n);
        }
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

fn give_f32(mut v: Vec<f32>) {
    if v.len() < MIN_LEN {
        return;
    }
    let key = (v.as_ptr() as usize, v.capacity(), v.len());
    let full = LENT.with(|l| {
        let mut l = l.borrow_mut();
        let i = l.iter().position(|b| (b.ptr, b.capacity, b.len) == key)?;
        Some(l.remove(i).full)
    });
    if let Some(full) = full
        && full <= v.capacity()
    {
        // SAFETY: this is the buffer `take_f32` lent out truncated (same address,
        // capacity and length: nothing reallocated it), whose values up to `full`
        // were initialized then; truncation leaves them as they were. (A vector that
        // is not it would need a freed lent buffer's exact address, capacity and
        // length and a tail it never wrote; pooled values are only read after `take`'s
        // callers write them.)
        unsafe { v.set_len(full) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_take_the_buffer_given_back_last_and_it_comes_back_whole() {
        let n = MIN_LEN * 4;
        let (big, small) = (vec![1.0f32; n], vec![2.0f32; n / 2]);
        let big_at = big.as_ptr();
        give_f32(small);
        give_f32(big);
        // The last one given back, though the other fits better.
        let lent = take_f32(n / 2).unwrap();
        assert_eq!((lent.as_ptr(), lent.len()), (big_at, n / 2));
        // Back whole, with its values: it serves `n` again.
        give_f32(lent);
        let again = take_f32(n).unwrap();
        assert_eq!((again.as_ptr(), again.len()), (big_at, n));
        assert!(again.iter().all(|&v| v == 1.0));
        // Too large a buffer for a small value is left for larger ones.
        give_f32(again);
        let other = take_f32(n / MAX_WASTE - 1);
        assert!(other.is_none_or(|v| v.as_ptr() != big_at));
        POOL.with(|p| p.borrow_mut().clear());
    }
}
