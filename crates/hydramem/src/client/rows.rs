//! Rows of span coding: the unit of a span-coded client's address space, below the page map
//! of [`crate::span`]. A row is k whole pages and r parity pages over them, piece j in slab j
//! of its range's coding group at slot `row in range`; all k + r pieces of a row carry one
//! version, so the rest of the client — versions, re-routing, repair and regeneration, drain —
//! treats a row as it treats a Hydra page whose splits are 4096 bytes long.
//!
//! - **Writing** ([`RemoteMemory::write_rows`]): each row's parity is encoded into its slot's
//!   side buffer and its k + r pieces are posted, the data straight from the caller's pages
//!   (positions without a page carry a zero page, so that every piece of a row has the row's
//!   version and any k of them decode); the rows of a call are all posted before any node is
//!   flushed, so each node gets one frame. A row completes only when every piece is
//!   acknowledged (lost pieces are re-routed with the same version, as for a page write): so
//!   an acknowledged row survives any r lost nodes.
//! - **Reading** ([`RemoteMemory::read_piece`]): one request, for the piece that is the page,
//!   expecting the version the span map recorded. If the node is down or regenerating, the
//!   reply fails or carries another version, or it has not come within the hedge delay (four
//!   times the recent latency of healthy piece reads over all nodes: a slow node must not
//!   raise its own threshold), the read also asks every other piece of the row and decodes
//!   the page from k that carry the version: whichever completes first wins. A piece with a newer version means the row was reused after the caller looked the
//!   page up — the page moved — and the caller looks again ([`PieceRead::Moved`]); if the page is
//!   still there at that version, the row cannot have been reused, the newer pieces are the
//!   remains of a write never acknowledged, and the caller reads again decoding around them
//!   ([`Newer::Stale`]). A read never combines pieces of two versions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::layout::MAX_WIDTH;
use super::slots::{self, Progress};
use super::transport::RunSplit;
use super::wait::{NodeSet, Pacer};
use super::write::{Stamp, Written};
use super::{Group, IoError, Page, RemoteMemory};
use crate::wire::{self, Entry};
use crate::PAGE_SIZE;

/// What stands for a row position that has no page.
static ZERO_PAGE: Page = [0; PAGE_SIZE];

/// The shortest hedge delay: below it, the degraded read's k requests would cost more than
/// the wait they save.
const MIN_HEDGE: Duration = Duration::from_micros(300);
/// The hedge delay in multiples of the recent piece latency over all nodes.
const HEDGE_FACTOR: u64 = 4;

/// One row of a [`RemoteMemory::write_rows`] call.
#[derive(Debug, Clone, Copy)]
pub struct RowWrite<'a> {
    /// The row's index in the row space.
    pub row: u64,
    /// Its data pages by position (at most k; the positions after them hold zero pages).
    pub pages: &'a [&'a Page],
    /// The page number of each of `pages` (as many): stored with its piece as its tag, page
    /// + 1, from which a client that reattaches rebuilds its page map (see [`crate::tags`]).
    pub ids: &'a [u64],
}

/// What the nodes hold for one address range of the row space ([`RemoteMemory::row_stamps`]).
struct RangeStamps {
    /// The range's first row.
    first_row: u64,
    /// Per piece position (k + r): the (version, tag) of each of the range's rows, or `None`
    /// when that piece's node is gone or did not answer.
    pieces: Vec<Option<Vec<(u64, u64)>>>,
}

/// One row as the nodes hold it ([`RemoteMemory::held_rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRow {
    /// The row's index in the row space.
    pub row: u64,
    /// The newest version at least k of its pieces carry: the row as last written whole.
    pub version: u64,
    /// (position, page number) of each data position that holds a page.
    pub pages: Vec<(usize, u64)>,
}

/// How a [`RemoteMemory::read_piece`] ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceRead {
    /// The page is in the caller's buffer (from its piece, or decoded from k others).
    Done {
        /// Whether it was decoded (its node was down, slow or regenerating).
        decoded: bool,
    },
    /// The row holds a newer version than the caller expected: it was reused after the page
    /// moved. Look the page up again.
    Moved,
}

