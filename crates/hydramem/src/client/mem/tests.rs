//! Tests of the client's logic over the in-memory transport, without node processes: every
//! scheme reads back what it wrote, page by page and in batches; a batch reaches each node as
//! one run; and the transport itself keeps its contract (refused posts, node loss, restarts).
//! The fault tests are in [`faults`]. A [`Model`] checks every read against the writes: an
//! acknowledged write must read back exactly, a failed one may or may not have landed, and
//! nothing else may ever come back.

mod faults;
mod members;

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{cluster, connect, MemControl, MemOptions, MemTransport};
use crate::client::transport::{Completions, RunSplit, Transport, TransportError};
use crate::client::{ClientConfig, IoError, Page, RemoteMemory};
use crate::wire::{Entry, Op, Run, Status};
use crate::PAGE_SIZE;

/// Slab size of every test cluster: 128 pages per range for hydra 8+2, 16 for replicas.
const SLAB: u64 = 64 << 10;
const PAGE: u64 = PAGE_SIZE as u64;

/// A client of `scheme` with an address space of `pages` pages on `nodes` in-memory nodes,
/// its configuration adjusted by `tweak`.
fn start(
    scheme: &str,
    nodes: usize,
    pages: u64,
    tweak: impl FnOnce(&mut ClientConfig),
) -> (Arc<RemoteMemory>, MemControl) {
    start_on(SLAB, scheme, nodes, pages, tweak)
}

/// [`start`] on slabs of `slab` bytes.
fn start_on(
    slab: u64,
    scheme: &str,
    nodes: usize,
    pages: u64,
    tweak: impl FnOnce(&mut ClientConfig),
) -> (Arc<RemoteMemory>, MemControl) {
    let mut config = ClientConfig::new(scheme.parse().expect("a scheme"), pages * PAGE);
    config.seed = Some(7);
    config.op_timeout = Duration::from_secs(5);
    tweak(&mut config);
    let options = MemOptions {
        slabs_per_node: 64,
        seed: 11,
        spare: 0,
    };
    connect(&cluster(nodes, slab), config, options).expect("the client connects")
}

/// [`start`], then every page written in one batch.
fn written(
    scheme: &str,
    nodes: usize,
    pages: u64,
    tweak: impl FnOnce(&mut ClientConfig),
) -> (Arc<RemoteMemory>, MemControl, Model) {
    let (mem, ctl) = start(scheme, nodes, pages, tweak);
    let mut model = Model::default();
    model.write(&mem, 0, pages, true).unwrap();
    (mem, ctl, model)
}

/// The bytes write `stamp` puts in page `addr`: every 8 bytes depend on both, so that no
/// split of another page or another write matches (stamp 0: never written, zeros).
fn content(addr: u64, stamp: u64) -> Page {
    let mut page = [0u8; PAGE_SIZE];
    if stamp == 0 {
        return page;
    }
    let mut x = (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stamp.wrapping_mul(0xD6E8_FEB8)) | 1;
    for chunk in page.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    page
}

/// What every page may hold: its last acknowledged write (0: never written) and the writes
/// that failed since (each may or may not have landed).
#[derive(Default)]
struct Model {
    pages: HashMap<u64, (u64, Vec<u64>)>,
    next: u64,
}

impl Model {
    /// Writes `n` pages from `addr` with fresh contents, one by one or as one batch.
    fn write(&mut self, mem: &RemoteMemory, addr: u64, n: u64, batch: bool) -> Result<(), IoError> {
        self.next += 1;
        let stamp = self.next;
        let addrs: Vec<u64> = (0..n).map(|i| addr + i * PAGE).collect();
        let pages: Vec<Page> = addrs.iter().map(|&a| content(a, stamp)).collect();
        let mut result = Ok(());
        if batch {
            result = mem.write_pages(addr, &pages);
        } else {
            for (a, p) in addrs.iter().zip(&pages) {
                result = result.and(mem.write_page(*a, p));
            }
        }
        for a in addrs {
            let entry = self.pages.entry(a).or_default();
            match result {
                Ok(()) => *entry = (stamp, Vec::new()),
                Err(_) => entry.1.push(stamp),
            }
        }
        result
    }

    /// Whether `got` is something page `addr` may hold.
    fn allows(&self, addr: u64, got: &Page) -> bool {
        let (acked, maybe) = self.pages.get(&addr).cloned().unwrap_or_default();
        std::iter::once(acked)
            .chain(maybe)
            .any(|stamp| content(addr, stamp) == *got)
    }

