//! The C functions the preloaded library puts in front of the C library's: `pthread_create`
//! (a thread the pager starts gets a stack of the pager's own, recorded in `exclude` before
//! the thread exists, so its stack is never paged out) and `madvise` (a discard by the
//! program forgets the pages it had out, so they read as zeros as the kernel promises),
//! `munlock` and `munlockall` (pages the evictor found locked may be paged again).
//! munmap and mremap need no hook: the kernel reports them to the pager (userfaultfd
//! events), including those the C library makes internally, which no hook would see.
//!
//! Invariants: with no pager running (not started, or in a forked child, which the pager
//! does not follow) these functions do exactly what the C library's do; neither allocates
//! from the program's allocator.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void, pthread_attr_t, pthread_t, size_t};

thread_local! {
    /// This thread belongs to the pager (its threads, and the main thread while it starts
    /// the pager).
    static PAGER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the pager's (or no longer).
pub fn set_pager_thread(on: bool) {
    PAGER_THREAD.with(|c| c.set(on));
}

/// Whether the calling thread is the pager's.
pub fn is_pager_thread() -> bool {
    PAGER_THREAD.with(|c| c.get())
}

extern "C" {
    // Not in the libc crate.
    fn pthread_attr_getdetachstate(attr: *const pthread_attr_t, state: *mut c_int) -> c_int;
}

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type CreateFn =
    unsafe extern "C" fn(*mut pthread_t, *const pthread_attr_t, StartFn, *mut c_void) -> c_int;

static REAL_CREATE: AtomicUsize = AtomicUsize::new(0);

fn real_create() -> Option<CreateFn> {
    let f = crate::malloc::next_symbol(&REAL_CREATE, c"pthread_create");
    if f == 0 {
        return None;
    }
    // SAFETY: the C library's pthread_create has exactly this signature.
    Some(unsafe { std::mem::transmute::<usize, CreateFn>(f) })
}

struct Start {
    f: StartFn,
    arg: *mut c_void,
}

/// Pager threads created through [`pthread_create`], and those of them that have started:
/// run past the C library's start of a thread, into the pager's code.
static CREATED: AtomicUsize = AtomicUsize::new(0);
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// Waits until every pager thread created so far has started, saying so every 10 s while
/// one has not (a stopped or frozen process). The C library's start of a thread reads the
/// program's locale data, which lies in the program's brk heap, which the pager pages: a
/// pager thread that first runs after that page went out faults on it, and the fault thread
/// — if it is that thread, or needs it — cannot answer (a python program hung so at start:
/// its fault thread, made before anything was registered, had not run yet when the page
/// went out). The pager drops no page before the threads made while it connects have
/// started (`start.rs`; the fault thread itself: `Pager::fault_loop`).
pub fn wait_pager_threads_started() {
    wait_started("a thread of the pager", || {
        STARTED.load(Ordering::Acquire) >= CREATED.load(Ordering::Acquire)
    });
}

/// Waits, yielding, until `started()`, saying every 10 s that `what` has not started yet (a
/// stopped or frozen process): no limit, since giving up would let the pager page with a
/// thread of its own not yet running.
pub fn wait_started(what: &str, started: impl Fn() -> bool) {
    let mut said = std::time::Instant::now();
    while !started() {
        if said.elapsed() >= std::time::Duration::from_secs(10) {
            tracing::warn!("{what} has not started in 10 s; waiting for it");
            said = std::time::Instant::now();
        }
        std::thread::yield_now();
    }
}

extern "C" fn pager_thread_start(p: *mut c_void) -> *mut c_void {
    STARTED.fetch_add(1, Ordering::AcqRel);
    set_pager_thread(true);
    // SAFETY: `p` is the Box made by `pthread_create` below, handed over exactly once.
    let s = unsafe { Box::from_raw(p.cast::<Start>()) };
    (s.f)(s.arg)
}

/// Default stack of a pager thread when the caller gives none.
const DEFAULT_STACK: usize = 2 << 20;

/// A stack for a pager thread: a fresh mapping with a guard page below, recorded as the
/// pager's own. Returns (stack base above the guard, size).
fn pager_stack(size: usize) -> Option<(*mut c_void, usize)> {
    let size = size.max(256 << 10).next_multiple_of(crate::PAGE);
    let total = size + crate::PAGE;
    // SAFETY: a fresh private anonymous mapping.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the first page of our own fresh mapping becomes the guard.
    unsafe { libc::mprotect(base, crate::PAGE, libc::PROT_NONE) };
    if !crate::exclude::add(base as usize, base as usize + total) {
        // SAFETY: our own mapping, unused.
        unsafe { libc::munmap(base, total) };
        return None;
    }
    // SAFETY: within the mapping.
    Some((unsafe { base.cast::<u8>().add(crate::PAGE) }.cast(), size))
}

/// `pthread_create`, as the C library's, except that a thread the pager starts gets a stack
/// the pager never pages out.
///
/// # Safety
/// As the C library's `pthread_create`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pthread_create(
    thread: *mut pthread_t,
    attr: *const pthread_attr_t,
    start: StartFn,
    arg: *mut c_void,
) -> c_int {
    let Some(real) = real_create() else {
        return libc::EAGAIN;
    };
    if !is_pager_thread() || crate::disabled() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(thread, attr, start, arg) };
    }
    // SAFETY: pthread_attr_t is plain data that pthread_attr_init fills in.
    let mut own: pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `own` is ours to initialise.
    unsafe { libc::pthread_attr_init(&mut own) };
    let mut size: size_t = DEFAULT_STACK;
    if !attr.is_null() {
        let mut detach: c_int = 0;
        // SAFETY: the caller's attributes are initialised (pthread_create's contract).
        unsafe {
            libc::pthread_attr_getstacksize(attr, &mut size);
            pthread_attr_getdetachstate(attr, &mut detach);
            libc::pthread_attr_setdetachstate(&mut own, detach);
        }
    }
    let Some((stack, size)) = pager_stack(size) else {
        // SAFETY: `own` was initialised above.
        unsafe { libc::pthread_attr_destroy(&mut own) };
        return libc::EAGAIN;
    };
    // SAFETY: `stack` is a mapping of `size` bytes that stays for the life of the process
    // (a pager thread's stack is not reused or unmapped).
    unsafe { libc::pthread_attr_setstack(&mut own, stack, size) };
    let boxed = Box::into_raw(Box::new(Start { f: start, arg })).cast::<c_void>();
    // Counted before it can start, so that the count of started ones never runs ahead.
    CREATED.fetch_add(1, Ordering::AcqRel);
    // SAFETY: `own` is initialised; `boxed` is handed to the new thread, or taken back below.
    let r = unsafe { real(thread, &own, pager_thread_start, boxed) };
    // SAFETY: `own` was initialised above and is not used again.
    unsafe { libc::pthread_attr_destroy(&mut own) };
    if r != 0 {
        CREATED.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the thread was not created, so the box is still ours.
        drop(unsafe { Box::from_raw(boxed.cast::<Start>()) });
    }
    r
}

