//! The write path (paper 4.1, asynchronously encoded write): post the k data splits straight
//! from the caller's page, encode the r parity splits into the slot's side buffer and post them,
//! then wait for the acknowledgements the mode requires. Every write carries a version from the
//! client's clock; a node that holds a newer one refuses (`Stale`) and the page is written again,
//! whole, past it — a `Stale` reply is never an acknowledgement.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hydramem_isal::Codec;

use super::layout::MAX_WIDTH;
use super::repair::MoveReason;
use super::slots::{self, Progress};
use super::{ClientError, Group, IoError, Layout, Page, RemoteMemory};
use crate::integrity;
use crate::wire::{self, Entry};

/// Encodes the r parity splits of a page into the first r splits of `parity`: the data splits
/// are the page's whole splits, then the padded `tail` splits (when k does not divide 4096).
pub(super) fn encode_parity(
    codec: &Codec,
    l: &Layout,
    page: &[u8],
    tail: &[u8],
    parity: &mut [u8],
) {
    let s = l.split_len;
    let mut data: [&[u8]; MAX_WIDTH] = [&[]; MAX_WIDTH];
    for (j, d) in data.iter_mut().enumerate().take(l.full_data) {
        *d = &page[j * s..(j + 1) * s];
    }
    for (t, chunk) in tail.chunks_exact(s).enumerate() {
        data[l.full_data + t] = chunk;
    }
    let r = l.width - l.k;
    let mut out: [&mut [u8]; MAX_WIDTH] = std::array::from_fn(|_| &mut [][..]);
    for (p, chunk) in parity.chunks_exact_mut(s).take(r).enumerate() {
        out[p] = chunk;
    }
    codec
        .encode(&data[..l.k], &mut out[..r])
        .expect("layout and codec agree on k, r and split length");
}

/// Fills a coded write's side buffer: the padded tail splits (when k does not divide 4096),
/// then the r parity splits.
pub(super) fn encode_side(codec: &Codec, l: &Layout, op: &mut slots::Op<'_>, page: &Page) {
    let s = l.split_len;
    let side = op.side();
    let tail = &page[l.full_data * s..];
    let ntail = l.k - l.full_data;
    side[..ntail * s].fill(0);
    side[..tail.len()].copy_from_slice(tail);
    let (tail_buf, parity_buf) = side.split_at_mut(ntail * s);
    encode_parity(codec, l, page, tail_buf, parity_buf);
}

/// The bytes of split `j` of a page write: in the page (whole data splits), or in the write's
/// side buffer (padded tail splits and parity); a replica is the whole page.
pub(super) fn split_of<'a>(l: &Layout, page: &'a Page, side: &'a [u8], j: usize) -> &'a [u8] {
    let s = l.split_len;
    if !l.coded() {
        &page[..]
    } else if j < l.full_data {
        &page[j * s..(j + 1) * s]
    } else {
        &side[(j - l.full_data) * s..(j - l.full_data + 1) * s]
    }
}

/// Which page a split write belongs to and at what version: what its checksum binds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stamp {
    /// The page's address range.
    pub(super) range: usize,
    /// The page's index in the range.
    pub(super) pir: u64,
    /// The version being written.
    pub(super) version: u64,
}

/// The outcome of one write attempt.
pub(super) enum Written {
    /// Acknowledged as the mode requires.
    Done,
    /// A node holds a newer version of a split (this one): write again past it.
    Stale(u64),
}

/// The wall clock in nanoseconds since the epoch (0 before it).
pub(super) fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Says so when the versions an identity holds are ahead of this machine's clock: new writes
/// continue from them (versions must only grow), which is right, but worth an operator's look.
pub(super) fn seed_clock_note(held: u64) {
    let now = wall_nanos();
    if held > now.saturating_add(60_000_000_000) {
        tracing::warn!(
            ahead = ?Duration::from_nanos(held - now),
            "this identity's stored page versions are ahead of this machine's clock (written \
             by a machine with a faster clock, or before the clock stepped back): new writes \
             continue from them"
        );
    }
}

