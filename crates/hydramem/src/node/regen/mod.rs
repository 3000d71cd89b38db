//! Background slab regeneration on the node that receives the replacement slab (paper 4.2).
//!
//! The client that lost split `target` of a coding group allocates a replacement slab here and
//! sends REGEN naming the surviving splits. This node then reads the surviving splits of every
//! page straight from their nodes, with the client's identity — k of them, chosen at random
//! among the survivors named, in *runs* of consecutive split slots (chunks of about 1 MiB
//! per source, two in flight per source: [`pipeline`]) — decodes the missing split of a
//! whole stretch of pages with one ISA-L call straight into the slab and stores it with the
//! version of the splits it came from ([`rebuild`]). A thread of its own backs the slab's
//! memory ahead of the landing, so filling a fresh slab neither faults page by page nor
//! spends the regenerating thread's time zeroing pages.
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
//! A regeneration asks between chunks whether anyone still waits for it ([`serve`]'s `gone`:
//! the server peeks the request's connection for its end, and the node may be stopping). If
//! not, it stops there ([`RegenError::Cancelled`]): a process that died mid-regeneration would
//! otherwise have the whole slab pulled for nobody, and its identity held — by the request's
//! connection and by the sources' — from the process that takes its place. The slab keeps
//! what landed, as after a regeneration whose sources failed.
//!
//! A REGEN is checked before anything is allocated or connected ([`serve`]): the caller must
//! own the target slab, the split length must be the slab's and the pages within it, at most
//! k + r sources (the wire already refuses more), and every source is a node *id* that this
//! node looks up in its own membership file (the cluster file it was started with), so a
//! request can neither make the node connect to an address of its choosing nor make it
//! allocate more than what its sources actually send (buffers grow as replies arrive, to at
//! most one chunk's reply per source).

mod pipeline;
mod rebuild;
mod source;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hydramem_isal::Codec;
use rand::seq::SliceRandom;

use super::{Node, Slab};
use crate::cluster::Cluster;
use crate::wire::{ClientId, Regen, RegenSource, Status};
use pipeline::Pipeline;
use rebuild::{Chunk, Rebuild};

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
    /// The requester left (or the node stops) before the end: nobody waits for the result.
    #[error("stopped: the requesting client left or this node stops")]
    Cancelled,
}

impl RegenError {
    /// The status the requester gets.
    fn status(&self) -> Status {
        match self {
            RegenError::Invalid(_) => Status::BadRequest,
            RegenError::NoSuchSlab(_) => Status::NoSuchSlab,
            RegenError::Membership(_) => Status::Forbidden,
            RegenError::Source(_) | RegenError::Cancelled => Status::Internal,
        }
    }
}

/// A REGEN checked against the target slab and the membership.
struct Checked<'a> {
    req: &'a Regen,
    /// The requester's instance: the node greets the sources as it (see [`serve`]).
    instance: u64,
    slab: Arc<Slab>,
    /// The address of every source, in the request's order.
    addrs: Vec<SocketAddr>,
    /// Whether the requester left or the node stops (asked between chunks).
    gone: &'a dyn Fn() -> bool,
}