    /// Reads `n` pages from `addr`, one by one or as one batch, and checks whatever reads
    /// back: an error is returned, wrong bytes fail the test.
    fn read(&self, mem: &RemoteMemory, addr: u64, n: u64, batch: bool) -> Result<(), IoError> {
        let mut pages = vec![[0u8; PAGE_SIZE]; n as usize];
        if batch {
            mem.read_pages(addr, &mut pages)?;
        }
        for (i, page) in pages.iter_mut().enumerate() {
            let a = addr + i as u64 * PAGE;
            if !batch {
                mem.read_page(a, page)?;
            }
            assert!(self.allows(a, page), "page {a:#x} read back wrong bytes");
        }
        Ok(())
    }

    /// Reads every page of a client of `pages` pages both ways; every read must succeed.
    fn read_all(&self, mem: &RemoteMemory, pages: u64) {
        self.read(mem, 0, pages, true).expect("a batched read");
        self.read(mem, 0, pages, false).expect("a page read");
    }
}

/// Writes pages of a client of `scheme` page by page and in batches — across range
/// boundaries (every 128 pages for hydra 8+2, 16 for replicas) and longer than a window — and
/// reads every page back both ways.
fn reads_back_what_it_wrote(scheme: &str, nodes: usize) {
    let pages = 320;
    let (mem, ctl) = start(scheme, nodes, pages, |_| {});
    let mut model = Model::default();
    for i in (0..64).step_by(3) {
        model.write(&mem, i * PAGE, 1, false).unwrap();
    }
    model.write(&mem, 100 * PAGE, 40, true).unwrap();
    model.write(&mem, 10 * PAGE, 30, true).unwrap();
    model.write(&mem, 0, pages, true).unwrap();
    model.write(&mem, 5 * PAGE, 3, false).unwrap();
    model.read_all(&mem, pages);
    let total = ctl.total();
    assert!(
        total.frames > 0 && total.delivered > 0,
        "{scheme}: {total:?}"
    );
    assert_eq!(mem.foreign_replies(), 0);
}

#[test]
fn hydra_reads_back_what_it_wrote() {
    reads_back_what_it_wrote("hydra-8+2-d1", 12);
}

#[test]
fn rep2_reads_back_what_it_wrote() {
    reads_back_what_it_wrote("rep2", 4);
}

#[test]
fn single_reads_back_what_it_wrote() {
    reads_back_what_it_wrote("single", 3);
}

#[test]
fn pages_never_written_read_as_zeros() {
    let (mem, _ctl) = start("hydra-8+2-d1", 10, 256, |_| {});
    let mut model = Model::default();
    model.write(&mem, 3 * PAGE, 1, false).unwrap();
    // Page 4 is in a mapped range, page 200 in one never mapped.
    model.read(&mem, 0, 8, true).unwrap();
    model.read(&mem, 200 * PAGE, 4, false).unwrap();
}

/// Checks that every node got either nothing or one frame of one run of `pages` splits, and
/// that `nodes` nodes got it.
fn assert_one_run_each(ctl: &MemControl, nodes: usize, pages: u64, what: &str) {
    let mut reached = 0;
    for i in 0..ctl.nodes() {
        let c = ctl.counts(i as u16);
        if c.runs == 0 {
            assert_eq!((c.frames, c.splits), (0, 0), "{what}: node {i}: {c:?}");
            continue;
        }
        assert_eq!(
            (c.frames, c.runs, c.splits),
            (1, 1, pages),
            "{what}: node {i}"
        );
        reached += 1;
    }
    assert_eq!(reached, nodes, "{what}: nodes reached");
}

#[test]
fn a_batch_of_32_pages_reaches_each_node_as_one_run() {
    for (scheme, nodes, fanout) in [("hydra-8+2-d1", 12, 9), ("rep2", 4, 1)] {
        // Slabs of 64 pages of 4096 bytes, so that pages 0..32 lie in one range for either
        // scheme; no straggler re-asks: what reaches the nodes is the batch's first requests.
        let (mem, ctl) = start_on(64 * PAGE, scheme, nodes, 64, |c| {
            c.straggler_after = Duration::from_secs(60)
        });
        let mut model = Model::default();
        model.write(&mem, 0, 1, false).unwrap(); // maps the range
        ctl.reset_counts();
        model.write(&mem, 0, 32, true).unwrap();
        assert_one_run_each(&ctl, mem.layout().width, 32, scheme);
        ctl.reset_counts();
        model.read(&mem, 0, 32, true).unwrap();
        assert_one_run_each(&ctl, fanout, 32, scheme);
    }
}

