//! Reading a page of a row: one request for its piece, hedged by a degraded read of the
//! whole row when the piece's node is down, fails, regenerates or is slow; a read never
//! combines pieces of two versions (the module doc of [`super`] says how versions decide).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Look, Newer, PieceOp, PieceRead, PieceWant, HEDGE_FACTOR, MIN_HEDGE};
use crate::client::layout::MAX_WIDTH;
use crate::client::slots::{self, Progress};
use crate::client::wait::{NodeSet, Pacer};
use crate::client::{Group, IoError, Page, RemoteMemory};
use crate::wire::{self, Entry};
use crate::PAGE_SIZE;

impl RemoteMemory {
    /// Reads the page `want` names (stored as piece `pos` of row `row` at `version`) into
    /// `page`: one request to the piece's node, or a degraded read of the row when that node
    /// is down, fails, regenerates or is slow (see the module doc).
    ///
    /// # Errors
    /// Fewer than k pieces of the version can be read (more than r of the row's nodes lost),
    /// or the read timed out.
    pub fn read_piece(&self, want: PieceWant, page: &mut Page) -> Result<PieceRead, IoError> {
        // SAFETY: `page` is exclusively borrowed for this whole call, and the operation is
        // ended (its slot closed and dropped) before it returns.
        let read = unsafe { self.begin_piece(want, page.as_mut_ptr(), true, None)? };
        let read = read.expect("a single read waits for its slot");
        self.end_piece(read, page)
    }

    /// Reads many pages, each stored as a piece of a row (see [`RemoteMemory::read_piece`]),
    /// with their requests in flight together: every piece of a window is posted before any
    /// node is flushed, so each node gets one frame. Returns each page's outcome, in order.
    pub fn read_pieces(
        &self,
        list: &mut [(PieceWant, &mut Page)],
    ) -> Vec<Result<PieceRead, IoError>> {
        let mut out = Vec::with_capacity(list.len());
        let mut rest = &mut list[..];
        while !rest.is_empty() {
            let mut touched = vec![false; self.transport.nodes()];
            let mut begun = Vec::new();
            for (i, (want, page)) in rest.iter_mut().enumerate() {
                let may_wait = i == 0;
                if i >= crate::client::batch::WINDOW {
                    break;
                }
                // SAFETY: each page is exclusively borrowed for this whole call through
                // `list`, and every operation begun here is ended below, before returning.
                let b = unsafe {
                    self.begin_piece(
                        *want,
                        page.as_mut_ptr(),
                        false,
                        Some((may_wait, &mut touched)),
                    )
                };
                match b {
                    Ok(Some(read)) => begun.push(Ok(read)),
                    Ok(None) => break,
                    Err(e) => begun.push(Err(e)),
                }
            }
            self.post_piece_runs(&mut begun, &mut touched);
            for (node, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
                let _ = self.transport.flush(node as u16);
            }
            let n = begun.len();
            for (b, (_, page)) in begun.into_iter().zip(rest.iter_mut()) {
                out.push(b.and_then(|read| self.end_piece(read, page)));
            }
            rest = &mut rest[n..];
        }
        out
    }

