//! The C allocator's entry points (malloc, free, calloc, realloc, the aligned ones), put in
//! front of the C library's so that the pager's threads never allocate from the program's
//! heap: Rust's standard library allocates some things with the C allocator (a thread's
//! handle, for one), and the C library allocates for a thread it starts (its TLS vector). A
//! page of the program's heap may be out, or being evicted, and the pager's thread that
//! touched it could be the one that has to bring it back.
//!
//! Invariants: a call from one of the program's threads goes to the allocator the program
//! would have used without the pager — the next definition after this library (jemalloc for
//! a program linked with it, else the C library's) — and nothing else; a call from a pager
//! thread is served from the pager's heap (`alloc.rs`), with a 16-byte header before the
//! block holding its layout; `free` and `realloc` decide by the address, not by the calling
//! thread, so a block can be freed by any thread. While the next definitions are being
//! looked up (dlsym allocates), allocations come from a small static buffer and are never
//! freed.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void, size_t};

use crate::hooks::is_pager_thread;

type MallocFn = unsafe extern "C" fn(size_t) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;

/// The next definitions of malloc, free, calloc, realloc, memalign (0: not looked up).
static NEXT: [AtomicUsize; 5] = [const { AtomicUsize::new(0) }; 5];
const NAMES: [&std::ffi::CStr; 5] = [c"malloc", c"free", c"calloc", c"realloc", c"memalign"];

thread_local! {
    /// This thread is looking the next definitions up.
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// Memory for the allocations made while looking up.
struct Boot(UnsafeCell<[u8; BOOT_SIZE]>);
// SAFETY: disjoint ranges of the buffer are handed out by an atomic bump pointer.
unsafe impl Sync for Boot {}
const BOOT_SIZE: usize = 256 << 10;
static BOOT: Boot = Boot(UnsafeCell::new([0; BOOT_SIZE]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

fn boot_alloc(size: usize) -> *mut c_void {
    let size = size.next_multiple_of(16);
    let at = BOOT_USED.fetch_add(size, Ordering::Relaxed);
    if at + size > BOOT_SIZE {
        return std::ptr::null_mut();
    }
    // SAFETY: [at, at + size) is inside the buffer and handed out once.
    unsafe { BOOT.0.get().cast::<u8>().add(at).cast() }
}

fn is_boot(p: *const c_void) -> bool {
    (p as usize).wrapping_sub(BOOT.0.get() as usize) < BOOT_SIZE
}

/// The next definition after this library of the function `name`, looked up once and kept
/// in `cache`; 0 if there is none, or while this thread is looking one up (dlsym allocates,
/// and the allocation must not look up again).
pub(crate) fn next_symbol(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = cache.load(Ordering::Acquire);
    if f != 0 || RESOLVING.with(|r| r.get()) {
        return f;
    }
    RESOLVING.with(|r| r.set(true));
    // SAFETY: dlsym with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    RESOLVING.with(|r| r.set(false));
    cache.store(p, Ordering::Release);
    p
}

/// The next definition of function `i` of NAMES (0 while it is being looked up).
fn next(i: usize) -> usize {
    next_symbol(&NEXT[i], NAMES[i])
}

/// # Safety
/// `f` must be 0 or the address of a function of type `T` (a function pointer type).
unsafe fn as_fn<T: Copy>(f: usize) -> Option<T> {
    // SAFETY: the caller's contract; a function pointer has the size of usize.
    (f != 0).then(|| unsafe { std::mem::transmute_copy::<usize, T>(&f) })
}

/// Bytes before each block: its total size and alignment (the offset of the block).
const HEADER: usize = 16;

fn heap() -> &'static crate::alloc::PagerAlloc {
    &crate::HEAP
}

/// A block of `size` bytes aligned to `align` (a power of two) from the pager's heap.
fn own_alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    let align = align.max(HEADER);
    let Some(total) = size.checked_add(align) else {
        return std::ptr::null_mut();
    };
    let Ok(layout) = Layout::from_size_align(total, align) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the layout has a non-zero size.
    let base = unsafe {
        if zero {
            heap().alloc_zeroed(layout)
        } else {
            heap().alloc(layout)
        }
    };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `align` ≥ 16 bytes of the block precede the returned pointer; the header
    // takes the last 16 of them, aligned to 8.
    unsafe {
        let p = base.add(align);
        p.cast::<usize>().sub(2).write(total);
        p.cast::<usize>().sub(1).write(align);
        p.cast()
    }
}

/// The layout and base of a block of the pager's heap.
///
/// # Safety
/// `p` must come from `own_alloc` and not be freed.
unsafe fn own_layout(p: *mut c_void) -> (*mut u8, Layout, usize) {
    // SAFETY: the header written by `own_alloc` precedes `p`.
    unsafe {
        let total = p.cast::<usize>().sub(2).read();
        let align = p.cast::<usize>().sub(1).read();
        (
            p.cast::<u8>().sub(align),
            Layout::from_size_align_unchecked(total, align),
            total - align,
        )
    }
}

/// # Safety
/// As the C library's `malloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if is_pager_thread() {
        return own_alloc(size.max(1), 16, false);
    }
    // SAFETY: NEXT[0] is the next malloc.
    match unsafe { as_fn::<MallocFn>(next(0)) } {
        // SAFETY: the program's malloc, with its argument.
        Some(f) => unsafe { f(size) },
        None => boot_alloc(size),
    }
}