/// Completions recorded as events, for tests of the transport alone.
#[derive(Default)]
struct Recorder {
    events: Mutex<Option<Sender<Event>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Read(u16, u64, Status, Vec<u8>),
    Write(u16, u64, Status, u64),
    Down(u16),
}

impl Recorder {
    fn send(&self, e: Event) {
        if let Some(tx) = self.events.lock().as_ref() {
            let _ = tx.send(e);
        }
    }
}

impl Completions for Recorder {
    fn read_done(&self, node: u16, cookie: u64, status: Status, _: u64, _: u32, data: &[u8]) {
        self.send(Event::Read(node, cookie, status, data.to_vec()));
    }
    fn write_done(&self, node: u16, cookie: u64, status: Status, stored: u64) {
        self.send(Event::Write(node, cookie, status, stored));
    }
    fn node_down(&self, node: u16) {
        self.send(Event::Down(node));
    }
}

/// A transport of `nodes` nodes whose completions arrive as events.
fn bare(nodes: usize) -> (MemTransport, MemControl, Receiver<Event>) {
    let (tx, rx) = channel();
    let recorder = Recorder {
        events: Mutex::new(Some(tx)),
    };
    let greeting = crate::rpc::Greeting::client(&crate::wire::ClientId([9; 16]), 0, None);
    let (t, outcomes) = MemTransport::new(
        &cluster(nodes, SLAB),
        MemOptions::default(),
        greeting,
        Arc::new(recorder),
    )
    .unwrap();
    assert!(outcomes.iter().all(|o| o.is_ok()));
    let ctl = t.control();
    (t, ctl, rx)
}

fn next(rx: &Receiver<Event>) -> Event {
    rx.recv_timeout(Duration::from_secs(5)).expect("an event")
}

#[test]
fn the_transport_refuses_what_it_cannot_post_and_serves_the_rest() {
    let (t, ctl, rx) = bare(2);
    let slab = t.alloc(0, 1, 512).unwrap();
    let run = Run {
        slab,
        split_len: 512,
        offset: 0,
        n: 2,
    };
    let data = [7u8; 512];
    let split = |cookie| RunSplit {
        cookie,
        version: 5,
        crc: 0,
        tag: 0,
        data: &data,
    };
    // A node that does not exist, no splits, data of another length: refused, nothing sent.
    let err = t.post_read(9, Entry::default(), true).unwrap_err();
    assert!(matches!(err, TransportError::Down { node: 9, .. }));
    assert!(matches!(
        t.post_read_run(0, Run { n: 0, ..run }, &mut [1].into_iter(), true),
        Err(TransportError::BadRun { .. })
    ));
    let short = RunSplit {
        data: &data[..100],
        ..split(1)
    };
    let mut splits = [split(1), short].into_iter();
    assert!(matches!(
        t.post_write_run(0, run, &mut splits, true),
        Err(TransportError::BadRun { .. })
    ));
    assert_eq!(ctl.counts(0).frames, 0);
    // Two runs posted without flushing travel in one frame; the write lands, the read of the
    // slab's next slots gets it back, a slab that does not exist is refused per run.
    t.post_write_run(0, run, &mut [split(1), split(2)].into_iter(), false)
        .unwrap();
    t.post_read_run(0, run, &mut [3, 4].into_iter(), false)
        .unwrap();
    let missing = Run {
        slab: slab ^ 1,
        ..run
    };
    t.post_read_run(0, missing, &mut [5, 6].into_iter(), false)
        .unwrap();
    assert_eq!(ctl.counts(0).frames, 0, "nothing is sent before the flush");
    t.flush(0).unwrap();
    let mut got: Vec<Event> = (0..6).map(|_| next(&rx)).collect();
    got.sort_by_key(|e| match e {
        Event::Read(_, c, ..) | Event::Write(_, c, ..) => *c,
        Event::Down(_) => 0,
    });
    assert_eq!(got[0], Event::Write(0, 1, Status::Ok, 5));
    assert_eq!(got[2], Event::Read(0, 3, Status::Ok, data.to_vec()));
    assert_eq!(got[4], Event::Read(0, 5, Status::NoSuchSlab, Vec::new()));
    // The delivery thread counts a reply frame after handing its events over: wait for the
    // count to move (bounded) rather than read it the moment the last event arrives.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ctl.counts(0).delivered < 2 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    let c = ctl.counts(0);
    assert_eq!((c.frames, c.runs, c.splits, c.delivered), (2, 3, 6, 2));
    // Control calls: refused with the node's status; a body too large is not sent.
    assert!(matches!(
        t.free(0, slab ^ 1),
        Err(TransportError::Refused {
            status: Status::NoSuchSlab,
            ..
        })
    ));
    let huge = vec![0u8; crate::wire::MAX_BODY + 1];
    assert!(matches!(
        t.call(0, Op::List, &huge),
        Err(TransportError::Protocol { .. })
    ));
    assert!(t.is_up(0) && t.addr(0).contains("in-memory node 0"));
}