impl Checked<'_> {
    /// Fails with [`RegenError::Cancelled`] once nobody waits for the result.
    fn still_wanted(&self) -> Result<(), RegenError> {
        if (self.gone)() {
            Err(RegenError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Serves a REGEN from `client`'s `instance`: checks it, rebuilds the slab, and returns the
/// pages rebuilt or the status to refuse it with (the reason is logged). The node reads the
/// sources as that identity and instance, so that they take its connections for the
/// requester's own, not for another process's. `gone` says whether the requester left or the
/// node stops: asked between chunks, it ends the regeneration early (the slab keeps what
/// landed; the client regenerates it again if it still wants it).
pub fn serve(
    node: &Node,
    (client, instance): (&ClientId, u64),
    req: &Regen,
    gone: &dyn Fn() -> bool,
) -> Result<u64, Status> {
    if req.client != *client {
        tracing::warn!("REGEN for another identity refused");
        return Err(Status::NoSuchSlab);
    }
    let checked = check(node, req, instance, gone).map_err(|e| {
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
        Err(RegenError::Cancelled) => {
            metrics::counter!("hydramem_node_regenerations_cancelled_total").increment(1);
            tracing::info!(slab = req.slab, elapsed = ?t0.elapsed(), "regeneration stopped: its requester left or this node stops");
            Err(RegenError::Cancelled.status())
        }
        Err(e) => {
            tracing::warn!(error = %e, slab = req.slab, "regeneration failed");
            Err(e.status())
        }
    }
}

/// Checks a request before anything is allocated or connected (see the module doc).
fn check<'a>(
    node: &Node,
    req: &'a Regen,
    instance: u64,
    gone: &'a dyn Fn() -> bool,
) -> Result<Checked<'a>, RegenError> {
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
                .or_else(|| node.listed_addr(s.node))
                .ok_or_else(|| {
                    RegenError::Invalid(format!(
                        "source node {} is not a member of the cluster in {}",
                        s.node,
                        path.display()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checked {
        req,
        instance,
        slab,
        addrs,
        gone,
    })
}

/// Rebuilds the target slab; returns the number of pages rebuilt. Counted in the node's
/// STATS (regenerations running, pages rebuilt) and metrics while it runs.
fn regenerate(node: &Node, req: &Checked<'_>) -> Result<u64, RegenError> {
    node.regenerating.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("hydramem_node_regenerations_in_progress").increment(1.0);
    let r = with_memory_ready(&req.slab, req.req, || rebuild(node, req));
    node.regenerating.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!("hydramem_node_regenerations_in_progress").decrement(1.0);
    if r.is_ok() {
        metrics::counter!("hydramem_node_regenerations_total").increment(1);
    }
    r
}

/// Runs `f` (the regeneration of `slab`) while a thread of its own backs the slab's memory
/// ahead of it: asking the kernel for the memory of a fresh slab (zeroing it, charging it to
/// the node's memory cgroup) costs about as much as receiving the data, and this way it runs
/// beside the receiving, decoding and storing instead of in the middle of it, without the
/// slab's lock. Best effort: without the thread, the landing backs each chunk itself just
/// before filling it. (Huge pages were tried: with the kernel's default `defrag=madvise` a
/// region advised MADV_HUGEPAGE compacts memory at first touch, and backing a fresh gigabyte
/// took 4 to 7 times as long as in 4 KiB pages on the development machine.)
fn with_memory_ready<R>(slab: &Slab, req: &Regen, f: impl FnOnce() -> R) -> R {
    // Slots per step: 2 MiB of the slab.
    let step = ((2u64 << 20) / u64::from(req.split_len.max(1))).max(1);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let ahead = std::thread::Builder::new()
            .name("hm-regen-mem".into())
            .spawn_scoped(s, || {
                let mut slot = 0;
                while slot < req.pages && !stop.load(Ordering::Relaxed) {
                    slab.prefault(slot, step.min(req.pages - slot));
                    slot += step;
                }
            });
        if let Err(e) = &ahead {
            tracing::debug!(error = %e, "no thread to back a regenerating slab's memory ahead");
        }
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

fn rebuild(node: &Node, checked: &Checked<'_>) -> Result<u64, RegenError> {
    let req = checked.req;
    let named = || req.sources.iter().zip(checked.addrs.iter().copied());
    for (c, addr) in named().filter(|(s, _)| s.copy) {
        checked.still_wanted()?;
        match copy_from(node, checked, c, addr) {
            Ok(pages) => return Ok(pages),
            Err(RegenError::Cancelled) => return Err(RegenError::Cancelled),
            Err(e) => {
                tracing::warn!(error = %e, source = %addr, "copy source failed; trying the next")
            }
        }
    }
    let k = req.k as usize;
    let mut decoding: Vec<(&RegenSource, SocketAddr)> = named().filter(|(s, _)| !s.copy).collect();
    if decoding.len() < k {
        return Err(RegenError::Source(format!(
            "every copy source failed and only {} of the {k} splits needed to decode were named",
            decoding.len()
        )));
    }
    // k sources at random among the survivors: regenerations spread their reads over the
    // group instead of always loading its first k.
    decoding.shuffle(&mut rand::rng());
    let codec = Codec::new(k, req.r as usize).map_err(|e| RegenError::Invalid(e.to_string()))?;
    checked.still_wanted()?;
    let mut p = Pipeline::start(req, checked.instance, node.config(), decoding, k)?;
    let mut rebuild = Rebuild::new(&checked.slab, req);
    let mut done = 0;
    while let Some(c) = p.next_chunk()? {
        checked.still_wanted()?;
        done += rebuild.decode_chunk(&codec, &mut p, c)?;
        chunk_done(node, req, c, k);
    }
    p.all_mut().for_each(|s| s.report_corrupt());
    Ok(done)
}

/// Copies every written split slot from the copy source `c` into the target slab, with its
/// version; returns the splits stored.
fn copy_from(
    node: &Node,
    checked: &Checked<'_>,
    c: &RegenSource,
    addr: SocketAddr,
) -> Result<u64, RegenError> {
    let req = checked.req;
    let mut p = Pipeline::start(req, checked.instance, node.config(), vec![(c, addr)], 1)?;
    let mut rebuild = Rebuild::new(&checked.slab, req);
    let mut done = 0;
    while let Some(c) = p.next_chunk()? {
        checked.still_wanted()?;
        done += rebuild.copy_chunk(&mut p, c)?;
        chunk_done(node, req, c, 1);
    }
    Ok(done)
}

/// Counts a finished chunk, for which `sources` sources each sent its splits.
fn chunk_done(node: &Node, req: &Regen, c: Chunk, sources: usize) {
    let pages = c.n as u64;
    let bytes = pages * u64::from(req.split_len) * sources as u64;
    metrics::counter!("hydramem_node_regen_pages_total").increment(pages);
    metrics::counter!("hydramem_node_regen_bytes_received_total").increment(bytes);
    node.regen_pages.fetch_add(pages, Ordering::Relaxed);
}
