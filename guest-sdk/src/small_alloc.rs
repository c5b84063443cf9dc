//! The guests' allocator for small blocks: freed blocks are kept on a list
//! per power-of-two size class and handed out again, instead of going back
//! to `malloc`.
//!
//! A node call allocates a dozen small blocks and frees them all before it
//! returns (the strings the host lowers into the guest, the parsed JSON,
//! the plan's strings). With WASI libc's `dlmalloc` behind Rust's global
//! allocator, its bookkeeping was half of the guest's own instructions in
//! a chain step (counted with callgrind, docs/performance.md). Here a small
//! allocation pops a block off its class's list and a free pushes it back:
//! a handful of instructions each, once a class has blocks.
//!
//! Every block is a `malloc` block of its class's size, obtained the first
//! time its class runs dry. That matters: on `wasm32-wasip2` the component's
//! `cabi_realloc` (Rust's standard library's) allocates through this
//! allocator, and WASI libc, which receives the results of its own WASI
//! calls (a directory's entries, say) in blocks from `cabi_realloc`, gives
//! them back with `free`. A `malloc` block freed by `free` is simply gone
//! from this allocator's view; an allocator with slabs of its own would be
//! corrupted there (tried: docs/performance.md, "Tried and not kept").
//!
//! Blocks of up to 4 KiB aligned to at most 16 bytes (what `malloc`
//! guarantees) come from the lists; larger or more aligned ones go to the
//! system allocator. A kept block is never given back to `malloc`: a
//! guest's memory holds at most its peak use of each class, and an
//! instance lives for one tick of one run.
//!
//! [`SmallAlloc`] is registered as the global allocator of components built
//! for `wasm32` without threads (the SDK's `small-alloc` feature, on by
//! default; a guest with an allocator of its own turns it off). It is not
//! thread-safe: WebAssembly components run one thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// The smallest class's block (a free block holds the next one's address).
const MIN_SHIFT: u32 = 4;
/// The classes: 16, 32, ... 4096 bytes.
const CLASSES: usize = 9;
/// The largest block served here.
const MAX_SMALL: usize = 1 << (MIN_SHIFT as usize + CLASSES - 1);
/// The alignment of every `malloc` block.
const MALLOC_ALIGN: usize = 16;

/// A size-class allocator for small blocks ([module docs](self)).
pub struct SmallAlloc {
    /// Each class's first kept block (each holds the next one's address),
    /// or null.
    free: UnsafeCell<[*mut u8; CLASSES]>,
}

// SAFETY: registered as the global allocator only where there is one
// thread (wasm32 without the atomics feature); elsewhere, tests use one
// value from one thread.
unsafe impl Sync for SmallAlloc {}

impl SmallAlloc {
    /// An allocator with no blocks kept yet.
    pub const fn new() -> Self {
        SmallAlloc {
            free: UnsafeCell::new([ptr::null_mut(); CLASSES]),
        }
    }
}

impl Default for SmallAlloc {
    fn default() -> Self {
        Self::new()
    }
}

/// The class of `layout`'s block, or `None` for the system allocator.
#[inline]
fn class_of(layout: &Layout) -> Option<usize> {
    let size = layout.size();
    if size > MAX_SMALL || layout.align() > MALLOC_ALIGN {
        return None;
    }
    let size = size.max(1 << MIN_SHIFT).next_power_of_two();
    Some((size.trailing_zeros() - MIN_SHIFT) as usize)
}

