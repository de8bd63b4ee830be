//! An allocator that starts every large block on a cache line.
//!
//! Channel-blocked values (see [`crate::ops::blocked`]) are read and written one
//! 64-byte vector of sixteen channels at a time. glibc's `malloc` returns large blocks
//! 16 bytes into a page, so each such vector straddled two cache lines and every load
//! and store touched both. Binaries that run models set this as their global
//! allocator; results never depend on it, only speed.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes start on a cache line.
const LARGE: usize = 4096;
/// A cache line.
const LINE: usize = 64;
/// Room for the system block's address, stored just before the aligned block.
const HEADER: usize = size_of::<usize>();

/// The system allocator, with blocks of 4 KiB and more aligned to 64 bytes.
pub struct CacheLineAlloc;

/// The system block that holds an aligned block of `layout`, if `layout` is one
/// this allocator aligns.
fn outer(layout: Layout) -> Option<Layout> {
    if layout.size() < LARGE || layout.align() >= LINE {
        return None;
    }
    Layout::from_size_align(layout.size() + LINE, layout.align().max(HEADER)).ok()
}

/// The aligned block inside system block `raw` (null stays null), with `raw`
/// recorded before it.
///
/// # Safety
/// `raw` is null or a block of `outer(..)`'s size, at least `HEADER`-aligned.
unsafe fn inner(raw: *mut u8) -> *mut u8 {
    if raw.is_null() {
        return raw;
    }
    // `raw + HEADER` rounded up to a line: at most `raw + LINE`, so the block's
    // `size` bytes and the header before it lie inside the `size + LINE` bytes.
    let offset = (raw as usize + HEADER).next_multiple_of(LINE) - raw as usize;
    // SAFETY: `offset <= LINE` and `offset >= HEADER`, inside the system block, and
    // `raw + offset - HEADER` is `HEADER`-aligned (both terms are).
    unsafe {
        let block = raw.add(offset);
        block.cast::<usize>().sub(1).write(raw as usize);
        block
    }
}

// SAFETY: every block comes from `System` and goes back to it with the layout it was
// allocated with: aligned blocks record their system block, which `dealloc` frees
// with `outer(layout)`, the same layout `alloc` used.
unsafe impl GlobalAlloc for CacheLineAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `GlobalAlloc::alloc`'s caller vouches; `inner` takes a block of
        // `outer`'s layout.
        unsafe {
            match outer(layout) {
                Some(o) => inner(System.alloc(o)),
                None => System.alloc(layout),
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`; zeroed system blocks keep `calloc`'s fresh pages.
        unsafe {
            match outer(layout) {
                Some(o) => inner(System.alloc_zeroed(o)),
                None => System.alloc_zeroed(layout),
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `layout` (the caller vouches), so an
        // aligned block has its system block's address just before it.
        unsafe {
            match outer(layout) {
                Some(o) => System.dealloc(ptr.cast::<usize>().sub(1).read() as *mut u8, o),
                None => System.dealloc(ptr, layout),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `GlobalAlloc::realloc`'s caller vouches: `new_size` with
        // `layout.align()` is a valid layout, `ptr` a block of `layout`.
        unsafe {
            let new = Layout::from_size_align_unchecked(new_size, layout.align());
            if outer(layout).is_none() && outer(new).is_none() {
                return System.realloc(ptr, layout, new_size);
            }
            let moved = self.alloc(new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_start_on_lines_and_keep_their_contents() {
        let a = CacheLineAlloc;
        for (size, align) in [(4096, 4), (1 << 20, 16), (100, 4), (8192, 128)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero layout; every block is freed with its layout.
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                if size >= LARGE {
                    assert_eq!(p as usize % LINE, 0, "{size} bytes");
                }
                p.write_bytes(7, size);
                // Grows across the threshold and back.
                let q = a.realloc(p, layout, size * 3);
                assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 7));
                let grown = Layout::from_size_align(size * 3, align).unwrap();
                let r = a.realloc(q, grown, 50);
                assert!(std::slice::from_raw_parts(r, 50).iter().all(|&b| b == 7));
                a.dealloc(r, Layout::from_size_align(50, align).unwrap());
                let z = a.alloc_zeroed(layout);
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                a.dealloc(z, layout);
            }
        }
    }
}
