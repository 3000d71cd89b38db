//! Tests of the page table: its transitions one by one, and a property test against a model
//! of memory (every page reads back what was last written to it, no slot is held twice, no
//! standby buffer is lost or doubled).

use super::*;
use proptest::prelude::*;

/// The fingerprint of a page holding `x` (the model's pages are values, not bytes).
fn pr(x: u64) -> Print {
    Print::of_value(x)
}

/// Puts resident page `vpn`, holding `value`, in standby (the hand passing it as often as
/// its second chance needs); returns its buffer.
fn demote(t: &mut Table, vpn: Vpn, value: u64) -> u32 {
    let g = t.select(vpn).or_else(|| t.select(vpn)).expect("selected");
    let buf = t.take_bufs(1).pop().expect("a free buffer");
    let print = pr(value);
    assert_eq!(
        t.commit(vpn, g, Outcome::Standby { buf, print }),
        Commit::Drop
    );
    buf
}

/// Sends the oldest page in standby out; returns it and where it went.
fn flush_one(t: &mut Table) -> (Vpn, Dest) {
    let (v, g, _) = t.begin_flush(1).pop().expect("a page in standby");
    let dest = t.slot_for(v, g).expect("a slot");
    let (Dest::Write(slot) | Dest::Clean(slot)) = dest else {
        panic!("changed")
    };
    assert_eq!(t.commit(v, g, Outcome::Stored { slot }), Commit::Sent);
    (v, dest)
}

/// Page `vpn`, holding `value`, goes through standby to the cluster; returns where.
fn evict(t: &mut Table, vpn: Vpn, value: u64) -> Dest {
    demote(t, vpn, value);
    let (v, dest) = flush_one(t);
    assert_eq!(v, vpn);
    dest
}

/// Fetches out page `vpn` for a read, as holding `value`; returns its slot.
fn fetch(t: &mut Table, vpn: Vpn, value: u64) -> u64 {
    let FaultPlan::Fetch { slot, gen } = t.on_missing(vpn) else {
        panic!("not fetched")
    };
    assert!(t.fetched(vpn, slot, gen, Some(pr(value))));
    slot
}

#[test]
fn first_touch_is_zero_then_evicted_page_is_fetched_clean() {
    let mut t = Table::new(10, 4);
    assert_eq!(t.on_missing(7), FaultPlan::Zero);
    t.zeroed(7);
    // A page never stored is written to a new slot.
    let Dest::Write(slot) = evict(&mut t, 7, 5) else {
        panic!("a page never stored is written")
    };
    assert_eq!(fetch(&mut t, 7, 5), slot);
    // Referenced: the hand passes it once. Its copy has the fingerprint it was mapped
    // with: clean, nothing to write.
    assert_eq!(t.select(7), None);
    assert_eq!(evict(&mut t, 7, 5), Dest::Clean(slot));
    assert_eq!(t.slots_used(), 1);
}

#[test]
fn a_page_whose_bytes_changed_is_dirty_and_one_changed_back_is_clean() {
    let mut t = Table::new(10, 4);
    t.zeroed(1);
    let Dest::Write(slot) = evict(&mut t, 1, 5) else {
        panic!("written")
    };
    fetch(&mut t, 1, 5);
    // Mapped writable: the program's write is not seen, its copy's fingerprint is.
    assert_eq!(evict(&mut t, 1, 6), Dest::Write(slot), "reuses its slot");
    fetch(&mut t, 1, 6);
    assert_eq!(evict(&mut t, 1, 6), Dest::Clean(slot));
    // A fault for a write maps it without a fingerprint: dirty whatever its bytes.
    let FaultPlan::Fetch { slot, gen } = t.on_missing(1) else {
        panic!()
    };
    assert!(t.fetched(1, slot, gen, None));
    assert_eq!(evict(&mut t, 1, 6), Dest::Write(slot));
}