/// A page to read as a piece of a row ([`RemoteMemory::read_pieces`]).
#[derive(Debug, Clone, Copy)]
pub struct PieceWant {
    /// The page's address (for messages).
    pub addr: u64,
    /// Its row.
    pub row: u64,
    /// Its position in the row.
    pub pos: usize,
    /// The version its row was written with.
    pub version: u64,
    /// What a piece of a newer version means.
    pub newer: Newer,
}

/// What a piece read makes of a piece of its row that carries a newer version than the one
/// it wants ([`PieceWant::newer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newer {
    /// The row was reused after the caller looked the page up: the read ends as
    /// [`PieceRead::Moved`] and the caller looks again.
    Moved,
    /// The caller looked again and the page is still in this row at this version, so the row
    /// cannot have been reused: the newer pieces are the remains of a write never acknowledged
    /// (a client that stopped mid-write under the same identity). They are not the page; it
    /// is decoded from k pieces of the wanted version.
    Stale,
}

/// A piece read in flight.
struct PieceOp<'m> {
    op: slots::Op<'m>,
    group: std::sync::Arc<Group>,
    want: PieceWant,
    rir: u64,
    range: usize,
    degraded: bool,
    /// A read alone (not one of a batch, whose pieces are waited for one after another): its
    /// latency is the node's, and goes into the moving averages.
    timed: bool,
    start: Instant,
    posted: Instant,
}

/// What one look at a piece read decided.
enum Look {
    /// The page's own piece arrived with the version.
    Piece,
    /// k pieces of the version arrived (this mask): decode the page.
    Decode(u32),
    /// A piece carries a newer version: the row was reused.
    Moved,
}

