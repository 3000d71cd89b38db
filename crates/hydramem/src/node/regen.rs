//! Background slab regeneration on the node that receives the replacement slab (paper 4.2).
//!
//! The client that lost split `target` of a coding group allocates a replacement slab here and
//! sends REGEN naming the surviving splits. This node then reads the surviving splits of every
//! page straight from their nodes — k of them, with the client's identity, in batches of up to
//! [`BATCH`] pages per vectored read, the k requests in flight at once — decodes the missing
//! split with ISA-L and stores it with the version of the splits it came from.
//!
//! Invariants: a page is rebuilt only from k splits of one version, and stored through the
//! slab's version check, so a page the client writes while regeneration runs (its writes go
//! to this slab already) is never replaced by an older regenerated split: concurrent writes are
//! *applied*, not held, and the slab ends with the newest data. A page whose k splits disagree
//! (a write in flight) is re-read from every source; a page with no k splits of one version is
//! left to the write that is racing it. Pages never written (version 0) are skipped.
//!
//! When the client keeps checksums (REGEN flag), every source split is verified against its
//! checksum before use, and a split that fails counts as missing for that page: the page is
//! decoded from other sources, so a corrupted source is never laundered into a rebuilt split
//! with a fresh, valid checksum. Rebuilt and copied splits are stored with the checksum bound
//! to the target split (see [`crate::integrity`]).
//!
//! A source flagged *copy* holds the very bytes the target must get: the slab being moved off
//! a node that reclaimed it, or another replica under replication. Then the node copies it
//! (one split's bytes per page instead of k) and stores each split with its version, through
//! the same version check; only if every copy source fails does it fall back to decoding.
//!
//! A REGEN is checked before anything is allocated or connected ([`serve`]): the caller must
//! own the target slab, the split length must be the slab's and the pages within it, at most
//! k + r sources (the wire already refuses more), and every source is a node *id* that this
//! node looks up in its own membership file (the cluster file it was started with), so a
//! request can neither make the node connect to an address of its choosing nor make it
//! allocate more than what its sources actually send (buffers grow as replies arrive, at most
//! one frame per source).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hydramem_isal::Codec;

use super::{Node, Slab};
use crate::cluster::Cluster;
use crate::integrity;
use crate::wire::{
    self, ClientId, Entry, FrameBuilder, Header, Hello, Op, Reader, Regen, RegenSource, ReplyEntry,
    Status, HEADER_LEN,
};

/// Pages per vectored read from one source.
pub const BATCH: u64 = 1024;

/// Versions from here up mark a source split that failed its checksum (one per split index);
/// no stored version reaches them (they are above [`wire::MAX_VERSION`]).
const CORRUPT: u64 = u64::MAX - 256;

/// A connection to one surviving split's node.
struct Source {
    split: usize,
    slab: u32,
    stream: TcpStream,
    /// Splits it returned that failed their checksum, reported to it at the end.
    corrupt: u32,
    /// The last reply frame's body (grown to what the source sends, at most one frame).
    reply: Vec<u8>,
}

impl Source {
    fn connect(s: &RegenSource, addr: SocketAddr, req: &Regen) -> Result<Source, String> {
        // A source that does not greet us within a second is skipped (a stalled node must not
        // hold the regeneration up when other splits can serve); data reads get longer.
        let greet = Duration::from_secs(1);
        let mut stream = TcpStream::connect_timeout(&addr, greet)
            .map_err(|e| format!("connecting to node {} at {addr}: {e}", s.node))?;
        stream
            .set_read_timeout(Some(greet))
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut hello = Vec::new();
        Hello {
            client: req.client,
            flags: 0,
        }
        .put(&mut hello);
        crate::rpc::request(&mut stream, Op::Hello, &hello)
            .map_err(|e| format!("node {}: {e}", s.node))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        Ok(Source {
            split: s.split as usize,
            slab: s.slab,
            stream,
            corrupt: 0,
            reply: Vec::new(),
        })
    }