#[test]
fn faults_on_an_evicting_page_wait_and_discards_win() {
    let mut t = Table::new(10, 4);
    // While the evictor copies it.
    let g = t.select(3).unwrap();
    assert_eq!(t.on_missing(3), FaultPlan::Defer);
    assert!(!t.on_write_protect(3));
    t.forget(3, 1);
    let buf = t.take_bufs(1)[0];
    let print = pr(9);
    assert_eq!(
        t.commit(3, g, Outcome::Standby { buf, print }),
        Commit::Leave
    );
    assert_eq!(
        (t.free_bufs(), t.in_standby()),
        (4, 0),
        "its buffer is back"
    );
    // While it is sent out.
    t.zeroed(3);
    demote(&mut t, 3, 9);
    let (v, g, _) = t.begin_flush(1)[0];
    assert_eq!(t.on_missing(v), FaultPlan::Defer);
    let Dest::Write(s) = t.slot_for(v, g).unwrap() else {
        panic!("no slot")
    };
    t.forget(3, 1);
    assert_eq!(t.commit(3, g, Outcome::Stored { slot: s }), Commit::Leave);
    assert_eq!(t.on_missing(3), FaultPlan::Zero);
    assert_eq!(t.slots_used(), 0);
    assert_eq!((t.free_bufs(), t.in_standby()), (4, 0));
}

#[test]
fn a_stale_missing_report_keeps_a_mapped_page_and_its_slot() {
    let mut t = Table::new(10, 4);
    t.zeroed(4);
    let Dest::Write(slot) = evict(&mut t, 4, 2) else {
        panic!("no slot")
    };
    let FaultPlan::Fetch { slot: s, gen } = t.on_missing(4) else {
        panic!("not fetched")
    };
    assert_eq!(s, slot);
    assert!(t.read_ahead(4, slot, gen, pr(2)));
    // A second report for it, read after it was mapped: no zero page can be placed, and
    // the entry is untouched — it keeps its fingerprint, so dropping it needs no write.
    assert_eq!(t.on_missing(4), FaultPlan::Zero);
    assert_eq!(t.slots_used(), 1);
    assert_eq!(evict(&mut t, 4, 2), Dest::Clean(slot));
    // Had the program dropped it, the zero page is placed and the slot goes back.
    t.zeroed(4);
    assert_eq!(t.slots_used(), 0);
}

#[test]
fn a_fetch_is_not_mapped_when_the_page_changed() {
    let mut t = Table::new(10, 4);
    t.zeroed(5);
    evict(&mut t, 5, 1);
    let FaultPlan::Fetch { slot, gen } = t.on_missing(5) else {
        panic!()
    };
    t.forget(5, 1);
    assert!(!t.still(5, slot, gen));
    assert!(!t.fetched(5, slot, gen, None));
}

#[test]
fn remap_moves_out_pages_and_cancels_evictions() {
    let mut t = Table::new(10, 4);
    t.zeroed(100);
    let Dest::Write(s) = evict(&mut t, 100, 1) else {
        panic!("no slot")
    };
    fetch(&mut t, 100, 1);
    t.zeroed(99);
    evict(&mut t, 99, 3);
    let g = t.select(100).or_else(|| t.select(100)).unwrap();
    t.remap(99, 500, 2);
    assert_eq!(t.on_missing(99), FaultPlan::Zero);
    assert!(matches!(t.on_missing(500), FaultPlan::Fetch { .. }));
    let buf = t.take_bufs(1)[0];
    let print = pr(1);
    assert_eq!(
        t.commit(100, g, Outcome::Standby { buf, print }),
        Commit::Leave
    );
    // The page moved with its bytes and their fingerprint.
    assert_eq!(
        t.get(501).unwrap().state,
        State::Resident {
            slot: Some(s),
            print: Some(pr(1))
        }
    );
}