    /// Posts the healthy pieces of a batch's reads, `begun` in list order: the pages at one
    /// position of consecutive rows of one group are consecutive slots of one slab, so each
    /// such stretch is one run to that node (pages written together and read back together
    /// are: rows are taken in order). Marks the nodes in `touched`; restarts the reads' hedge
    /// clocks from now.
    fn post_piece_runs(&self, begun: &mut [Result<PieceOp<'_>, IoError>], touched: &mut [bool]) {
        let l = &self.layout;
        let mut healthy: Vec<&mut PieceOp<'_>> = begun
            .iter_mut()
            .filter_map(|b| b.as_mut().ok())
            .filter(|p| !p.degraded)
            .collect();
        // By group, position and row: the pages of a row lie at different positions, so
        // in list order no two neighbours would share a node.
        healthy.sort_by_key(|p| (std::sync::Arc::as_ptr(&p.group) as usize, p.want.pos, p.rir));
        for stretch in healthy.chunk_by(|a, b| {
            std::sync::Arc::ptr_eq(&a.group, &b.group)
                && a.want.pos == b.want.pos
                && b.rir == a.rir + 1
        }) {
            let (group, j, first) = (&stretch[0].group, stretch[0].want.pos, stretch[0].rir);
            self.post_split_run(
                stretch,
                |p| &p.op,
                j,
                (group, l.split_offset(first)),
                |node, run| {
                    let mut cookies = stretch.iter().map(|p| p.op.cookie(j));
                    self.transport.post_read_run(node, run, &mut cookies, false)
                },
            );
            if let Some(t) = touched.get_mut(group.nodes[j] as usize) {
                *t = true;
            }
        }
        let now = Instant::now();
        for p in healthy.iter_mut() {
            p.posted = now;
        }
    }

    /// Takes a slot for a piece read and posts the page's own piece (or, when its node
    /// cannot serve it, every other piece of the row). `batch`: `None` for a single read
    /// (waits for a slot, flushes at once); `Some((may_wait, touched))` for one of a batch,
    /// which waits for a slot only if `may_wait` (otherwise `Ok(None)` when none is free),
    /// leaves a healthy piece for the caller to post in a run ([`RemoteMemory::read_pieces`]),
    /// leaves the requests of a degraded one queued, and marks their nodes in `touched`.
    ///
    /// # Safety
    /// `page` must be valid for writes of 4096 bytes and untouched by anything else until
    /// the returned read is ended ([`RemoteMemory::end_piece`]) or dropped.
    unsafe fn begin_piece(
        &self,
        want: PieceWant,
        page: *mut u8,
        flush: bool,
        batch: Option<(bool, &mut Vec<bool>)>,
    ) -> Result<Option<PieceOp<'_>>, IoError> {
        let l = &self.layout;
        let start = Instant::now();
        let (row, j) = (want.row, want.pos);
        let unit = row.saturating_mul(PAGE_SIZE as u64);
        let (range, rir) = self.locate_unit(unit)?;
        let Some(group) = self.ranges[range].load_full() else {
            return Err(IoError::Unavailable {
                what: "read",
                addr: want.addr,
                range: range as u64,
                needed: 1,
                got: 0,
                nodes: "none: the page's row range is not mapped (its slabs were freed)".into(),
            });
        };
        if j >= l.k {
            return Err(IoError::Store(
                format!(
                    "page {:#x}: piece {j} of a row is parity, not a page",
                    want.addr
                )
                .into(),
            ));
        }
        let op = match &batch {
            // SAFETY: this function's contract is `try_acquire_read`'s (see above); span
            // layouts land every piece in the slot's side buffer, never in the page itself.
            Some((false, _)) => match unsafe { self.slots.try_acquire_read(page) } {
                Some(op) => op,
                None => return Ok(None),
            },
            // SAFETY: as above, for `acquire_read`.
            _ => unsafe { self.slots.acquire_read(page) },
        };
        op.bind(range as u64, rir);
        let node = group.nodes[j];
        let healthy = group.fresh & (1 << j) == 0 && node != slots::NO_NODE;
        let alone = batch.is_none();
        let flush = flush && alone;
        if healthy && alone {
            self.post_piece_read(&op, &group, j, rir, flush);
        } else if !healthy {
            self.post_other_pieces(&op, &group, j, rir, flush);
        }

        if let Some((_, touched)) = batch {
            for i in 0..l.width {
                if op.progress().posted & (1 << i) != 0 {
                    if let Some(t) = touched.get_mut(group.nodes[i] as usize) {
                        *t = true;
                    }
                }
            }
        }
        let posted = Instant::now();
        Ok(Some(PieceOp {
            op,
            group,
            want,
            rir,
            range,
            degraded: !healthy,
            timed: alone,
            start,
            posted,
        }))
    }

    /// Waits for a piece read begun by [`RemoteMemory::begin_piece`] — hedging with a
    /// degraded read when its piece is late — and lands the page.
    fn end_piece(&self, read: PieceOp<'_>, page: &mut Page) -> Result<PieceRead, IoError> {
        let l = &self.layout;
        let PieceOp {
            mut op,
            group,
            want,
            rir,
            range,
            mut degraded,
            timed,
            start,
            posted,
        } = read;
        let (j, version) = (want.pos, want.version);
        let hedge_at = posted + self.hedge_delay();
        let mut pacer = Pacer::polling_from(&self.config, &self.pollers, start, posted);
        pacer.wake_at(hedge_at);
        let mut set = NodeSet::new();
        let decision = loop {
            let p = op.progress();
            if let Some(look) = look_piece(&op, p, (l.k, l.width), &want, degraded) {
                break Some(Ok(look));
            }
            let own_useless = p.failed & (1 << j) != 0
                || (p.landed & (1 << j) != 0 && op.version_of(j) != version);
            if !degraded && (own_useless || Instant::now() >= hedge_at) {
                degraded = true;
                self.post_other_pieces(&op, &group, j, rir, true);
                continue;
            }
            if degraded && p.outstanding() == 0 {
                break Some(Err(()));
            }
            if self.receive_own(&pacer, &mut set, &op, p) {
                continue;
            }
            if !pacer.pause() {
                break None;
            }
        };
        drop(pacer);
        let p = op.close();
        let unit = want.row.saturating_mul(PAGE_SIZE as u64);
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.count_reads(&op, p.landed | p.corrupt);
        if p.corrupt != 0 {
            self.count_corrupt(&op, p.corrupt, unit, wire::CorruptCause::Checksum);
        }
        self.metrics
            .read_seconds
            .record(start.elapsed().as_secs_f64());
        match decision {
            Some(Ok(Look::Piece)) => {
                page.copy_from_slice(&op.side()[j * PAGE_SIZE..(j + 1) * PAGE_SIZE]);
                if timed && !degraded {
                    fold(&self.piece_ns, posted.elapsed());
                }
                Ok(PieceRead::Done { decoded: false })
            }
            Some(Ok(Look::Decode(mask))) => {
                self.decode_piece(&mut op, mask, j, page);
                Ok(PieceRead::Done { decoded: true })
            }
            Some(Ok(Look::Moved)) => Ok(PieceRead::Moved),
            Some(Err(())) => {
                self.metrics.read_errors.increment(1);
                Err(IoError::Unavailable {
                    what: "read",
                    addr: want.addr,
                    range: range as u64,
                    needed: l.k,
                    got: op.of_version(p.landed, l.width, version).count_ones() as usize,
                    nodes: self.describe_row(&group, &op, p, version),
                })
            }
            None => {
                self.metrics.read_errors.increment(1);
                Err(IoError::Timeout {
                    what: "read",
                    addr: want.addr,
                    range: range as u64,
                    waited: start.elapsed(),
                    nodes: self.describe(&op, p.outstanding()),
                })
            }
        }
    }

