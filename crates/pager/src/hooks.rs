//! The C functions the preloaded library puts in front of the C library's: `pthread_create`
//! (a thread the pager starts gets a stack of the pager's own, recorded in `exclude` before
//! the thread exists, so its stack is never paged out) and `madvise` (a discard by the
//! program forgets the pages it had out, so they read as zeros as the kernel promises),
//! `munlock` and `munlockall` (pages the evictor found locked may be paged again), and the
//! two ways a pager thread could otherwise reach into the program's memory or wait on one of
//! its threads from inside the C library: `__cxa_thread_atexit_impl` (a thread-local's
//! destructor: the C library registers it under the dynamic loader's lock, which a program
//! thread loading a library holds while it may be faulting on a page only the fault thread
//! maps) and `__xpg_strerror_r` (the text of a system error: the C library translates it,
//! reading the program's message-catalog bindings and locale, in its heap, which may be out).
//! munmap and mremap need no hook: the kernel reports them to the pager (userfaultfd
//! events), including those the C library makes internally, which no hook would see.
//!
//! Invariants: with no pager running (not started, or in a forked child, which the pager
//! does not follow) these functions do exactly what the C library's do, and for the
//! program's threads always (the destructors and error texts of the pager's threads are
//! kept and made here); none allocates from the program's allocator.

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

/// Looks up the C library's functions this library stands in front of, at start, so that
/// no call has to look one up later (dlsym takes the dynamic loader's lock).
pub fn look_up_next() {
    let _ = real_create();
    let _ = crate::malloc::next_symbol(&REAL_ATEXIT, c"__cxa_thread_atexit_impl");
    let _ = crate::malloc::next_symbol(&REAL_STRERROR, c"__xpg_strerror_r");
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
    OWN_THREAD.with(|c| c.set(true));
    // SAFETY: `p` is the Box made by `pthread_create` below, handed over exactly once.
    let s = unsafe { Box::from_raw(p.cast::<Start>()) };
    let r = (s.f)(s.arg);
    run_thread_dtors();
    r
}

/// A thread-local's destructor registered by a pager thread, kept here instead of in the C
/// library's list (`__cxa_thread_atexit_impl`).
struct Dtor {
    f: DtorFn,
    obj: *mut c_void,
    next: *mut Dtor,
}

type DtorFn = unsafe extern "C" fn(*mut c_void);
type AtexitFn = unsafe extern "C" fn(DtorFn, *mut c_void, *mut c_void) -> c_int;

thread_local! {
    /// This thread was started by [`pager_thread_start`], which runs its destructors.
    static OWN_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Its destructors, the last registered first.
    static DTORS: Cell<*mut Dtor> = const { Cell::new(std::ptr::null_mut()) };
}

/// Destructors kept for pager threads (never reset; in the pager's report, where a run shows
/// that the library's own definition is the one its threads reach).
pub static DTORS_KEPT: AtomicUsize = AtomicUsize::new(0);

static REAL_ATEXIT: AtomicUsize = AtomicUsize::new(0);

/// Runs the calling pager thread's destructors, the last registered first, as the C library
/// does at a thread's end; one may register another, which runs too.
fn run_thread_dtors() {
    loop {
        let d = DTORS.with(|c| c.replace(std::ptr::null_mut()));
        if d.is_null() {
            return;
        }
        // SAFETY: every node on the list was made by `Box::into_raw` in
        // `__cxa_thread_atexit_impl` on this thread and is taken off exactly once here.
        let d = unsafe { Box::from_raw(d) };
        DTORS.with(|c| c.set(d.next));
        // SAFETY: the registrant's contract: `f(obj)` is to be called once at thread end.
        unsafe { (d.f)(d.obj) };
    }
}