#[test]
fn a_node_that_goes_down_fails_its_splits_and_delivers_nothing_after() {
    let (t, ctl, rx) = bare(2);
    let slabs = [t.alloc(0, 1, 512).unwrap(), t.alloc(1, 1, 512).unwrap()];
    let entry = |node: usize, cookie| Entry {
        slab: slabs[node],
        len: 512,
        cookie,
        ..Entry::default()
    };
    // Node 0's reply is held 50 ms, node 1's 150 ms; node 0 goes down meanwhile.
    ctl.node(0).delay(Duration::from_millis(50));
    ctl.node(1).delay(Duration::from_millis(150));
    t.post_read(0, entry(0, 1), true).unwrap();
    t.post_read(1, entry(1, 2), true).unwrap();
    ctl.node(0).down();
    assert_eq!(next(&rx), Event::Down(0));
    assert!(!t.is_up(0));
    assert!(matches!(
        t.post_read(0, entry(0, 3), true),
        Err(TransportError::Down { .. })
    ));
    assert!(matches!(
        t.call(0, Op::List, &[]),
        Err(TransportError::Down { .. })
    ));
    // Node 1's reply is due after node 0's would have been: node 0's never comes.
    assert!(matches!(next(&rx), Event::Read(1, 2, Status::Ok, _)));
    // Back up with its memory: the slab is still there; a restart loses it.
    ctl.node(0).up();
    assert!(t.is_up(0) && !t.take_restarted(0));
    ctl.node(0).delay(Duration::ZERO);
    t.post_read(0, entry(0, 4), true).unwrap();
    assert!(matches!(next(&rx), Event::Read(0, 4, Status::Ok, _)));
    ctl.node(0).restart();
    assert_eq!(next(&rx), Event::Down(0));
    assert!(t.take_restarted(0) && !t.take_restarted(0));
    t.post_read(0, entry(0, 5), true).unwrap();
    assert_eq!(next(&rx), Event::Read(0, 5, Status::NoSuchSlab, Vec::new()));
    assert!(rx.try_recv().is_err(), "nothing else was delivered");
}

#[test]
fn connect_with_checks_what_the_transport_opened() {
    use crate::client::ClientError;
    let open = |nodes: usize, slab: u64| {
        let cluster = cluster(nodes, slab);
        move |hello, completions| {
            MemTransport::new(&cluster, MemOptions::default(), hello, completions)
        }
    };
    let config = |scheme: &str| ClientConfig::new(scheme.parse().unwrap(), 64 * PAGE);
    let file = cluster(3, SLAB);
    let err = |r: Result<Arc<RemoteMemory>, ClientError>| r.err().expect("refused");
    assert!(matches!(
        err(RemoteMemory::connect_with(
            &file,
            config("rep2"),
            open(4, SLAB)
        )),
        ClientError::Config(_)
    ));
    assert!(matches!(
        err(RemoteMemory::connect_with(
            &file,
            config("rep2"),
            open(3, 2 * SLAB)
        )),
        ClientError::SlabSize { node: 0, .. }
    ));
    assert!(matches!(
        err(RemoteMemory::connect_with(
            &file,
            config("hydra-8+2-d1"),
            open(3, SLAB)
        )),
        ClientError::TooFewNodes {
            needed: 10,
            up: 3,
            ..
        }
    ));
    let mem = RemoteMemory::connect_with(&file, config("rep2"), open(3, SLAB)).unwrap();
    assert_eq!(mem.transport().nodes(), 3);
}