    /// Posts the read of piece `i` of the row at slot `rir` of `group`.
    fn post_piece_read(&self, op: &slots::Op<'_>, group: &Group, i: usize, rir: u64, flush: bool) {
        let node = group.nodes[i];
        op.posting(i, node);
        let e = Entry {
            slab: group.slabs[i],
            len: PAGE_SIZE as u32,
            offset: self.layout.split_offset(rir),
            cookie: op.cookie(i),
            version: 0,
            crc: 0,
            tag: 0,
        };
        if node == slots::NO_NODE || self.transport.post_read(node, e, flush).is_err() {
            op.post_failed(i);
        }
    }

    /// Posts the reads of every piece of the row but `j` whose node is up (a degraded read).
    fn post_other_pieces(
        &self,
        op: &slots::Op<'_>,
        group: &Group,
        j: usize,
        rir: u64,
        flush: bool,
    ) {
        let mut asked = 0;
        for i in (0..self.layout.width).filter(|&i| i != j) {
            let node = group.nodes[i];
            if node != slots::NO_NODE && self.transport.is_up(node) {
                self.post_piece_read(op, group, i, rir, flush);
                asked += 1;
            }
        }
        self.count_reissued(asked);
    }

    /// Decodes piece `j` of a row into `page` from the first k pieces of `mask` (landed in
    /// the side buffer, one version).
    fn decode_piece(&self, op: &mut slots::Op<'_>, mask: u32, j: usize, page: &mut Page) {
        let Some(codec) = &self.codec else { return };
        let (k, width) = (self.layout.k, self.layout.width);
        self.stats.decodes.fetch_add(1, Ordering::Relaxed);
        let side: &[u8] = op.side();
        let mut present: [(usize, &[u8]); MAX_WIDTH] = [(0, &[]); MAX_WIDTH];
        let mut n = 0;
        for i in (0..width).filter(|i| mask & (1 << i) != 0).take(k) {
            present[n] = (i, &side[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            n += 1;
        }
        codec
            .reconstruct(&present[..n], &mut [(j, &mut page[..])])
            .expect("k pieces of one version of a valid layout always decode");
    }

    /// How long a healthy piece read waits for its node before it also reads the row: a
    /// multiple of the recent piece latency over all nodes (what a piece normally takes,
    /// whichever node serves it), at least [`MIN_HEDGE`], at most `straggler_after`.
    fn hedge_delay(&self) -> Duration {
        let recent = self.piece_ns.load(Ordering::Relaxed);
        Duration::from_nanos(recent.saturating_mul(HEDGE_FACTOR))
            .max(MIN_HEDGE)
            .min(self.config.straggler_after)
    }
}

/// Folds `took` into the moving average `avg` (nanoseconds, weight 1/8; 0: no sample yet).
fn fold(avg: &AtomicU64, took: Duration) {
    let x = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    let _ = avg.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
        Some(if a == 0 { x } else { a - a / 8 + x / 8 })
    });
}

/// One look at a piece read's progress `p`: the page's own piece with the version, k pieces
/// of the version once the read is degraded, or a newer version anywhere (the row moved on,
/// unless `want` says newer pieces are stale).
fn look_piece(
    op: &slots::Op<'_>,
    p: Progress,
    (k, width): (usize, usize),
    want: &PieceWant,
    degraded: bool,
) -> Option<Look> {
    let (j, version) = (want.pos, want.version);
    if p.landed & (1 << j) != 0 && op.version_of(j) == version {
        return Some(Look::Piece);
    }
    if want.newer == Newer::Moved
        && (0..width).any(|i| p.landed & (1 << i) != 0 && op.version_of(i) > version)
    {
        return Some(Look::Moved);
    }
    if degraded {
        let mask = op.of_version(p.landed, width, version);
        if mask.count_ones() as usize >= k {
            return Some(Look::Decode(mask));
        }
    }
    None
}
