//! One regeneration source: a connection, with the client's identity, to the node of one
//! surviving split, read in runs.
//!
//! A source is asked for *chunks* — runs of consecutive split slots, one READV run each — and
//! answers them in order; several chunks are asked before the first is read, so that the
//! source reads and sends the next ones while this node decodes. Each reply is checked before
//! its data is used: the request it answers (by id), one run of exactly the slots asked (the
//! cookie of every split is its slot number) and the slab's split length. The reply's data is
//! used where it was received: no copy.
//!
//! Invariants: `asked` lists the chunks sent and not yet received, oldest first; after a
//! successful [`Source::receive`], [`Source::fetched`] is that chunk's run; a source whose
//! connection failed is shut, so that every later call on it fails at once.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};

use crate::tls::Link;
use std::time::Duration;

use crate::wire::{
    self, Header, Op, OpenRuns, Regen, RegenSource, ReplyRun, ReplyRuns, Run, Status, HEADER_LEN,
};

/// A connection to one surviving split's node.
pub(super) struct Source {
    /// The split's index in the group.
    pub split: usize,
    /// The node's id (for messages).
    pub node: u32,
    slab: u32,
    split_len: u32,
    stream: Link,
    /// Splits it returned that failed their checksum, reported to it at the end.
    pub corrupt: u32,
    request: Vec<u8>,
    /// The last reply's body is `reply[..reply_len]` (the buffer only grows, so that reading
    /// a reply never zero-fills it first).
    reply: Vec<u8>,
    reply_len: usize,
    /// Chunks asked and not yet received (first slot, slots), oldest first.
    asked: VecDeque<(u64, u64)>,
}

impl Source {
    /// Connects and says HELLO as the request's client and its `instance`. A source that does not greet within a
    /// second is given up (a stalled node must not hold a regeneration up when other splits
    /// can serve); data replies may take up to ten.
    pub fn connect(
        s: &RegenSource,
        addr: SocketAddr,
        req: &Regen,
        instance: u64,
        config: &crate::node::NodeConfig,
    ) -> Result<Source, String> {
        let greet = Duration::from_secs(1);
        // The request's owner handle as it is (a node never sees a client's identity), with
        // this node's own key: the source checks it like any client's.
        let hello = crate::rpc::Greeting {
            owner: req.client,
            flags: 0,
            key: config.key.clone(),
            node_id: Some(s.node),
            tls: config.tls.clone(),
            instance,
        };
        let stream = crate::rpc::Connection::open(addr, Some(&hello), greet, greet)
            .map_err(|e| format!("node {}: {e}", s.node))?
            .into_link();
        let tcp = stream.tcp();
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Source {
            split: s.split as usize,
            node: s.node,
            slab: s.slab,
            split_len: req.split_len,
            stream,
            corrupt: 0,
            request: Vec::new(),
            reply: Vec::new(),
            reply_len: 0,
            asked: VecDeque::new(),
        })
    }

    /// Sends the READV of slots `first..first + n` (one run; the request id is `first`).
    pub fn ask(&mut self, first: u64, n: u64) -> Result<(), String> {
        let run = Run {
            slab: self.slab,
            split_len: self.split_len,
            offset: first
                .checked_mul(u64::from(self.split_len))
                .ok_or("slot offset overflows")?,
            n: u32::try_from(n).map_err(|_| "chunk of more than 2^32 slots")?,
        };
        self.request.clear();
        let mut frame =
            OpenRuns::begin(&mut self.request, Op::ReadV, first).map_err(|e| e.to_string())?;
        frame
            .read_run(&mut self.request, run, &mut (first..first + n))
            .map_err(|e| e.to_string())?;
        if let Err(e) = self.stream.write_all(&self.request) {
            return Err(self.broken(format!("asking node {}: {e}", self.node)));
        }
        self.asked.push_back((first, n));
        Ok(())
    }

    /// Reads the reply to the oldest chunk asked and checks it (see the module doc); returns
    /// its first slot and slot count. The run is then [`Source::fetched`].
    pub fn receive(&mut self) -> Result<(u64, u64), String> {
        let (first, n) = self.asked.pop_front().ok_or("nothing asked")?;
        self.read_reply(first)
            .and_then(|()| self.check(first, n))
            .map_err(|e| self.broken(e))?;
        Ok((first, n))
    }

    fn read_reply(&mut self, first: u64) -> Result<(), String> {
        let mut hb = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut hb).map_err(|e| e.to_string())?;
        let h = Header::parse(&hb).map_err(|e| e.to_string())?;
        if !h.reply || h.op != Op::ReadV || h.id != first || h.status != Status::Ok {
            return Err(format!(
                "answered {:?} #{} ({}) to READV #{first}",
                h.op, h.id, h.status
            ));
        }
        let len = h.body_len as usize;
        if self.reply.len() < len {
            self.reply.resize(len, 0);
        }
        self.reply_len = len;
        self.stream
            .read_exact(&mut self.reply[..len])
            .map_err(|e| e.to_string())
    }

    fn check(&self, first: u64, n: u64) -> Result<(), String> {
        let body = &self.reply[..self.reply_len];
        let mut runs = ReplyRuns::new(body).map_err(|e| e.to_string())?;
        if runs.remaining() != 1 {
            return Err(format!("{} runs in the reply to one", runs.remaining()));
        }
        let run = runs
            .next_run()
            .map_err(|e| e.to_string())?
            .ok_or("no run")?;
        if run.status != Status::Ok {
            return Err(format!(
                "slots {first}..{} refused: {}",
                first + n,
                run.status
            ));
        }
        if run.n as u64 != n || run.split_len() != self.split_len as usize {
            return Err(format!(
                "{} splits of {} bytes for {n} of {}",
                run.n,
                run.split_len(),
                self.split_len
            ));
        }
        runs.next_run().map_err(|e| e.to_string())?;
        if (0..run.n).any(|i| run.split(i).cookie != first + i as u64) {
            return Err("splits out of order".into());
        }
        Ok(())
    }

    /// The run last received (after a successful [`Source::receive`]).
    pub fn fetched(&self) -> ReplyRun<'_> {
        ReplyRuns::new(&self.reply[..self.reply_len])
            .and_then(|mut r| r.next_run())
            .ok()
            .flatten()
            .expect("checked by receive")
    }

    /// Marks the connection failed (every later call fails at once) and says why.
    fn broken(&mut self, why: String) -> String {
        let _ = self.stream.tcp().shutdown(Shutdown::Both);
        self.asked.clear();
        self.reply_len = 0;
        format!("source split {} on node {}: {why}", self.split, self.node)
    }

    /// Tells the source how many of its splits failed their checksum, as the client does
    /// after its reads (CORRUPT, on this connection, which speaks for the client), so that
    /// the source's status and metrics count corruption found by regeneration too. Best
    /// effort: a report that fails is logged, the regeneration stands.
    pub fn report_corrupt(&mut self) {
        if self.corrupt == 0 {
            return;
        }
        // Replies to chunks still asked would come first: read them out of the way.
        while !self.asked.is_empty() {
            if self.receive().is_err() {
                return;
            }
        }
        let mut body = Vec::new();
        wire::put_corrupt(
            &mut body,
            &[wire::CorruptReport {
                slab: self.slab,
                splits: self.corrupt,
                cause: wire::CorruptCause::Checksum,
            }],
        );
        if let Err(e) = crate::rpc::request(&mut self.stream, Op::Corrupt, &body) {
            tracing::warn!(split = self.split, error = %e, "could not report corrupted splits to a regeneration source");
        }
    }
}