impl RemoteMemory {
    /// A fresh page version above `past`: a hybrid logical clock, the wall clock in
    /// nanoseconds unless that would not exceed the last version handed out (or `past`).
    /// Versions only grow, across threads and across restarts of a client: a client that
    /// reattaches to an identity starts from the newest version the nodes hold for it
    /// ([`RemoteMemory::connect`]), and a node that refuses a write as stale reports the
    /// version to pass. Fails for page `addr` when no valid version is left.
    pub(super) fn next_version(&self, addr: u64, past: u64) -> Result<u64, IoError> {
        let now = wall_nanos();
        let mut next = 0;
        let _ = self
            .clock
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                next = now.max(last.max(past).saturating_add(1));
                (next <= wire::MAX_VERSION).then_some(next)
            });
        if next > wire::MAX_VERSION {
            return Err(IoError::VersionsExhausted {
                addr,
                held: past.max(self.clock.load(Ordering::SeqCst)),
                max: wire::MAX_VERSION,
            });
        }
        Ok(next)
    }

    /// A fresh version (see [`RemoteMemory::next_version`]) for a caller that must know it
    /// before it writes ([`RemoteMemory::write_rows_at`]).
    ///
    /// # Errors
    /// No valid version is left.
    pub fn take_version(&self) -> Result<u64, IoError> {
        self.next_version(0, 0)
    }

    /// Writes one page. Returns once the mode's acknowledgements are in.
    ///
    /// A node that refuses a split as stale holds a newer version of it than this client's
    /// clock gave (a clock that stepped back, another machine that wrote with this identity):
    /// then the page is written again, whole, with a version past the one the node reported,
    /// so a write is acknowledged only once its bytes are what the nodes hold.
    pub fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        if self.config.ablation.bounce {
            let bounce: Page = *page;
            return self.write_page_in_place(addr, &bounce);
        }
        self.write_page_in_place(addr, page)
    }

    fn write_page_in_place(&self, addr: u64, page: &Page) -> Result<(), IoError> {
        let (range, pir) = self.locate(addr)?;
        let start = Instant::now();
        let mut version = self.next_version(addr, 0)?;
        loop {
            match self.write_version(addr, page, (range, pir), version, start)? {
                Written::Done => return Ok(()),
                Written::Stale(held) => {
                    self.stats.stale_rewrites.fetch_add(1, Ordering::Relaxed);
                    self.metrics.stale_rewrites.increment(1);
                    tracing::debug!(
                        addr,
                        version,
                        held,
                        "a node holds a newer version of the page: writing it again past it"
                    );
                    version = self.next_version(addr, held)?;
                }
            }
        }
    }

    /// The checksum of split `j` of a page write (its bytes `data`), bound to the page and
    /// version; 0 when the client keeps no checksums.
    pub(super) fn split_crc(&self, data: &[u8], stamp: Stamp, j: usize) -> u32 {
        if self.config.checksums {
            integrity::split_crc(data, stamp.range as u64, stamp.pir, j, stamp.version)
        } else {
            0
        }
    }

    /// Posts split `j` of a page write (its bytes `data`, tagged `tag`: 0 for a Hydra page,
    /// see [`crate::tags`]) for page `pir` of `range` to the group's node for it; a split that
    /// cannot be posted is marked failed at once.
    pub(super) fn post_split_write(
        &self,
        op: &slots::Op<'_>,
        group: &Group,
        (j, tag): (usize, u64),
        data: &[u8],
        stamp: Stamp,
        flush: bool,
    ) {
        let l = &self.layout;
        let node = group.nodes[j];
        op.posting(j, node);
        let e = Entry {
            slab: group.slabs[j],
            len: l.split_len as u32,
            offset: l.split_offset(stamp.pir),
            cookie: op.cookie(j),
            version: stamp.version,
            crc: self.split_crc(data, stamp, j),
            tag,
        };
        if node == slots::NO_NODE || self.transport.post_write(node, e, data, flush).is_err() {
            op.post_failed(j);
        }
    }

    /// Posts every split of `page` at `version` (paper 4.1.1, asynchronously encoded write):
    /// the data splits straight from the caller's page, then the padded tail splits (only
    /// when k does not divide 4096) and the parity, encoded into the slot's side buffer while
    /// the data splits are already on their way. With `flush == false` the requests wait in
    /// the transport's per-node queues for the caller to flush them.
    pub(super) fn post_page_write(
        &self,
        op: &mut slots::Op<'_>,
        group: &Group,
        page: &Page,
        stamp: Stamp,
        flush: bool,
    ) {
        let l = &self.layout;
        let s = l.split_len;
        let Some(codec) = &self.codec else {
            for j in 0..l.width {
                self.post_split_write(op, group, (j, 0), &page[..], stamp, flush);
            }
            return;
        };
        if self.config.ablation.encode_first {
            encode_side(codec, l, op, page);
        }
        for j in 0..l.full_data {
            self.post_split_write(op, group, (j, 0), &page[j * s..(j + 1) * s], stamp, flush);
        }
        if !self.config.ablation.encode_first {
            encode_side(codec, l, op, page);
        }
        for j in l.full_data..l.width {
            let data = split_of(l, page, op.write_side(), j);
            self.post_split_write(op, group, (j, 0), data, stamp, flush);
        }
    }

    /// One attempt of [`RemoteMemory::write_page`] at `version`, on a slot of its own (so
    /// replies to an earlier attempt cannot count for this one).
    pub(super) fn write_version(
        &self,
        addr: u64,
        page: &Page,
        (range, pir): (usize, u64),
        version: u64,
        start: Instant,
    ) -> Result<Written, IoError> {
        let group = match self.ranges[range].load_full() {
            Some(g) => g,
            None => self.map_range(range)?,
        };
        let l = &self.layout;
        let stamp = Stamp {
            range,
            pir,
            version,
        };
        let mut op = self.slots.acquire_write();
        self.post_page_write(&mut op, &group, page, stamp, true);
        // The deadline and the straggler clock run from `start`, but posting the splits can
        // take longer than the poll interval on its own: poll for the replies from here, or
        // nearly every write would park right after posting and pay a wake-up.
        let posted = Instant::now();
        let post = |op: &slots::Op<'_>, group: &Group, j: usize| {
            let data = split_of(l, page, op.write_side(), j);
            self.post_split_write(op, group, (j, 0), data, stamp, true);
        };
        let lag = |op: &slots::Op<'_>, group: &Group, p: Progress| {
            self.leave_behind(op, group, page, stamp, (p, start))
        };
        let result = self.drive_write(&op, group, range, (start, posted), &post, &lag)?;
        self.conclude_write(&mut op, result, ("write", addr, range), start)
    }

    /// Ends a write attempt that [`RemoteMemory::drive_write`] decided (`result`; `None`: it
    /// timed out): closes its slot, moves the clock past a version a node refused it for
    /// (`Stale`, to be written again) and counts it; an error names `what` ("write", or
    /// "write of row"), the unit's address and its range.
    pub(super) fn conclude_write(
        &self,
        op: &mut slots::Op<'_>,
        result: Option<Result<(), ()>>,
        (what, addr, range): (&'static str, u64, usize),
        start: Instant,
    ) -> Result<Written, IoError> {
        let p = op.close();
        let held = op.stale_version();
        if held != 0 {
            // Versions only grow: whatever this attempt's outcome, the clock moves past it.
            self.clock.fetch_max(held, Ordering::SeqCst);
            if !matches!(result, Some(Ok(()))) && start.elapsed() < self.config.op_timeout {
                return Ok(Written::Stale(held));
            }
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .write_seconds
            .record(start.elapsed().as_secs_f64());
        if !matches!(result, Some(Ok(()))) {
            self.metrics.write_errors.increment(1);
        }
        match result {
            Some(Ok(())) => Ok(Written::Done),
            Some(Err(())) => Err(IoError::Unavailable {
                what,
                addr,
                range: range as u64,
                needed: self.layout.write_need,
                got: p.landed.count_ones() as usize,
                nodes: self.describe(op, p.failed),
            }),
            None => Err(IoError::Timeout {
                what,
                addr,
                range: range as u64,
                waited: start.elapsed(),
                nodes: self.describe(op, p.outstanding()),
            }),
        }
    }

    /// Waits for a write attempt's acknowledgements (posted at `posted`, the operation started
    /// at `start`) and re-routes, with the same version, the splits whose node was lost and
    /// those whose slab moved meanwhile: what every write of a unit — a page, or a span row —
    /// does once its splits are posted. `post` posts split `j` of the unit to a group; `lag`
    /// may complete a write still waiting for a straggler (and says whether it did). Returns
    /// the decision (`None`: timed out) or the error of a failed re-route.
    pub(super) fn drive_write(
        &self,
        op: &slots::Op<'_>,
        mut group: Arc<Group>,
        range: usize,
        (start, posted): (Instant, Instant),
        post: &dyn Fn(&slots::Op<'_>, &Group, usize),
        lag: &dyn Fn(&slots::Op<'_>, &Group, Progress) -> bool,
    ) -> Result<Option<Result<(), ()>>, IoError> {
        let mut reroutes = 0;
        let l = &self.layout;
        let result = loop {
            let result = self.wait_polling_from(op, start, posted, |p| {
                let acked = p.landed.count_ones() as usize;
                if acked >= l.write_need {
                    Some(Ok(()))
                } else if acked + p.outstanding().count_ones() as usize >= l.write_need {
                    // A straggler: complete without it once it is late enough.
                    lag(op, &group, p).then_some(Ok(()))
                } else {
                    Some(Err(()))
                }
            });
            if result == Some(Ok(())) && reroutes < 2 * l.width {
                // A move may have switched splits of this range to new slabs while the write
                // was in flight, and its copy may have read the old slab before this split
                // landed there: send such splits to their new slabs too (same version).
                if let Some(cur) = self.ranges[range].load_full() {
                    if !Arc::ptr_eq(&cur, &group) {
                        let mut moved = 0;
                        for j in 0..l.width {
                            if cur.nodes[j] != group.nodes[j] || cur.slabs[j] != group.slabs[j] {
                                op.retry(j);
                                post(op, &cur, j);
                                moved += 1;
                            }
                        }
                        group = cur;
                        reroutes += moved.max(1);
                        continue;
                    }
                }
            }
            if result != Some(Err(())) || reroutes >= 2 * l.width {
                break result;
            }
            // Splits whose node failed, or lost the slab, move to a replacement slab chosen by
            // placement; the write then goes on with the same version (paper 4.1.1).
            let p = op.progress();
            let mut moved = 0;
            for j in 0..l.width {
                if p.failed & (1 << j) == 0 {
                    continue;
                }
                let node = group.nodes[j];
                // Per split: one split's node lost must not condemn another that only
                // failed (a concurrent write's `Stale`, say) on a healthy node, whose slab
                // the remap would give back with its data.
                let lost =
                    node == slots::NO_NODE || !self.transport.is_up(node) || op.split_gone(j);
                if !lost {
                    continue;
                }
                // No replacement node may be up right now (one is reconnecting, say): keep
                // trying until the operation's deadline rather than fail at once.
                group = loop {
                    match self.remap(range, j, node, MoveReason::Lost) {
                        Ok(g) => break g,
                        Err(ClientError::Placement { .. })
                            if start.elapsed() + Duration::from_millis(50)
                                < self.config.op_timeout =>
                        {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                op.retry(j);
                post(op, &group, j);
                moved += 1;
                reroutes += 1;
            }
            if moved == 0 {
                break result;
            }
            self.stats
                .rerouted
                .fetch_add(moved as u64, Ordering::Relaxed);
            self.metrics.rerouted.increment(moved as u64);
        };
        Ok(result)
    }
}
