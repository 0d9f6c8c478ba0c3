//! The binary's global allocator: mimalloc, entered by its plain (unaligned) functions when the layout allows.
//!
//! The `mimalloc` crate passes every allocation to `mi_malloc_aligned`, whose check for a suitably aligned free
//! block costs about three times `mi_malloc`'s fast path. Like Rust's `System` allocator, this calls the plain
//! function when the alignment is one `mi_malloc` guarantees anyway: at most 16 bytes (`MI_MAX_ALIGN_SIZE`) and
//! at most the size (mimalloc's blocks of `n` bytes are aligned to `n` below 16).

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Alignment every `mi_malloc` block of at least this size has.
const PLAIN_ALIGN: usize = 16;

pub struct MiMalloc;

#[inline]
fn plain(layout: &Layout) -> bool {
    layout.align() <= PLAIN_ALIGN && layout.align() <= layout.size()
}

// SAFETY: each function forwards to mimalloc, whose blocks satisfy the layout (see `plain`); blocks from either
// entry point are freed by `mi_free`.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            unsafe { mi::mi_malloc(layout.size()) as *mut u8 }
        } else {
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            unsafe { mi::mi_zalloc(layout.size()) as *mut u8 }
        } else {
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN && layout.align() <= new_size {
            unsafe { mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8 }
        } else {
            unsafe {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_alignment_their_layout_asks() {
        let a = MiMalloc;
        for size in [
            1usize,
            2,
            3,
            4,
            7,
            8,
            12,
            16,
            24,
            33,
            100,
            1000,
            5000,
            70_000,
            1 << 21,
        ] {
            for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                unsafe {
                    for zeroed in [false, true] {
                        let p = if zeroed {
                            a.alloc_zeroed(layout)
                        } else {
                            a.alloc(layout)
                        };
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        if zeroed {
                            assert!(std::slice::from_raw_parts(p, size).iter().all(|b| *b == 0));
                        }
                        p.write_bytes(0xa5, size);
                        let grown = a.realloc(p, layout, size * 3);
                        assert!(!grown.is_null());
                        assert_eq!(
                            grown as usize % align,
                            0,
                            "realloc size {size} align {align}"
                        );
                        assert_eq!(*grown.add(size - 1), 0xa5);
                        a.dealloc(grown, Layout::from_size_align_unchecked(size * 3, align));
                    }
                }
            }
        }
    }
}