/// # Safety
/// As the C library's `calloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    if is_pager_thread() {
        return match n.checked_mul(size) {
            Some(b) => own_alloc(b.max(1), 16, true),
            None => std::ptr::null_mut(),
        };
    }
    // SAFETY: NEXT[2] is the next calloc.
    match unsafe { as_fn::<CallocFn>(next(2)) } {
        // SAFETY: the program's calloc, with its arguments.
        Some(f) => unsafe { f(n, size) },
        // The buffer is zeroed and never reused.
        None => n.checked_mul(size).map_or(std::ptr::null_mut(), boot_alloc),
    }
}

/// # Safety
/// As the C library's `free`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || is_boot(p) {
        return;
    }
    if crate::alloc::owns(p.cast()) {
        // SAFETY: a block of the pager's heap, freed once (free's contract).
        unsafe {
            let (base, layout, _) = own_layout(p);
            heap().dealloc(base, layout);
        }
        return;
    }
    // SAFETY: NEXT[1] is the next free, and `p` a block of the program's allocator.
    if let Some(f) = unsafe { as_fn::<FreeFn>(next(1)) } {
        // SAFETY: as above.
        unsafe { f(p) }
    }
}

/// # Safety
/// As the C library's `realloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    if crate::alloc::owns(p.cast()) {
        let new = own_alloc(size.max(1), 16, false);
        if !new.is_null() {
            // SAFETY: both blocks are live and distinct; at most the old block's size is
            // copied; the old block is then freed once.
            unsafe {
                let (_, _, old) = own_layout(p);
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast::<u8>(), old.min(size));
                free(p);
            }
        }
        return new;
    }
    if is_boot(p) {
        // Its size is unknown: copy what the buffer holds after it, at most `size`.
        let room = BOOT_SIZE - (p as usize - BOOT.0.get() as usize);
        // SAFETY: as malloc.
        let new = unsafe { malloc(size) };
        if !new.is_null() {
            // SAFETY: both ranges are readable/writable for the length copied.
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast::<u8>(), room.min(size))
            };
        }
        return new;
    }
    // SAFETY: NEXT[3] is the next realloc, and `p` a block of the program's allocator.
    match unsafe { as_fn::<ReallocFn>(next(3)) } {
        // SAFETY: as above.
        Some(f) => unsafe { f(p, size) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// As the C library's `memalign`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if is_pager_thread() {
        if !align.is_power_of_two() {
            return std::ptr::null_mut();
        }
        return own_alloc(size.max(1), align, false);
    }
    // SAFETY: NEXT[4] is the next memalign.
    match unsafe { as_fn::<MemalignFn>(next(4)) } {
        // SAFETY: the program's memalign, with its arguments.
        Some(f) => unsafe { f(align, size) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// As the C library's `aligned_alloc`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: as memalign.
    unsafe { memalign(align, size) }
}

/// # Safety
/// As the C library's `posix_memalign`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    // SAFETY: as memalign; `out` is writable (posix_memalign's contract).
    unsafe {
        let p = memalign(align, size);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
    }
    0
}