/// Advice after which the kernel reads the pages as zeros (or may).
fn discards(advice: c_int) -> bool {
    matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE
    ) || advice == 24 // MADV_DONTNEED_LOCKED
}

fn raw_madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // SAFETY: the system call itself, with the caller's arguments; it checks them.
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
    r as c_int
}

/// `madvise`, as the C library's; a discard of the program's pages also forgets those the
/// pager had out.
///
/// # Safety
/// As the C library's `madvise`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if discards(advice) && !is_pager_thread() {
        if let Some(p) = crate::running() {
            return p.discard(addr as usize, len, || raw_madvise(addr, len, advice));
        }
    }
    raw_madvise(addr, len, advice)
}

/// `munlock`, as the C library's; the pages it unlocks may be paged again (the evictor keeps
/// a page the kernel refused to drop because it was locked: `Table::undo_drop`).
///
/// # Safety
/// As the C library's `munlock`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    // SAFETY: the system call itself, with the caller's arguments; it checks them.
    let r = unsafe { libc::syscall(libc::SYS_munlock, addr, len) } as c_int;
    // ENOMEM: a hole in the range, whose mapped parts are unlocked all the same.
    let err = std::io::Error::last_os_error();
    if (r == 0 || err.raw_os_error() == Some(libc::ENOMEM)) && !is_pager_thread() {
        if let Some(p) = crate::running() {
            p.unlocked(addr as usize, len);
        }
        if r != 0 {
            // SAFETY: errno is this thread's; the caller reads the system call's.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
        }
    }
    r
}

/// `munlockall`, as the C library's; every page may be paged again.
///
/// # Safety
/// As the C library's `munlockall`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn munlockall() -> c_int {
    // SAFETY: the system call itself; it takes no argument.
    let r = unsafe { libc::syscall(libc::SYS_munlockall) } as c_int;
    if r == 0 && !is_pager_thread() {
        if let Some(p) = crate::running() {
            p.unlocked(0, usize::MAX);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    extern "C" fn note_ran(arg: *mut c_void) -> *mut c_void {
        // SAFETY: `arg` is the test's flag, alive until the thread is joined.
        unsafe { &*arg.cast::<AtomicBool>() }.store(true, Ordering::SeqCst);
        std::ptr::null_mut()
    }

    /// A thread the pager makes is counted when made and when it starts, and the wait the
    /// pager makes before it registers memory or drops a page (`start.rs`) ends once it has.
    #[test]
    fn the_pager_waits_for_its_own_threads_to_start() {
        let ran = AtomicBool::new(false);
        let (created, started) = (
            CREATED.load(Ordering::SeqCst),
            STARTED.load(Ordering::SeqCst),
        );
        let mut t: pthread_t = 0;
        set_pager_thread(true);
        // SAFETY: the start routine takes the flag, which outlives the thread (joined below).
        let r = unsafe {
            pthread_create(
                &mut t,
                std::ptr::null(),
                note_ran,
                std::ptr::from_ref(&ran).cast_mut().cast(),
            )
        };
        set_pager_thread(false);
        assert_eq!(r, 0);
        // The wait's condition within 10 s (the wait itself has no limit).
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while STARTED.load(Ordering::SeqCst) < CREATED.load(Ordering::SeqCst)
            && std::time::Instant::now() < end
        {
            std::thread::yield_now();
        }
        assert!(STARTED.load(Ordering::SeqCst) >= CREATED.load(Ordering::SeqCst));
        wait_pager_threads_started();
        assert_eq!(CREATED.load(Ordering::SeqCst), created + 1);
        assert_eq!(STARTED.load(Ordering::SeqCst), started + 1);
        // SAFETY: joins the thread made above, once.
        assert_eq!(unsafe { libc::pthread_join(t, std::ptr::null_mut()) }, 0);
        assert!(ran.load(Ordering::SeqCst), "it ran its start routine");
    }
}