impl RemoteMemory {
    /// Writes `rows`, each whole under one version; returns each row's version (in order).
    /// Either every row is acknowledged by all its k + r nodes, or the call fails (rows
    /// acknowledged before the failure are intact, the others may be partly written: the
    /// caller must not point pages at them).
    ///
    /// # Errors
    /// A row that cannot be written (more nodes lost than replacements found, a timeout),
    /// or a row index outside the row space.
    pub fn write_rows(&self, rows: &[RowWrite<'_>]) -> Result<Vec<u64>, IoError> {
        self.write_rows_at(rows, None)
    }

    /// [`RemoteMemory::write_rows`], every row under `version` when given (one the caller
    /// took with [`RemoteMemory::take_version`] before it decided what to write) instead of
    /// versions taken now. A node that holds a newer version of one of those rows' pieces
    /// then fails the call, where [`RemoteMemory::write_rows`] writes the row again past it:
    /// the caller's version must stay the one it took.
    ///
    /// # Errors
    /// As [`RemoteMemory::write_rows`], and a row a node holds newer than `version`.
    pub fn write_rows_at(
        &self,
        rows: &[RowWrite<'_>],
        version: Option<u64>,
    ) -> Result<Vec<u64>, IoError> {
        let k = self.layout.k;
        if let Some(bad) = rows
            .iter()
            .find(|r| r.pages.len() > k || r.ids.len() != r.pages.len())
        {
            return Err(IoError::Store(
                format!(
                    "row {} was given {} pages and {} page numbers, but a span {k}+{} row \
                     holds {k} pages, each with its number",
                    bad.row,
                    bad.pages.len(),
                    bad.ids.len(),
                    self.layout.width - k
                )
                .into(),
            ));
        }
        let start = Instant::now();
        let mut versions = vec![0; rows.len()];
        let mut done = 0;
        while done < rows.len() {
            done +=
                self.write_row_window(&rows[done..], &mut versions[done..], (start, version))?;
        }
        Ok(versions)
    }

    /// Writes the first rows of `rows` that free slots allow (at least one; the first slot
    /// may wait, the others are taken only if free); returns how many, their versions in
    /// `versions`.
    fn write_row_window(
        &self,
        rows: &[RowWrite<'_>],
        versions: &mut [u64],
        (start, fixed): (Instant, Option<u64>),
    ) -> Result<usize, IoError> {
        let l = &self.layout;
        let first = rows[0].row.saturating_mul(PAGE_SIZE as u64);
        let version = match fixed {
            Some(v) => v,
            None => self.next_version(first, 0)?,
        };
        let mut ops = vec![self.slots.acquire_write()];
        while ops.len() < rows.len().min(super::batch::WINDOW) {
            match self.slots.try_acquire_write() {
                Some(op) => ops.push(op),
                None => break,
            }
        }
        let mut prepared: Vec<(slots::Op<'_>, std::sync::Arc<Group>, Stamp)> =
            Vec::with_capacity(ops.len());
        let tags: Vec<[u64; MAX_WIDTH]> = rows
            .iter()
            .take(ops.len())
            .map(|r| self.row_tags(r))
            .collect();
        for (mut op, row) in ops.into_iter().zip(rows) {
            let (range, rir) = self.locate_unit(row.row.saturating_mul(PAGE_SIZE as u64))?;
            let group = match self.ranges[range].load_full() {
                Some(g) => g,
                None => self.map_range(range)?,
            };
            let stamp = Stamp {
                range,
                pir: rir,
                version,
            };
            self.encode_row(&mut op, row);
            prepared.push((op, group, stamp));
        }
        self.post_row_runs(&prepared, rows, &tags);
        let posted = Instant::now();
        let n = prepared.len();
        for (((mut op, group, stamp), (row, v)), tags) in prepared
            .into_iter()
            .zip(rows.iter().zip(versions.iter_mut()))
            .zip(&tags)
        {
            let addr = row.row.saturating_mul(PAGE_SIZE as u64);
            let post = |op: &slots::Op<'_>, group: &Group, j: usize| {
                let data = row_piece(l.k, row, op.write_side(), j);
                self.post_split_write(op, group, (j, tags[j]), data, stamp, true);
            };
            let outcome = self.end_row_write(&mut op, group, addr, (start, posted), &post)?;
            drop(op);
            *v = match outcome {
                Written::Done => stamp.version,
                Written::Stale(held) if fixed.is_some() => {
                    return Err(IoError::Store(
                        format!(
                            "row {} is held at version {held}, newer than the {} it was to be \
                             written with",
                            row.row, stamp.version
                        )
                        .into(),
                    ))
                }
                Written::Stale(held) => self.rewrite_stale_row(row, stamp, held, start)?,
            };
        }
        Ok(n)
    }

    /// Posts every piece of the prepared rows (`prepared[i]` is `rows[i]`'s write, its parity
    /// encoded), then flushes each node once. Consecutive rows of one group are consecutive
    /// slots of each of its slabs: piece j of such a stretch is one run to piece j's node.
    fn post_row_runs(
        &self,
        prepared: &[(slots::Op<'_>, std::sync::Arc<Group>, Stamp)],
        rows: &[RowWrite<'_>],
        tags: &[[u64; MAX_WIDTH]],
    ) {
        let l = &self.layout;
        let mut touched = vec![false; self.transport.nodes()];
        let mut at = 0;
        for stretch in
            prepared.chunk_by(|a, b| std::sync::Arc::ptr_eq(&a.1, &b.1) && b.2.pir == a.2.pir + 1)
        {
            let (group, first) = (&stretch[0].1, stretch[0].2);
            for j in 0..l.width {
                let offset = l.split_offset(first.pir);
                self.post_split_run(
                    stretch,
                    |s| &s.0,
                    j,
                    (group, offset),
                    |node, run| {
                        let mut pieces = stretch
                            .iter()
                            .zip(rows[at..].iter().zip(&tags[at..]))
                            .map(|((op, _, stamp), (row, tags))| {
                                let data = row_piece(l.k, row, op.write_side(), j);
                                RunSplit {
                                    cookie: op.cookie(j),
                                    version: stamp.version,
                                    crc: self.split_crc(data, *stamp, j),
                                    tag: tags[j],
                                    data,
                                }
                            });
                        self.transport.post_write_run(node, run, &mut pieces, false)
                    },
                );
                if let Some(t) = touched.get_mut(group.nodes[j] as usize) {
                    *t = true;
                }
            }
            at += stretch.len();
        }
        for (node, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
            // A node that cannot be flushed fails its queued splits through `node_down`.
            let _ = self.transport.flush(node as u16);
        }
    }

    /// Writes `row` again after a node refused it as stale (it holds version `held`: a clock
    /// that stepped back), past that version, on a fresh slot so that replies to the earlier
    /// attempt cannot count; returns the version that was acknowledged.
    fn rewrite_stale_row(
        &self,
        row: &RowWrite<'_>,
        mut stamp: Stamp,
        mut held: u64,
        start: Instant,
    ) -> Result<u64, IoError> {
        let l = &self.layout;
        let addr = row.row.saturating_mul(PAGE_SIZE as u64);
        let tags = self.row_tags(row);
        loop {
            stamp.version = self.next_version(addr, held)?;
            self.stats.stale_rewrites.fetch_add(1, Ordering::Relaxed);
            let mut op = self.slots.acquire_write();
            let group = match self.ranges[stamp.range].load_full() {
                Some(g) => g,
                None => self.map_range(stamp.range)?,
            };
            self.encode_row(&mut op, row);
            let post = |op: &slots::Op<'_>, group: &Group, j: usize| {
                let data = row_piece(l.k, row, op.write_side(), j);
                self.post_split_write(op, group, (j, tags[j]), data, stamp, true);
            };
            for j in 0..l.width {
                post(&op, &group, j);
            }
            let posted = Instant::now();
            match self.end_row_write(&mut op, group, addr, (start, posted), &post)? {
                Written::Done => return Ok(stamp.version),
                Written::Stale(h) => held = h,
            }
        }
    }

    /// The versions and tags every node holds for the rows of every address range this
    /// identity holds (STAMPS, no data): what a span client that reattaches rebuilds its page
    /// map from. A piece whose node is gone or fails to answer is `None` (its tag can be
    /// decoded from k others).
    fn row_stamps(&self) -> Vec<RangeStamps> {
        let l = &self.layout;
        let mut out = Vec::new();
        for (range, slot) in self.ranges.iter().enumerate() {
            let Some(group) = slot.load_full() else {
                continue;
            };
            let pieces = (0..l.width)
                .map(|j| {
                    let node = group.nodes[j];
                    if node == slots::NO_NODE {
                        return None;
                    }
                    let got = self
                        .transport
                        .stamps(node, group.slabs[j], 0, l.pages_per_range);
                    got.map_err(|e| {
                        tracing::warn!(range, piece = j, error = %e, "reading the stamps of a piece failed; decoding its tags from the others")
                    })
                    .ok()
                })
                .collect();
            out.push(RangeStamps {
                first_row: range as u64 * l.pages_per_range,
                pieces,
            });
        }
        out
    }

    /// Every row of the row space that the nodes hold decodable: for each, the newest version
    /// that at least k of its pieces carry and the pages its data positions name (their
    /// tags, decoded from k pieces where a data piece's node is gone or holds another
    /// version). Rows that some piece holds but that have no such version (a write that
    /// failed part way) are in the second list: they occupy memory and hold no page.
    ///
    /// # Errors
    /// A row whose pieces of one version carry tags that are not one codeword (a node's
    /// metadata is corrupt): the page map cannot be trusted, and reattaching stops.
    pub fn held_rows(&self) -> Result<(Vec<HeldRow>, Vec<u64>), IoError> {
        let (k, width) = (self.layout.k, self.layout.width);
        let mut rows = Vec::new();
        let mut garbage = Vec::new();
        for range in self.row_stamps() {
            for i in 0..self.layout.pages_per_range {
                let row = range.first_row + i;
                let pieces: Vec<Option<(u64, u64)>> = range
                    .pieces
                    .iter()
                    .map(|p| p.as_ref().and_then(|s| s.get(i as usize).copied()))
                    .collect();
                if pieces.iter().all(|p| p.is_none_or(|(v, _)| v == 0)) {
                    continue;
                }
                match resolve_row(self.codec.as_ref(), k, width, &pieces) {
                    Ok(Some((version, pages))) => rows.push(HeldRow {
                        row,
                        version,
                        pages,
                    }),
                    Ok(None) => garbage.push(row),
                    Err(why) => {
                        return Err(IoError::Store(
                            format!(
                                "row {row}: {why}; the nodes' metadata for it is corrupt, so \
                                 the page map cannot be rebuilt (start with a new identity, or \
                                 remove the node that holds the bad piece)"
                            )
                            .into(),
                        ))
                    }
                }
            }
        }
        Ok((rows, garbage))
    }

    /// The tags of row `row`'s k + r pieces (see [`crate::tags`]): page number + 1 at a data
    /// position (0 where the row is padded), the code's parity over those at the r others.
    fn row_tags(&self, row: &RowWrite<'_>) -> [u64; MAX_WIDTH] {
        let (k, width) = (self.layout.k, self.layout.width);
        let mut tags = [0u64; MAX_WIDTH];
        for (t, id) in tags.iter_mut().zip(row.ids) {
            *t = id.saturating_add(1);
        }
        if let Some(codec) = &self.codec {
            let (data, parity) = tags.split_at_mut(k);
            crate::tags::encode(codec, data, &mut parity[..width - k])
                .expect("a span layout's codec takes k tags of 8 bytes");
        }
        tags
    }

    /// Encodes row `row`'s r parity pieces into the side buffer of its write, piece j at
    /// `j × 4096` (where [`row_piece`] finds it).
    fn encode_row(&self, op: &mut slots::Op<'_>, row: &RowWrite<'_>) {
        let Some(codec) = &self.codec else { return };
        let (k, width) = (self.layout.k, self.layout.width);
        let mut data: [&[u8]; MAX_WIDTH] = [&ZERO_PAGE[..]; MAX_WIDTH];
        for (d, p) in data.iter_mut().zip(row.pages) {
            *d = &p[..];
        }
        let side = op.side();
        let (_, parity) = side.split_at_mut(k * PAGE_SIZE);
        let mut out: [&mut [u8]; MAX_WIDTH] = std::array::from_fn(|_| &mut [][..]);
        for (o, chunk) in out.iter_mut().zip(parity.chunks_exact_mut(PAGE_SIZE)) {
            *o = chunk;
        }
        codec
            .encode(&data[..k], &mut out[..width - k])
            .expect("a span layout's codec takes k pages of 4096 bytes");
    }

    /// Waits for a row write's acknowledgements (every piece: no straggler is left behind,
    /// since a degraded read needs k pieces of the row's version from any k + r − 1), closes
    /// it and says how it ended.
    fn end_row_write(
        &self,
        op: &mut slots::Op<'_>,
        group: std::sync::Arc<Group>,
        addr: u64,
        times: (Instant, Instant),
        post: &dyn Fn(&slots::Op<'_>, &Group, usize),
    ) -> Result<Written, IoError> {
        let range = self.locate_unit(addr)?.0;
        let no_lag = |_: &slots::Op<'_>, _: &Group, _: Progress| false;
        let result = self.drive_write(op, group, range, times, post, &no_lag)?;
        self.conclude_write(op, result, ("write of row", addr, range), times.0)
    }

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
                if i >= super::batch::WINDOW {
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

/// The bytes of piece `j` of a row write: its page (a zero page past the row's pages), or a
/// parity piece from the write's side buffer.
fn row_piece<'a>(k: usize, row: &RowWrite<'a>, side: &'a [u8], j: usize) -> &'a [u8] {
    if j < k {
        row.pages.get(j).map_or(&ZERO_PAGE[..], |p| &p[..])
    } else {
        &side[j * PAGE_SIZE..(j + 1) * PAGE_SIZE]
    }
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

/// A row's newest whole version and the (position, page) its data positions name.
type Resolved = (u64, Vec<(usize, u64)>);

/// The newest version at least k of a row's pieces `(version, tag)` carry, with the pages its
/// data positions name (`None`: no version has k pieces). Every piece of that version beyond
/// the k decoded from is checked against them.
fn resolve_row(
    codec: Option<&hydramem_isal::Codec>,
    k: usize,
    width: usize,
    pieces: &[Option<(u64, u64)>],
) -> Result<Option<Resolved>, String> {
    let holding = |v: u64| {
        pieces
            .iter()
            .enumerate()
            .filter_map(move |(j, p)| p.filter(|(pv, _)| *pv == v).map(|(_, t)| (j, t)))
    };
    let newest = pieces
        .iter()
        .flatten()
        .map(|(v, _)| *v)
        .filter(|v| *v != 0 && holding(*v).count() >= k)
        .max();
    let Some(version) = newest else {
        return Ok(None);
    };
    let base: Vec<(usize, u64)> = holding(version).take(k).collect();
    let tag_of = |j: usize| match codec {
        Some(c) => crate::tags::reconstruct(c, base.iter().copied(), j)
            .map_err(|e| format!("decoding piece {j}'s tag: {e}")),
        None => Ok(base[0].1),
    };
    for (j, tag) in holding(version).skip(k) {
        if tag_of(j)? != tag {
            return Err(format!(
                "the tags of version {version}'s pieces disagree (piece {j} of {width})"
            ));
        }
    }
    let mut pages = Vec::new();
    for (j, piece) in pieces.iter().enumerate().take(k) {
        let tag = match *piece {
            Some((v, t)) if v == version => t,
            _ => tag_of(j)?,
        };
        if tag != 0 {
            pages.push((j, tag - 1));
        }
    }
    Ok(Some((version, pages)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's pieces: data tags page + 1 for `pages`, parity from the code, all at `v`.
    fn row(codec: &hydramem_isal::Codec, pages: &[u64], v: u64) -> Vec<Option<(u64, u64)>> {
        let mut tags = [0u64; 6];
        for (t, p) in tags.iter_mut().zip(pages) {
            *t = p + 1;
        }
        let (data, parity) = tags.split_at_mut(4);
        crate::tags::encode(codec, data, parity).unwrap();
        tags.iter().map(|t| Some((v, *t))).collect()
    }

    #[test]
    fn a_row_resolves_to_its_newest_whole_version_with_lost_names_decoded() {
        let codec = hydramem_isal::Codec::new(4, 2).unwrap();
        let c = Some(&codec);
        let old = row(&codec, &[10, 11, 12, 13], 5);
        assert_eq!(
            resolve_row(c, 4, 6, &old),
            Ok(Some((5, vec![(0, 10), (1, 11), (2, 12), (3, 13)])))
        );
        // Two data pieces lost: their names are decoded from the other four.
        let mut lost = old.clone();
        lost[0] = None;
        lost[2] = None;
        assert_eq!(
            resolve_row(c, 4, 6, &lost),
            Ok(resolve_row(c, 4, 6, &old).unwrap())
        );
        // A reuse of the row that reached only three pieces: the old version still has k.
        let new = row(&codec, &[20, 21], 9);
        let mut torn = old.clone();
        torn[..3].clone_from_slice(&new[..3]);
        assert_eq!(
            resolve_row(c, 4, 6, &torn),
            Ok(None),
            "neither version has k pieces"
        );
        torn[..2].clone_from_slice(&old[..2]);
        assert_eq!(resolve_row(c, 4, 6, &torn).unwrap().unwrap().0, 5);
        // A reuse that reached k pieces wins, padding positions name no page.
        let mut reused = new.clone();
        reused[5] = old[5];
        assert_eq!(
            resolve_row(c, 4, 6, &reused),
            Ok(Some((9, vec![(0, 20), (1, 21)])))
        );
        // Tags that are not one codeword are refused, never guessed.
        let mut bad = old.clone();
        bad[1] = Some((5, 99));
        assert!(resolve_row(c, 4, 6, &bad).unwrap_err().contains("disagree"));
        assert_eq!(resolve_row(c, 4, 6, &[None; 6]), Ok(None));
    }
}