#[test]
fn a_page_in_standby_comes_back_locally_and_the_oldest_is_sent_out() {
    let mut t = Table::new(10, 2);
    let b1 = demote(&mut t, 1, 1);
    demote(&mut t, 2, 2);
    assert_eq!((t.in_standby(), t.free_bufs()), (2, 0));
    // A touch of page 1 (a read the clock would not have seen) is answered from its
    // buffer, which is free again, and the page has its second chance.
    assert_eq!(
        t.on_missing(1),
        FaultPlan::Local {
            buf: b1,
            clean: false
        }
    );
    assert!(t.standby_in(1, Some(pr(1))));
    assert_eq!(
        t.get(1).unwrap().state,
        State::Resident {
            slot: None,
            print: None
        },
        "no slot holds it: no fingerprint"
    );
    assert_eq!((t.in_standby(), t.free_bufs()), (1, 1));
    assert_eq!(t.select(1), None, "referenced: it keeps its place once");
    // The flush takes the oldest page still in standby (2, not 1) and sends it out.
    let taken = t.begin_flush(4);
    assert_eq!(taken.len(), 1);
    let (v, g, _) = taken[0];
    assert_eq!(v, 2);
    assert_eq!(
        t.on_missing(2),
        FaultPlan::Defer,
        "faults wait while it is sent"
    );
    let Dest::Write(slot) = t.slot_for(2, g).unwrap() else {
        panic!("a dirty page is written")
    };
    assert_eq!(t.commit(2, g, Outcome::Stored { slot }), Commit::Sent);
    assert_eq!((t.in_standby(), t.free_bufs()), (0, 2));
    assert!(matches!(t.on_missing(2), FaultPlan::Fetch { .. }));
    // A failed send keeps the page in standby, first in line.
    let b3 = demote(&mut t, 3, 3);
    let (v, g, _) = t.begin_flush(1)[0];
    assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
    assert_eq!(t.begin_flush(1), vec![(3, g, b3)]);
    // A clean page back from standby keeps its fingerprint.
    fetch(&mut t, 2, 2);
    let b2 = demote(&mut t, 2, 2);
    assert_eq!(
        t.on_missing(2),
        FaultPlan::Local {
            buf: b2,
            clean: true
        }
    );
    assert!(t.standby_in(2, Some(pr(2))));
    assert_eq!(
        t.get(2).unwrap().state,
        State::Resident {
            slot: Some(slot),
            print: Some(pr(2))
        }
    );
}

#[test]
fn a_page_the_kernel_refuses_to_drop_is_resident_again_and_never_selected() {
    let mut t = Table::new(10, 2);
    // Stored once and fetched back clean, then put in standby: the drop is refused.
    t.zeroed(1);
    evict(&mut t, 1, 1);
    let slot = fetch(&mut t, 1, 1);
    demote(&mut t, 1, 1);
    t.undo_drop(1);
    assert_eq!(
        t.get(1).unwrap().state,
        State::Resident {
            slot: Some(slot),
            print: None
        },
        "resident, its slot kept, not clean"
    );
    assert_eq!(
        (t.in_standby(), t.free_bufs()),
        (0, 2),
        "its buffer is free"
    );
    assert!(t.begin_flush(4).is_empty(), "its place in line is stale");
    for _ in 0..3 {
        assert_eq!(t.select(1), None, "never selected again");
    }
    // A page of zeros whose drop is refused is kept the same way.
    t.zeroed(2);
    let g = t.select(2).or_else(|| t.select(2)).unwrap();
    assert_eq!(t.commit(2, g, Outcome::Zero), Commit::Drop);
    t.undo_drop(2);
    assert!(t.get(2).unwrap().locked);
    assert_eq!((t.select(2), t.select(2)), (None, None));
    // An munlock of page 2 makes it a candidate again; page 1 stays locked.
    t.unlock(2, 1);
    assert!(!t.get(2).unwrap().locked && t.get(1).unwrap().locked);
    assert!(t.select(2).is_some(), "unlocked: selected again");
    // An unmap forgets both (the slot goes back); a new mapping there is paged again.
    t.forget(1, 2);
    assert_eq!(t.take_freed(), vec![slot]);
    t.zeroed(1);
    assert!(t.select(1).or_else(|| t.select(1)).is_some());
}

