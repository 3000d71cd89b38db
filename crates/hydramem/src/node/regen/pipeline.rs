//! The sources of one regeneration, read chunk by chunk with several chunks in flight.
//!
//! The slab's slots are cut into chunks of about [`CHUNK_BYTES`] of splits (one READV run
//! each). Every *active* source is asked the same chunks in the same order and [`DEPTH`]
//! chunks ahead of the one being landed, so that the sources read and send while this node
//! decodes and stores. The active sources are the first that connect among the named ones in
//! the order given (random, for decoding: the load of regenerations spreads over all
//! survivors instead of always the first k). An active source that fails is replaced by the
//! next named one, which is asked every chunk still outstanding; the other named sources are
//! *spares*, connected only when a chunk needs more than the active ones (pages whose active
//! splits disagree or fail their checksums) or when an active one fails.
//!
//! Invariants: after [`Pipeline::next_chunk`] returns a chunk, every active source's
//! [`Source::fetched`] is that chunk; every active source has the same chunks outstanding.

use std::net::SocketAddr;

use super::rebuild::Chunk;
use super::source::Source;
use super::RegenError;
use crate::wire::{
    Regen, RegenSource, MAX_BODY, MAX_ENTRIES, READ_REPLY_HEAD_LEN, SPLIT_FIELDS_LEN,
};

/// Bytes of split data asked per chunk from one source: large enough that a chunk's frame
/// handling and system calls are small against its copies (64 KiB chunks took 1.5 times as
/// long as 256 KiB ones on the development machine, and 1 MiB ones were a little faster
/// still), small enough that the k replies of one chunk stay in the last-level cache while
/// they are verified and decoded.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Chunks asked ahead of the one being landed, per source.
pub const DEPTH: usize = 2;

/// Slots per chunk for splits of `split_len` bytes: about [`CHUNK_BYTES`], at least one, and
/// a reply that fits one frame.
pub fn chunk_slots(split_len: u32) -> u64 {
    let len = split_len.max(1) as usize;
    let fit = (MAX_BODY - 4 - READ_REPLY_HEAD_LEN) / (len + SPLIT_FIELDS_LEN);
    (CHUNK_BYTES / len).clamp(1, fit.clamp(1, MAX_ENTRIES)) as u64
}

/// The sources of one regeneration (see the module doc).
pub struct Pipeline<'a> {
    req: &'a Regen,
    /// The requester's instance, said to the sources.
    instance: u64,
    /// The node's configuration: its cluster key, which it proves to its sources, and its
    /// TLS, which it connects to them with.
    config: &'a crate::node::NodeConfig,
    /// Sources being read, chunk by chunk.
    pub active: Vec<Source>,
    /// Named sources not connected yet, next first.
    spare: Vec<(&'a RegenSource, SocketAddr)>,
    /// Spares connected to read single chunks, with nothing outstanding.
    pub extra: Vec<Source>,
    chunk: u64,
    /// The first slot not asked yet.
    asked: u64,
    /// The first slot of the next chunk to hand out.
    next: u64,
}

impl<'a> Pipeline<'a> {
    /// Connects `want` sources among `named`, in order, and asks each the first chunks.
    pub fn start(
        req: &'a Regen,
        instance: u64,
        config: &'a crate::node::NodeConfig,
        named: Vec<(&'a RegenSource, SocketAddr)>,
        want: usize,
    ) -> Result<Pipeline<'a>, RegenError> {
        let mut spare = named;
        spare.reverse();
        let mut p = Pipeline {
            req,
            instance,
            config,
            active: Vec::with_capacity(want),
            spare,
            extra: Vec::new(),
            chunk: chunk_slots(req.split_len),
            asked: 0,
            next: 0,
        };
        while p.active.len() < want {
            let s = p.connect_next().map_err(|e| {
                RegenError::Source(format!(
                    "only {} of the {want} sources needed are reachable ({e})",
                    p.active.len()
                ))
            })?;
            p.active.push(s);
        }
        for _ in 0..DEPTH {
            p.ask_ahead();
        }
        Ok(p)
    }

    /// The chunk that starts at slot `first`: its length.
    fn len_at(&self, first: u64) -> u64 {
        self.chunk.min(self.req.pages - first)
    }

    /// Asks every active source the next chunk not asked yet. A source that cannot be asked
    /// is shut and fails at its next receive, where it is replaced.
    fn ask_ahead(&mut self) {
        if self.asked >= self.req.pages {
            return;
        }
        let (first, n) = (self.asked, self.len_at(self.asked));
        for s in &mut self.active {
            let _ = s.ask(first, n);
        }
        self.asked += n;
    }

    /// The next chunk of the slab, received from every active source (any that fails is
    /// replaced), after asking the next one ahead; `None` after the last.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk>, RegenError> {
        let first = self.next;
        if first >= self.req.pages {
            return Ok(None);
        }
        for i in 0..self.active.len() {
            loop {
                match self.active[i].receive() {
                    Ok((f, n)) if f == first => {
                        debug_assert_eq!(n, self.len_at(first));
                        break;
                    }
                    Ok((f, _)) => {
                        return Err(RegenError::Source(format!(
                            "chunk {f} received where {first} was due"
                        )))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "regeneration source failed; using another");
                        self.active[i] = self.replacement(first)?;
                    }
                }
            }
        }
        self.ask_ahead();
        let n = self.len_at(first);
        self.next += n;
        Ok(Some(Chunk {
            first,
            n: n as usize,
        }))
    }

    /// A source to take over from a failed active one: asked every chunk from `first` to the
    /// last asked.
    fn replacement(&mut self, first: u64) -> Result<Source, RegenError> {
        loop {
            let mut s = self.connect_next().map_err(|e| {
                RegenError::Source(format!("a source failed and no other is left ({e})"))
            })?;
            let mut at = first;
            let mut ok = true;
            while at < self.asked && ok {
                let n = self.len_at(at);
                ok = s.ask(at, n).is_ok();
                at += n;
            }
            if ok {
                return Ok(s);
            }
        }
    }

    /// The next source not in use: an extra one (connected, idle) or a spare that connects.
    fn connect_next(&mut self) -> Result<Source, String> {
        if let Some(s) = self.extra.pop() {
            return Ok(s);
        }
        let mut last = String::from("none named");
        while let Some((s, addr)) = self.spare.pop() {
            match Source::connect(s, addr, self.req, self.instance, self.config) {
                Ok(src) => return Ok(src),
                Err(e) => {
                    tracing::warn!(error = %e, "regeneration source unreachable; using the others");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Reads chunk `first` (of `n` slots) from every source that is not active (connecting
    /// the spares first): for pages the active sources cannot rebuild. Sources that fail are
    /// dropped; afterwards every extra source's [`Source::fetched`] is that chunk.
    pub fn fetch_extra(&mut self, first: u64, n: u64) {
        while let Some((s, addr)) = self.spare.pop() {
            match Source::connect(s, addr, self.req, self.instance, self.config) {
                Ok(src) => self.extra.push(src),
                Err(e) => tracing::warn!(error = %e, "regeneration source unreachable"),
            }
        }
        for s in &mut self.extra {
            let _ = s.ask(first, n);
        }
        self.extra.retain_mut(|s| match s.receive() {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "regeneration source failed; dropping it");
                false
            }
        });
    }

    /// Every connected source, for the corruption reports at the end.
    pub fn all_mut(&mut self) -> impl Iterator<Item = &mut Source> {
        self.active.iter_mut().chain(self.extra.iter_mut())
    }
}