    /// Sends the READV for split slots `first..first + n` (the reply is read by `receive`), so
    /// that the requests to all sources are in flight at once.
    fn ask(&mut self, first: u64, n: u64, len: usize) -> Result<(), String> {
        let mut body = Vec::with_capacity(4 + n as usize * wire::ENTRY_LEN);
        body.extend_from_slice(&(n as u32).to_le_bytes());
        for p in 0..n {
            Entry {
                slab: self.slab,
                len: len as u32,
                offset: (first + p) * len as u64,
                cookie: p,
                version: 0,
                crc: 0,
            }
            .put(&mut body);
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
        let fb = FrameBuilder::begin(&mut frame, Op::ReadV, false, Status::Ok, first);
        frame.extend_from_slice(&body);
        fb.finish(&mut frame).map_err(|e| e.to_string())?;
        self.stream.write_all(&frame).map_err(|e| e.to_string())
    }

    /// Reads the reply to `ask`: the slots' versions and data into `out`. With `range` (the
    /// client keeps checksums), a split whose checksum fails gets a version of its own above
    /// [`CORRUPT`], which no other source shares, so it is never combined.
    fn receive(
        &mut self,
        first: u64,
        n: u64,
        len: usize,
        range: Option<u64>,
        versions: &mut [u64],
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let mut hb = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut hb).map_err(|e| e.to_string())?;
        let h = Header::parse(&hb).map_err(|e| e.to_string())?;
        if !h.reply || h.op != Op::ReadV || h.id != first {
            return Err(format!(
                "source split {} answered {:?} #{} to READV #{first}",
                self.split, h.op, h.id
            ));
        }
        self.reply.resize(h.body_len as usize, 0);
        self.stream
            .read_exact(&mut self.reply)
            .map_err(|e| e.to_string())?;
        let mut r = Reader::new(&self.reply);
        let count = r.count().map_err(|e| e.to_string())?;
        if count as u64 != n || h.status != Status::Ok {
            return Err(format!(
                "source split {} answered {count} of {n} entries ({})",
                self.split, h.status
            ));
        }
        for _ in 0..n {
            let e = ReplyEntry::get_read(&mut r).map_err(|e| e.to_string())?;
            if e.status != Status::Ok || e.len as usize != len || e.cookie >= n {
                return Err(format!(
                    "source split {} refused slot {}: {}",
                    self.split,
                    first + e.cookie,
                    e.status
                ));
            }
            let p = e.cookie as usize;
            let data = r.bytes(len).map_err(|e| e.to_string())?;
            let slot = first + e.cookie;
            let end = (p + 1) * len;
            if out.len() < end {
                // Grown as data arrives: at most the batch this source was asked for.
                out.resize(end, 0);
            }
            versions[p] = match range {
                Some(range)
                    if !integrity::verify(data, e.crc, range, slot, self.split, e.version) =>
                {
                    metrics::counter!("hydramem_node_regen_corrupt_splits_total").increment(1);
                    self.corrupt += 1;
                    tracing::warn!(
                        split = self.split,
                        slot,
                        "regeneration source returned a split that fails its checksum; \
                         decoding that page from the other sources"
                    );
                    CORRUPT + self.split as u64
                }
                _ => e.version,
            };
            out[p * len..(p + 1) * len].copy_from_slice(data);
        }
        Ok(())
    }
}

/// Errors of a regeneration.
#[derive(Debug, thiserror::Error)]
pub enum RegenError {
    /// The request cannot work.
    #[error("invalid regeneration request: {0}")]
    Invalid(String),
    /// The target slab is not the caller's.
    #[error("no slab {0} of this client on this node")]
    NoSuchSlab(u32),
    /// The sources cannot be looked up.
    #[error("{0}")]
    Membership(String),
    /// A source failed.
    #[error("regeneration source failed: {0}")]
    Source(String),
}

impl RegenError {
    /// The status the requester gets.
    fn status(&self) -> Status {
        match self {
            RegenError::Invalid(_) => Status::BadRequest,
            RegenError::NoSuchSlab(_) => Status::NoSuchSlab,
            RegenError::Membership(_) => Status::Forbidden,
            RegenError::Source(_) => Status::Internal,
        }
    }
}

/// A REGEN checked against the target slab and the membership.
struct Checked<'a> {
    req: &'a Regen,
    slab: Arc<Slab>,
    /// The address of every source, in the request's order.
    addrs: Vec<SocketAddr>,
}