#[test]
fn full_store_is_an_error() {
    let mut t = Table::new(1, 4);
    t.zeroed(1);
    evict(&mut t, 1, 1);
    t.zeroed(2);
    demote(&mut t, 2, 2);
    let (v, g, _) = t.begin_flush(1)[0];
    assert_eq!(t.slot_for(v, g), Err(Full(1)));
    assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
    assert!(!t.get(2).unwrap().evicting);
    assert_eq!(t.in_standby(), 1, "it stays in standby");
}

#[derive(Clone, Debug)]
enum Op {
    Touch(u8, bool),
    Rewrite(u8),
    Demote(u8),
    /// Sends pages out; with the flag, the program discards each page while its write is in
    /// flight (after the write, before the commit).
    Flush(u8, bool),
    Forget(u8, u8),
    Remap(u8, u8, u8),
    /// The pager tells the store to forget the slots freed so far.
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..32, any::<bool>()).prop_map(|(v, w)| Op::Touch(v, w)),
        (0u8..32).prop_map(Op::Rewrite),
        (0u8..32).prop_map(Op::Demote),
        (1u8..4, any::<bool>()).prop_map(|(n, d)| Op::Flush(n, d)),
        (0u8..32, 1u8..4).prop_map(|(v, n)| Op::Forget(v, n)),
        (0u8..32, 0u8..32, 1u8..4).prop_map(|(a, b, n)| Op::Remap(a, b, n)),
        Just(Op::Drain),
    ]
}

/// What a slot holds once the store was told to forget it (no value the model writes).
const FORGOTTEN: u64 = u64::MAX;