unsafe impl GlobalAlloc for SmallAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class_of(&layout) else {
            // SAFETY: the caller's layout, passed on.
            return unsafe { System.alloc(layout) };
        };
        // SAFETY: one thread (see `Sync`), and no other reference to the
        // lists lives across this call.
        let free = unsafe { &mut (*self.free.get())[c] };
        let block = *free;
        if block.is_null() {
            // SAFETY: a class's size is a non-zero power of two of at
            // least the alignment `malloc` gives (16), which `class_of`
            // checked the layout needs no more than.
            return unsafe {
                System.alloc(Layout::from_size_align_unchecked(
                    1 << (c as u32 + MIN_SHIFT),
                    MALLOC_ALIGN,
                ))
            };
        }
        // SAFETY: a kept block holds the next one's address in its first
        // bytes (written by `dealloc`), and is aligned for a pointer.
        *free = unsafe { block.cast::<*mut u8>().read() };
        block
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class_of(&layout) else {
            // SAFETY: a block the system allocator gave for this layout.
            return unsafe { System.dealloc(ptr, layout) };
        };
        // SAFETY: as in `alloc`; `ptr` is a block of this class (the same
        // layout chose it), now free, with room for a pointer.
        unsafe {
            let free = &mut (*self.free.get())[c];
            ptr.cast::<*mut u8>().write(*free);
            *free = ptr;
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid size for this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(&layout), class_of(&new_layout)) {
            // The block already has room.
            (Some(a), Some(b)) if a == b => ptr,
            // SAFETY: a system block, resized by the system.
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            _ => {
                // SAFETY: a fresh block for the new layout, the old
                // contents copied (the smaller of the two sizes), then the
                // old block freed with its own layout.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_the_smallest_class_that_holds_them() {
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        assert_eq!(class_of(&l(1, 1)), Some(0));
        assert_eq!(class_of(&l(16, 8)), Some(0));
        assert_eq!(class_of(&l(17, 1)), Some(1));
        assert_eq!(class_of(&l(3, 16)), Some(0));
        assert_eq!(class_of(&l(3, 64)), None);
        assert_eq!(class_of(&l(4096, 1)), Some(8));
        assert_eq!(class_of(&l(4097, 1)), None);
        assert_eq!(class_of(&l(8, 8192)), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused_after_a_free() {
        let a = SmallAlloc::new();
        let mut live = Vec::new();
        unsafe {
            for (i, (size, align)) in [
                (1, 1),
                (24, 8),
                (100, 16),
                (700, 64),
                (4096, 4096),
                (5000, 8),
            ]
            .into_iter()
            .cycle()
            .take(600)
            .enumerate()
            {
                let layout = Layout::from_size_align(size, align).unwrap();
                let p = a.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "{size} {align}");
                ptr::write_bytes(p, i as u8, size);
                live.push((p, layout, i as u8));
            }
            // Every block still holds what was written to it: none overlap.
            for (p, layout, byte) in &live {
                let bytes = std::slice::from_raw_parts(*p, layout.size());
                assert!(bytes.iter().all(|b| b == byte));
            }
            let (p, layout, _) = live.swap_remove(1);
            a.dealloc(p, layout);
            assert_eq!(a.alloc(layout), p, "the freed block is the next one");
            for (p, layout, _) in live {
                a.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn a_block_may_be_freed_by_the_system_allocator() {
        // What WASI libc does with a block `cabi_realloc` gave it: `free`.
        let a = SmallAlloc::new();
        unsafe {
            let layout = Layout::from_size_align(10, 1).unwrap();
            let kept = a.alloc(layout);
            a.dealloc(kept, layout);
            // Handed out again, then freed by the system, not here.
            let p = a.alloc(layout);
            assert_eq!(p, kept);
            System.dealloc(p, Layout::from_size_align(16, MALLOC_ALIGN).unwrap());
            // Nothing kept: the next block is a new one from the system.
            let q = a.alloc(layout);
            assert!(!q.is_null());
            a.dealloc(q, layout);
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_classes_and_the_system() {
        let a = SmallAlloc::new();
        unsafe {
            let layout = Layout::from_size_align(10, 1).unwrap();
            let mut p = a.alloc(layout);
            ptr::copy_nonoverlapping(b"0123456789".as_ptr(), p, 10);
            let mut size = 10;
            for new in [12, 16, 40, 4096, 10_000, 20_000, 300, 5] {
                p = a.realloc(p, Layout::from_size_align(size, 1).unwrap(), new);
                assert!(!p.is_null());
                let kept = std::slice::from_raw_parts(p, size.min(new).min(10));
                assert_eq!(kept, &b"0123456789"[..kept.len()]);
                size = new;
            }
            a.dealloc(p, Layout::from_size_align(size, 1).unwrap());
        }
    }
}
