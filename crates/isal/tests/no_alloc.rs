//! Proves that `Codec::encode` and cache-hit `Codec::reconstruct` never touch
//! the heap.
//!
//! A counting `#[global_allocator]` counts allocations made by the current
//! thread while a thread-local flag is set, in a thread-local counter (so
//! neither the test harness's own threads nor another test running in
//! parallel can disturb the count). After warming the decode cache with
//! every loss pattern used, 10,000 rounds of encode + reconstruct must
//! allocate nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hydramem_isal::Codec;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the thread-locals may be gone during thread teardown.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every method forwards to the system allocator unchanged; the
// counting touches only const-initialised thread-locals, which do not
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn counter_sees_allocations() {
    let n = allocations_in(|| {
        let v = std::hint::black_box(vec![1u8; 100]);
        drop(v);
    });
    assert!(n >= 1, "the counting allocator is not installed");
}

const PAGE: usize = 4096;
const K: usize = 8;
const R: usize = 2;
const SPLIT: usize = PAGE / K;

#[test]
fn encode_and_cached_reconstruct_do_not_allocate() {
    let codec = Codec::new(K, R).expect("8+2 is a valid code");

    let mut data = [[0u8; SPLIT]; K];
    for (i, split) in data.iter_mut().enumerate() {
        for (j, b) in split.iter_mut().enumerate() {
            *b = (i * 31 + j * 7) as u8;
        }
    }
    let mut parity = [[0u8; SPLIT]; R];
    let mut out = [[0u8; SPLIT]; R];

    // (present, missing) patterns: two data lost; one data and one parity
    // lost; both parity lost.
    let patterns: [([usize; K], &[usize]); 3] = [
        ([0, 1, 2, 4, 5, 7, 8, 9], &[3, 6]),
        ([9, 0, 1, 2, 3, 4, 6, 7], &[5, 8]),
        ([0, 1, 2, 3, 4, 5, 6, 7], &[8, 9]),
    ];

    // Fills `out` for one pattern; all slices live on the stack.
    let mut round = |i: usize, out: &mut [[u8; SPLIT]; R]| {
        let d: [&[u8]; K] = std::array::from_fn(|j| &data[j][..]);
        {
            let [p0, p1] = &mut parity;
            codec.encode(&d, &mut [p0, p1]).expect("encode");
        }
        let (present, missing) = &patterns[i % patterns.len()];
        let all: [&[u8]; K + R] = std::array::from_fn(|j| match j < K {
            true => &data[j][..],
            false => &parity[j - K][..],
        });
        let pres: [(usize, &[u8]); K] = std::array::from_fn(|j| (present[j], all[present[j]]));
        let [o0, o1] = out;
        let mut miss = [(missing[0], &mut o0[..]), (missing[1], &mut o1[..])];
        codec.reconstruct(&pres, &mut miss).expect("reconstruct");
    };

    // Warm up: builds the decode tables of every pattern (allocates).
    for i in 0..patterns.len() {
        round(i, &mut out);
    }

    let n = allocations_in(|| {
        for i in 0..10_000 {
            round(i, &mut out);
        }
    });
    assert_eq!(
        n, 0,
        "encode/reconstruct allocated {n} times in 10,000 rounds"
    );

    // And the work was real: the last round (i = 9999, pattern 0) rebuilt
    // data splits 3 and 6.
    assert_eq!(out[0], data[3]);
    assert_eq!(out[1], data[6]);
}