/// Serves a REGEN from `client`: checks it, rebuilds the slab, and returns the pages rebuilt
/// or the status to refuse it with (the reason is logged).
pub fn serve(node: &Node, client: &ClientId, req: &Regen) -> Result<u64, Status> {
    if req.client != *client {
        tracing::warn!("REGEN for another identity refused");
        return Err(Status::NoSuchSlab);
    }
    let checked = check(node, req).map_err(|e| {
        tracing::warn!(error = %e, slab = req.slab, "REGEN refused");
        e.status()
    })?;
    tracing::info!(
        slab = req.slab,
        split = req.target,
        pages = req.pages,
        "regenerating a slab"
    );
    let t0 = std::time::Instant::now();
    match regenerate(node, &checked) {
        Ok(pages) => {
            tracing::info!(slab = req.slab, pages, elapsed = ?t0.elapsed(), "slab regenerated");
            Ok(pages)
        }
        Err(e) => {
            tracing::warn!(error = %e, slab = req.slab, "regeneration failed");
            Err(e.status())
        }
    }
}

/// Checks a request before anything is allocated or connected (see the module doc).
fn check<'a>(node: &Node, req: &'a Regen) -> Result<Checked<'a>, RegenError> {
    let bad = |m: String| RegenError::Invalid(m);
    req.check_shape().map_err(|e| bad(e.to_string()))?;
    if req.sources.is_empty() {
        return Err(bad("no source named".into()));
    }
    let target = req.target as usize;
    let mut seen = 0u64;
    for s in &req.sources {
        // `split < k + r <= 32` (the shape check above).
        let bit = 1u64 << s.split;
        if s.copy {
            continue;
        }
        if s.split as usize == target || seen & bit != 0 {
            return Err(bad(
                "decoding sources must be distinct splits of the group, not the target".into(),
            ));
        }
        seen |= bit;
    }
    let slab = node
        .slab(&req.client, req.slab)
        .map_err(|_| RegenError::NoSuchSlab(req.slab))?;
    if u64::from(req.split_len) != slab.split_len() {
        return Err(bad(format!(
            "split length {} is not the slab's ({})",
            req.split_len,
            slab.split_len()
        )));
    }
    if req.pages > slab.slots() {
        return Err(bad(format!(
            "{} pages asked, the slab holds {}",
            req.pages,
            slab.slots()
        )));
    }
    let Some(path) = &node.config().membership else {
        return Err(RegenError::Membership(
            "this node was started without a cluster file, so it cannot look up regeneration              sources; restart it with --cluster FILE"
                .into(),
        ));
    };
    let cluster = Cluster::load(path)
        .map_err(|e| RegenError::Membership(format!("cannot look up regeneration sources: {e}")))?;
    let addrs = req
        .sources
        .iter()
        .map(|s| {
            cluster
                .nodes
                .iter()
                .find(|n| n.id == s.node)
                .map(|n| n.addr)
                .ok_or_else(|| {
                    RegenError::Invalid(format!(
                        "source node {} is not a member of the cluster in {}",
                        s.node,
                        path.display()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checked { req, slab, addrs })
}

/// Rebuilds the target slab; returns the number of pages rebuilt. Counted in the node's
/// STATS (regenerations running, pages rebuilt) and metrics while it runs.
fn regenerate(node: &Node, req: &Checked<'_>) -> Result<u64, RegenError> {
    node.regenerating.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("hydramem_node_regenerations_in_progress").increment(1.0);
    let r = rebuild(node, req);
    node.regenerating.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!("hydramem_node_regenerations_in_progress").decrement(1.0);
    if r.is_ok() {
        metrics::counter!("hydramem_node_regenerations_total").increment(1);
    }
    r
}

fn rebuild(node: &Node, checked: &Checked<'_>) -> Result<u64, RegenError> {
    let req = checked.req;
    let slab = &checked.slab;
    let (k, r, target) = (req.k as usize, req.r as usize, req.target as usize);
    let len = req.split_len as usize;
    let sources_with_addr = || req.sources.iter().zip(checked.addrs.iter().copied());
    for (c, addr) in sources_with_addr().filter(|(s, _)| s.copy) {
        match copy_from(node, slab, c, addr, req) {
            Ok(pages) => return Ok(pages),
            Err(e) => {
                tracing::warn!(error = %e, source = %addr, "copy source failed; trying the next")
            }
        }
    }
    let decoding = req.sources.iter().filter(|s| !s.copy).count();
    if decoding < k {
        return Err(RegenError::Source(format!(
            "every copy source failed and only {decoding} of the {k} splits needed to decode \
             were named"
        )));
    }
    let codec = Codec::new(k, r).map_err(|e| RegenError::Invalid(e.to_string()))?;
    let mut sources = Vec::new();
    for (s, addr) in sources_with_addr().filter(|(s, _)| !s.copy) {
        match Source::connect(s, addr, req) {
            Ok(src) => sources.push(src),
            Err(e) => {
                tracing::warn!(error = %e, "regeneration source unreachable; using the others")
            }
        }
    }
    if sources.len() < k {
        return Err(RegenError::Source(format!(
            "only {} of the {k} sources needed are reachable",
            sources.len()
        )));
    }
    // Batches of up to BATCH pages whose replies stay well inside one frame.
    let batch = batch_for(len);
    let b = batch as usize;
    let check = req.checksums.then_some(req.range);
    let mut versions = vec![vec![0u64; b]; sources.len()];
    // Grown by `receive` as data arrives.
    let mut data = vec![Vec::new(); sources.len()];
    let mut rebuilt = vec![0u8; len];
    let mut done = 0u64;
    let mut first = 0u64;
    // Ask all k sources first, then collect, so that their round trips overlap; and ask for
    // the next batch before decoding this one, so that the sources read and send it meanwhile.
    let ask_k = |sources: &mut Vec<Source>, first: u64| -> Result<(), RegenError> {
        if first < req.pages {
            let n = batch.min(req.pages - first);
            for s in sources.iter_mut().take(k) {
                s.ask(first, n, len).map_err(RegenError::Source)?;
            }
        }
        Ok(())
    };
    ask_k(&mut sources, 0)?;
    while first < req.pages {
        let n = batch.min(req.pages - first);
        for (i, s) in sources.iter_mut().enumerate().take(k) {
            s.receive(first, n, len, check, &mut versions[i], &mut data[i])
                .map_err(RegenError::Source)?;
        }
        ask_k(&mut sources, first + n)?;
        let mut fetched_rest = false;
        let mut chosen = [0usize; 64];
        for p in 0..n as usize {
            let v = versions[0][p];
            let agree = v < CORRUPT && (0..k).all(|i| versions[i][p] == v);
            if agree {
                if v == 0 {
                    continue; // never written
                }
                for (c, i) in chosen.iter_mut().zip(0..k) {
                    *c = i;
                }
            } else {
                // A write is racing: look at every source for k splits of one version.
                if !fetched_rest {
                    // Like the first k: all requests in flight, then the replies.
                    for s in sources.iter_mut().skip(k) {
                        s.ask(first, n, len).map_err(RegenError::Source)?;
                    }
                    for (i, s) in sources.iter_mut().enumerate().skip(k) {
                        s.receive(first, n, len, check, &mut versions[i], &mut data[i])
                            .map_err(RegenError::Source)?;
                    }
                    fetched_rest = true;
                }
                let newest = (0..sources.len())
                    .map(|i| versions[i][p])
                    .filter(|cand| {
                        *cand < CORRUPT
                            && (0..sources.len())
                                .filter(|i| versions[*i][p] == *cand)
                                .count()
                                >= k
                    })
                    .max();
                match newest {
                    Some(v) if v != 0 => {
                        let holders = (0..sources.len()).filter(|i| versions[*i][p] == v);
                        for (c, i) in chosen.iter_mut().zip(holders.take(k)) {
                            *c = i;
                        }
                    }
                    _ => continue,
                }
            }
            let version = versions[chosen[0]][p];
            let mut present: [(usize, &[u8]); 64] = [(0, &[]); 64];
            for (slot, &i) in present.iter_mut().zip(&chosen[..k]) {
                *slot = (sources[i].split, &data[i][p * len..(p + 1) * len]);
            }
            codec
                .reconstruct(&present[..k], &mut [(target, &mut rebuilt[..])])
                .map_err(|e| RegenError::Invalid(e.to_string()))?;
            let slot = first + p as u64;
            let crc = check.map_or(0, |range| {
                integrity::split_crc(&rebuilt, range, slot, target, version)
            });
            store(slab, slot, &rebuilt, version, crc)?;
            done += 1;
        }
        batch_done(node, n, n * len as u64 * k as u64);
        first += n;
    }
    report_corrupt(&mut sources);
    Ok(done)
}

/// Tells every source that returned splits failing their checksum how many, as the client
/// does after its reads (CORRUPT, on the source's connection, which speaks for the client), so
/// that the source's status and metrics count corruption found by regeneration too. Best
/// effort: a report that fails is logged, the regeneration stands.
fn report_corrupt(sources: &mut [Source]) {
    for s in sources.iter_mut().filter(|s| s.corrupt > 0) {
        let mut body = Vec::new();
        wire::put_corrupt(
            &mut body,
            &[wire::CorruptReport {
                slab: s.slab,
                splits: s.corrupt,
                cause: wire::CorruptCause::Checksum,
            }],
        );
        if let Err(e) = crate::rpc::request(&mut s.stream, Op::Corrupt, &body) {
            tracing::warn!(split = s.split, error = %e, "could not report corrupted splits to a regeneration source");
        }
    }
}

/// Pages per batch so that a reply of `len`-byte splits stays well inside one frame.
fn batch_for(len: usize) -> u64 {
    BATCH.min((wire::MAX_BODY / 2 / (len + wire::READ_REPLY_LEN)).max(1) as u64)
}

/// Copies every written split slot from a copy source into `slab`, with its version.
fn copy_from(
    node: &Node,
    slab: &Slab,
    c: &RegenSource,
    addr: SocketAddr,
    req: &Regen,
) -> Result<u64, RegenError> {
    let len = req.split_len as usize;
    let mut src = Source::connect(c, addr, req).map_err(RegenError::Source)?;
    let batch = batch_for(len);
    let check = req.checksums.then_some(req.range);
    let mut versions = vec![0u64; batch as usize];
    let mut data = Vec::new();
    let (mut first, mut done) = (0u64, 0u64);
    if req.pages > 0 {
        src.ask(0, batch.min(req.pages), len)
            .map_err(RegenError::Source)?;
    }
    while first < req.pages {
        let n = batch.min(req.pages - first);
        src.receive(first, n, len, check, &mut versions, &mut data)
            .map_err(RegenError::Source)?;
        // The next batch is read and sent while this one is stored.
        if first + n < req.pages {
            src.ask(first + n, batch.min(req.pages - first - n), len)
                .map_err(RegenError::Source)?;
        }
        for p in 0..n as usize {
            let (slot, version) = (first + p as u64, versions[p]);
            if version == 0 {
                continue;
            }
            if version >= CORRUPT {
                // The copy is not trustworthy: decode the whole slab from the group instead.
                return Err(RegenError::Source(format!(
                    "copy source split {} failed its checksum at slot {slot}",
                    c.split
                )));
            }
            let split = &data[p * len..(p + 1) * len];
            let crc = check.map_or(0, |range| {
                integrity::split_crc(split, range, slot, req.target as usize, version)
            });
            store(slab, slot, split, version, crc)?;
            done += 1;
        }
        batch_done(node, n, n * len as u64);
        first += n;
    }
    Ok(done)
}

/// Stores a rebuilt or copied split through the version check (a newer split the client wrote
/// meanwhile stays).
fn store(slab: &Slab, slot: u64, data: &[u8], version: u64, crc: u32) -> Result<(), RegenError> {
    match slab.store(slot * data.len() as u64, data, version, crc) {
        Ok(()) | Err(Status::Stale) => Ok(()),
        Err(st) => Err(RegenError::Invalid(format!("storing slot {slot}: {st}"))),
    }
}

/// Counts a finished batch of `pages` slots for which `bytes` were received.
fn batch_done(node: &Node, pages: u64, bytes: u64) {
    metrics::counter!("hydramem_node_regen_pages_total").increment(pages);
    metrics::counter!("hydramem_node_regen_bytes_received_total").increment(bytes);
    node.regen_pages.fetch_add(pages, Ordering::Relaxed);
}