#[test]
fn submissions_stay_in_flight_from_one_thread_and_end_on_any() {
    for scheme in ["hydra-8+2-d1", "rep2"] {
        let pages = 600u64;
        let (mem, ctl) = start(scheme, 12, pages, |c| c.max_in_flight = 100);
        // Scattered and consecutive addresses mixed.
        let addrs: Vec<u64> = (0..300).map(|i| (i * 2 % pages) * PAGE).collect();
        let data: Vec<(u64, Page)> = addrs.iter().map(|&a| (a, content(a, 1))).collect();
        // One submission is one window at most.
        assert!(matches!(
            mem.submit_write(data.clone()),
            Err(IoError::SubmissionTooLarge {
                pages: 300,
                max: 256,
                ..
            })
        ));
        for part in data.chunks(100) {
            let w = mem.submit_write(part.to_vec()).unwrap();
            assert_eq!(w.len(), 100);
            w.wait().unwrap();
        }
        // Six submissions of 16 pages from this thread take all but four slots.
        let before = ctl.total().frames;
        let mut pending: Vec<_> = (0..6)
            .map(|k| {
                mem.submit_read(addrs[k * 16..(k + 1) * 16].to_vec())
                    .unwrap()
            })
            .collect();
        // Posted before any is waited for, one frame per node per submission at most.
        let posted = ctl.total().frames;
        assert!(posted - before <= 6 * 12, "{scheme}");
        // A seventh of 16 finds 4 slots: it takes none and sends nothing, at once.
        match mem.submit_read(addrs[96..112].to_vec()) {
            Err(
                e @ IoError::NoSlot {
                    pages: 16,
                    free: 4,
                    slots: 100,
                    ..
                },
            ) => {
                assert!(
                    e.to_string().contains("end earlier submissions first"),
                    "{e}"
                )
            }
            Err(e) => panic!("{scheme}: expected NoSlot, got {e}"),
            Ok(_) => panic!("{scheme}: a submission went out without a slot per page"),
        }
        assert_eq!(
            ctl.total().frames,
            posted,
            "{scheme}: a refused submission sent"
        );
        // Four pages fit.
        pending.push(mem.submit_read(addrs[96..100].to_vec()).unwrap());
        let check = |k: usize, got: &[Page]| {
            for (i, page) in got.iter().enumerate() {
                assert!(*page == content(addrs[k * 16 + i], 1), "{scheme}: {k}/{i}");
            }
        };
        std::thread::scope(|s| {
            // The last is ended on another thread while this one ends the others newest
            // first: no wait needs a slot another submission holds.
            let last = pending.pop().unwrap();
            let other = s.spawn(move || last.wait());
            for (k, mut p) in pending.into_iter().enumerate().rev() {
                while k == 0 && !p.is_ready() {
                    std::thread::yield_now();
                }
                check(k, &p.wait().unwrap());
            }
            check(6, &other.join().unwrap().unwrap());
        });
        // Dropped unwaited: its slots come back, all of them.
        drop(mem.submit_read(addrs[..100].to_vec()).unwrap());
        let all = mem
            .submit_read(addrs[..100].to_vec())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(all.len(), 100);
        check(0, &all[..16]);
        assert!(matches!(
            mem.submit_read(vec![PAGE + 1]),
            Err(IoError::Unaligned { .. })
        ));
        assert!(matches!(
            mem.submit_write(vec![(pages * PAGE, [0; PAGE_SIZE])]),
            Err(IoError::OutOfRange { .. })
        ));
        assert!(mem
            .submit_read(Vec::new())
            .unwrap()
            .wait()
            .unwrap()
            .is_empty());
    }
}

/// The NBD server's completer ends every READ its connection started, in order, while the
/// connection's thread starts more: if ending one could wait for a slot, it could wait for a
/// slot that a READ queued behind it holds, which only the completer gives back. Here one
/// thread holds every slot in submissions, and each ends without waiting for one.
#[test]
fn a_thread_holding_every_slot_ends_its_submissions_in_any_order() {
    let (mem, _ctl) = start("hydra-8+2-d1", 12, 256, |c| c.max_in_flight = 16);
    mem.write_pages(0, &vec![[1u8; PAGE_SIZE]; 32]).unwrap();
    for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
        let mut held: Vec<Option<_>> = (0..4)
            .map(|k| Some(mem.submit_read((0..4).map(|i| (k * 4 + i) * PAGE).collect())))
            .map(|s| s.map(Result::unwrap))
            .collect();
        // Every slot is held: one more page is refused, not left to wait for a slot.
        assert!(matches!(
            mem.submit_read(vec![16 * PAGE]),
            Err(IoError::NoSlot { free: 0, .. })
        ));
        for k in order {
            let pages = held[k].take().unwrap().wait().unwrap();
            assert!(
                pages.iter().all(|p| *p == [1u8; PAGE_SIZE]),
                "{order:?}: {k}"
            );
        }
    }
    // Once they are ended, the page refused above goes.
    let more = mem.submit_read(vec![16 * PAGE]).unwrap().wait().unwrap();
    assert!(more[0] == [1u8; PAGE_SIZE]);
}