/// `__cxa_thread_atexit_impl`, as the C library's, except that a pager thread's destructor
/// is kept on a list of this library's own and run when the thread's start routine returns:
/// the C library's takes the dynamic loader's lock, which a program thread in `dlopen` may
/// hold while it waits for a page that only the pager's fault thread can bring back (found
/// by review: the fault thread's first log line, or its first contended lock, registers
/// one). What registers destructors on a pager thread is this library (preloaded, never
/// unloaded) or the C library, so the per-library count the C library keeps under that lock
/// (against unloading a library whose destructors are pending) has nothing to protect. A
/// pager thread that ended with `pthread_exit` would skip them; none does.
///
/// # Safety
/// As the C library's: `dtor(obj)` must be sound to call once at the thread's end.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __cxa_thread_atexit_impl(
    dtor: DtorFn,
    obj: *mut c_void,
    dso_symbol: *mut c_void,
) -> c_int {
    if OWN_THREAD.with(|c| c.get()) {
        // Made first, linked after: should the allocation register a destructor of its own,
        // neither is lost.
        let node = Box::into_raw(Box::new(Dtor {
            f: dtor,
            obj,
            next: std::ptr::null_mut(),
        }));
        let next = DTORS.with(|c| c.replace(node));
        // SAFETY: `node` was made above and is on this thread's list only.
        unsafe { (*node).next = next };
        DTORS_KEPT.fetch_add(1, Ordering::Relaxed);
        return 0;
    }
    let f = crate::malloc::next_symbol(&REAL_ATEXIT, c"__cxa_thread_atexit_impl");
    if f == 0 {
        return -1;
    }
    // SAFETY: the C library's function has exactly this signature.
    let real = unsafe { std::mem::transmute::<usize, AtexitFn>(f) };
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(dtor, obj, dso_symbol) }
}

type StrerrorFn = unsafe extern "C" fn(c_int, *mut libc::c_char, size_t) -> c_int;
static REAL_STRERROR: AtomicUsize = AtomicUsize::new(0);
/// Error texts given untranslated to pager threads.
static UNTRANSLATED: AtomicUsize = AtomicUsize::new(0);

extern "C" {
    // The English text of an error, from a table in the C library (2.32 and later): no
    // locale, no catalog. Not in the libc crate.
    fn strerrordesc_np(errnum: c_int) -> *const libc::c_char;
}

