//! Writing rows: each row's parity encoded into its slot's side buffer, its k + r pieces
//! posted (data straight from the caller's pages, zero pages where the row has none), all the
//! rows of a call posted before any node is flushed, and a row complete only once every piece
//! is acknowledged, lost pieces re-routed with the same version.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{RowWrite, ZERO_PAGE};
use crate::client::layout::MAX_WIDTH;
use crate::client::slots::{self, Progress};
use crate::client::transport::RunSplit;
use crate::client::write::{Stamp, Written};
use crate::client::{Group, IoError, RemoteMemory};
use crate::PAGE_SIZE;

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
        while ops.len() < rows.len().min(crate::client::batch::WINDOW) {
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