proptest! {
    /// A model of memory (page → value) against the table driving a simulated store and
    /// address space, where writes are silent (pages are mapped writable) and only the
    /// fingerprints of copies tell a clean page: every page always reads back what was
    /// last written to it, a page sent out as clean holds what its slot holds, no slot is
    /// held twice, and no standby buffer is lost or doubled. What the pager tells the store to
    /// forget (the slots the table freed) is garbage in the simulated store from then on, and is
    /// never read, nor taken for a clean copy.
    #[test]
    fn table_keeps_every_page(ops in proptest::collection::vec(op(), 1..200)) {
        let mut t = Table::new(64, 4);
        let mut model = [0u64; 64];
        // Simulated memory: resident pages and their values; the store's slots.
        let mut mem: BTreeMap<u64, u64> = BTreeMap::new();
        let mut store = [0u64; 64];
        // The standby buffers' bytes.
        let mut bufs = [0u64; 4];
        let mut value = 0u64;
        let fault_in = |t: &mut Table, mem: &mut BTreeMap<u64, u64>, store: &[u64; 64], bufs: &[u64; 4], v: u64, w: bool| {
            if mem.contains_key(&v) { return; }
            match t.on_missing(v) {
                FaultPlan::Local { buf, .. } => {
                    let x = bufs[buf as usize];
                    mem.insert(v, x);
                    assert!(t.standby_in(v, (!w).then(|| pr(x))));
                }
                FaultPlan::Zero => { mem.insert(v, 0); t.zeroed(v); }
                FaultPlan::Fetch { slot, gen } => {
                    let x = store[slot as usize];
                    assert_ne!(x, FORGOTTEN, "page {} read from a forgotten slot", v);
                    assert!(t.fetched(v, slot, gen, (!w).then(|| pr(x))));
                    mem.insert(v, x);
                }
                FaultPlan::Defer => panic!("no eviction in flight"),
            }
        };
        for op in ops {
            match op {
                Op::Touch(v, w) => {
                    let v = u64::from(v);
                    fault_in(&mut t, &mut mem, &store, &bufs, v, w);
                    if w {
                        value += 1;
                        mem.insert(v, value);
                        model[v as usize] = value;
                    }
                    prop_assert_eq!(mem[&v], model[v as usize]);
                }
                Op::Rewrite(v) => {
                    // A write fault that leaves the bytes as they were: mapped without a
                    // fingerprint, the page is sent out again, never taken for clean
                    // wrongly.
                    let v = u64::from(v);
                    fault_in(&mut t, &mut mem, &store, &bufs, v, true);
                }
                Op::Demote(v) => {
                    let v = u64::from(v);
                    if !mem.contains_key(&v) { continue; }
                    let Some(g) = t.select(v).or_else(|| t.select(v)) else { continue };
                    let Some(buf) = t.take_bufs(1).pop() else {
                        prop_assert_eq!(t.commit(v, g, Outcome::Kept), Commit::Leave);
                        continue;
                    };
                    let outcome = if mem[&v] == 0 {
                        t.give_back([buf]);
                        Outcome::Zero
                    } else {
                        bufs[buf as usize] = mem[&v];
                        Outcome::Standby { buf, print: pr(mem[&v]) }
                    };
                    prop_assert_eq!(t.commit(v, g, outcome), Commit::Drop);
                    mem.remove(&v);
                }
                Op::Flush(n, discard) => {
                    for (v, g, buf) in t.begin_flush(usize::from(n)) {
                        prop_assert_eq!(t.on_missing(v), FaultPlan::Defer);
                        let s = match t.slot_for(v, g).unwrap() {
                            Dest::Write(s) if discard => {
                                // Discarded and its slot forgotten while the write is in
                                // flight; the write lands after that.
                                t.forget(v, 1);
                                model[v as usize] = 0;
                                for f in t.take_freed() {
                                    store[f as usize] = FORGOTTEN;
                                }
                                store[s as usize] = bufs[buf as usize];
                                prop_assert_eq!(t.commit(v, g, Outcome::Stored { slot: s }), Commit::Leave);
                                prop_assert!(t.freed.contains(&s), "slot {} written after it was forgotten, not forgotten again", s);
                                continue;
                            }
                            Dest::Write(s) => { store[s as usize] = bufs[buf as usize]; s }
                            Dest::Clean(s) => {
                                prop_assert_eq!(store[s as usize], bufs[buf as usize], "clean page differs from its slot");
                                s
                            }
                            Dest::Changed => panic!("changed without a change"),
                        };
                        prop_assert_eq!(t.commit(v, g, Outcome::Stored { slot: s }), Commit::Sent);
                    }
                }
                Op::Drain => {
                    for s in t.take_freed() {
                        prop_assert!(t.free.contains(&s), "slot {} forgotten while in use", s);
                        store[s as usize] = FORGOTTEN;
                    }
                }
                Op::Forget(v, n) => {
                    let (v, n) = (u64::from(v), u64::from(n));
                    t.forget(v, n);
                    for p in v..(v + n).min(64) { mem.remove(&p); model[p as usize] = 0; }
                }
                Op::Remap(a, b, n) => {
                    let (a, b, n) = (u64::from(a), u64::from(b), u64::from(n));
                    if a + n > 64 || b + n > 64 || (a < b + n && b < a + n) { continue; }
                    t.remap(a, b, n);
                    let vals: Vec<u64> = (a..a + n).map(|p| model[p as usize]).collect();
                    let res: Vec<Option<u64>> = (a..a + n).map(|p| mem.remove(&p)).collect();
                    for p in b..b + n { mem.remove(&p); }
                    for i in 0..n {
                        model[(a + i) as usize] = 0;
                        model[(b + i) as usize] = vals[i as usize];
                        if let Some(x) = res[i as usize] { mem.insert(b + i, x); }
                    }
                }
            }
            prop_assert_eq!(t.in_standby() + t.free_bufs(), 4, "a standby buffer lost or doubled");
        }
        // Read everything back.
        for v in 0..64u64 {
            fault_in(&mut t, &mut mem, &store, &bufs, v, false);
            prop_assert_eq!(mem[&v], model[v as usize], "page {}", v);
        }
        // Every buffer is free or held by one entry; none is both or twice.
        prop_assert_eq!(t.in_standby(), 0);
        let mut free = t.free_bufs.clone();
        free.sort_unstable();
        prop_assert_eq!(free, vec![0, 1, 2, 3]);
        let mut held: Vec<u64> = t.pages.values().filter_map(|e| e.slot()).collect();
        let n = held.len();
        held.sort_unstable();
        held.dedup();
        prop_assert_eq!(held.len(), n, "a slot is held twice");
        prop_assert_eq!(t.slots_used(), n as u64);
    }
}