/// `__xpg_strerror_r` (the `strerror_r` Rust's standard library calls for an
/// `io::Error`'s text), as the C library's, except that a pager thread gets the untranslated
/// text from the C library's table: the C library's translates it, which walks the
/// program's message-catalog bindings and reads its locale, in the program's heap — a page
/// the fault thread, formatting the error of a page it cannot read, may be the one to bring
/// back.
///
/// # Safety
/// As the C library's: `buf` holds `buflen` writable bytes.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __xpg_strerror_r(
    errnum: c_int,
    buf: *mut libc::c_char,
    buflen: size_t,
) -> c_int {
    if !is_pager_thread() {
        let f = crate::malloc::next_symbol(&REAL_STRERROR, c"__xpg_strerror_r");
        if f != 0 {
            // SAFETY: the C library's function has exactly this signature.
            let real = unsafe { std::mem::transmute::<usize, StrerrorFn>(f) };
            // SAFETY: the caller's arguments, unchanged.
            return unsafe { real(errnum, buf, buflen) };
        }
    }
    // SAFETY: takes any number; returns a static string or null.
    let text = unsafe { strerrordesc_np(errnum) };
    let (text, r): (std::borrow::Cow<'_, [u8]>, c_int) = if text.is_null() {
        (
            format!("Unknown error {errnum}").into_bytes().into(),
            libc::EINVAL,
        )
    } else {
        // SAFETY: a NUL-terminated string of the C library's, never freed.
        (
            unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes().into(),
            0,
        )
    };
    UNTRANSLATED.fetch_add(1, Ordering::Relaxed);
    if buflen == 0 {
        // As the C library's: an unknown number is EINVAL whatever the buffer.
        return if r == 0 { libc::ERANGE } else { r };
    }
    let n = text.len().min(buflen - 1);
    // SAFETY: `buf` holds `buflen` bytes (the caller's contract); n + 1 <= buflen.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    if n < text.len() && r == 0 {
        libc::ERANGE
    } else {
        r
    }
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

    /// Tests that make pager threads, one at a time: one counts the threads made.
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// Makes a pager thread running `start` with `flag`, which must outlive it (join it).
    fn pager_thread(start: StartFn, flag: &AtomicBool) -> pthread_t {
        let mut t: pthread_t = 0;
        set_pager_thread(true);
        // SAFETY: the start routine takes the flag, which the caller keeps until the join.
        let r = unsafe {
            pthread_create(
                &mut t,
                std::ptr::null(),
                start,
                std::ptr::from_ref(flag).cast_mut().cast(),
            )
        };
        set_pager_thread(false);
        assert_eq!(r, 0);
        t
    }

    /// Destructors record their object here, in the order they run; one registers another.
    static RAN: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());

    unsafe extern "C" fn record(obj: *mut c_void) {
        RAN.lock().push(obj as usize);
        if obj as usize == 2 {
            // Registered while the thread's destructors run: it runs too.
            // SAFETY: `record` may be called with any value.
            unsafe { __cxa_thread_atexit_impl(record, 3 as *mut c_void, std::ptr::null_mut()) };
        }
    }

    extern "C" fn register_two(list_held: *mut c_void) -> *mut c_void {
        for obj in [1usize, 2] {
            // SAFETY: `record` may be called with any value.
            let r = unsafe {
                __cxa_thread_atexit_impl(record, obj as *mut c_void, std::ptr::null_mut())
            };
            assert_eq!(r, 0);
        }
        let held = !DTORS.with(|c| c.get()).is_null();
        // SAFETY: `list_held` is the test's flag, alive until the thread is joined.
        unsafe { &*list_held.cast::<AtomicBool>() }.store(held, Ordering::SeqCst);
        std::ptr::null_mut()
    }

    /// A pager thread's thread-local destructors stay off the C library's list (which is
    /// kept under the dynamic loader's lock) and run when its start routine returns, the
    /// last registered first, including one registered by another; a program thread's go to
    /// the C library, which runs them.
    #[test]
    fn a_pager_threads_destructors_are_its_own_and_run_at_its_end() {
        let held = AtomicBool::new(false);
        let _one = ONE_AT_A_TIME.lock();
        let t = pager_thread(register_two, &held);
        // SAFETY: joins the thread made above, once.
        assert_eq!(unsafe { libc::pthread_join(t, std::ptr::null_mut()) }, 0);
        assert!(
            held.load(Ordering::SeqCst),
            "the pager's own list holds them"
        );
        assert_eq!(*RAN.lock(), [2, 3, 1], "run last first, the late one too");

        RAN.lock().clear();
        std::thread::spawn(|| {
            // SAFETY: `record` may be called with any value.
            let r =
                unsafe { __cxa_thread_atexit_impl(record, 7 as *mut c_void, std::ptr::null_mut()) };
            assert_eq!(r, 0);
            assert!(
                DTORS.with(|c| c.get()).is_null(),
                "a program thread's go to the C library"
            );
        })
        .join()
        .unwrap();
        assert_eq!(*RAN.lock(), [7], "the C library ran it at the thread's end");
    }

    fn strerror(errnum: c_int, len: usize) -> (String, c_int) {
        let mut buf = vec![0 as libc::c_char; len.max(1)];
        // SAFETY: `buf` holds at least `len` bytes.
        let r = unsafe { __xpg_strerror_r(errnum, buf.as_mut_ptr(), len) };
        // SAFETY: the function NUL-terminates within `len` bytes when len > 0.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        (text.to_string_lossy().into_owned(), r)
    }

    /// A pager thread gets a system error's text from the C library's table, as the C
    /// library's own function gives it in the C locale, cut to the buffer and with its codes.
    #[test]
    fn a_pager_thread_gets_error_texts_untranslated() {
        let before = UNTRANSLATED.load(Ordering::SeqCst);
        let program = strerror(libc::ENOENT, 64);
        assert_eq!(
            UNTRANSLATED.load(Ordering::SeqCst),
            before,
            "the C library's, for a program thread"
        );
        set_pager_thread(true);
        let pager = strerror(libc::ENOENT, 64);
        let cut = strerror(libc::ENOENT, 5);
        let unknown = strerror(123_456, 64);
        let unknown_cut = strerror(123_456, 3);
        set_pager_thread(false);
        assert_eq!(
            UNTRANSLATED.load(Ordering::SeqCst),
            before + 4,
            "the table's, for the pager's"
        );
        assert_eq!(unknown_cut, ("Un".to_string(), libc::EINVAL));
        assert_eq!(pager, ("No such file or directory".to_string(), 0));
        assert_eq!(program, pager, "as the C library's in the C locale");
        assert_eq!(cut, ("No s".to_string(), libc::ERANGE));
        assert_eq!(unknown, ("Unknown error 123456".to_string(), libc::EINVAL));
    }

    /// A thread the pager makes is counted when made and when it starts, and the wait the
    /// pager makes before it registers memory or drops a page (`start.rs`) ends once it has.
    #[test]
    fn the_pager_waits_for_its_own_threads_to_start() {
        let _one = ONE_AT_A_TIME.lock();
        let ran = AtomicBool::new(false);
        let (created, started) = (
            CREATED.load(Ordering::SeqCst),
            STARTED.load(Ordering::SeqCst),
        );
        let t = pager_thread(note_ran, &ran);
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
