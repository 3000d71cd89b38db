//! Control ops: HELLO (identity and node facts), PING's reclaim notice, RECLAIMS, LIST and
//! STATS bodies.
//!
//! Invariants: every parser reads exactly its body (trailing bytes are an error) and never
//! trusts a count further than the body it came with.

use std::fmt;

use super::{Reader, WireError};
use crate::auth::{AUTH_HMAC, NONCE_LEN, PROOF_LEN};

/// The 128-bit identity of a client. It is the capability that owns slabs: whoever presents it
/// in HELLO reaches that client's slabs, so it is generated at random and kept secret by its
/// client (it is never shown in full; [`ClientId::fingerprint`] is what status displays).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClientId(pub [u8; 16]);

impl ClientId {
    /// A fresh random identity.
    pub fn random() -> ClientId {
        ClientId(rand::random())
    }

    /// A short, non-secret label for logs and status (FNV-1a of the id).
    pub fn fingerprint(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in self.0 {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        h
    }

    /// Parses 32 hex digits.
    pub fn from_hex(s: &str) -> Result<ClientId, WireError> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            return Err(WireError::Invalid("client id must be 32 hex digits"));
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| WireError::Invalid("client id must be 32 hex digits"))?;
        }
        Ok(ClientId(out))
    }

    /// The 32 hex digits of the id (secret: for the client's own identity file only).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client-{:08x}", self.fingerprint())
    }
}

/// HELLO flag: the connection observes only (status tools); it may call PING, STATS and nothing
/// that touches slabs.
pub const HELLO_OBSERVER: u32 = 1;
/// HELLO flag: the connection is an operator's (DRAIN, FAULT); on a node with a cluster key
/// it needs the key's proof like any other.
pub const HELLO_OPERATOR: u32 = 2;
/// HELLO flag: the identity is kept (`--client-id`): its slabs outlive its connections for
/// the node's long lease (see [`crate::node::tenants`]).
pub const HELLO_KEPT: u32 = 4;
/// HELLO flags a node knows; others are refused.
pub const HELLO_FLAGS: u32 = HELLO_OBSERVER | HELLO_OPERATOR | HELLO_KEPT;

/// HELLO request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The identity that will own slabs (with a cluster key: the owner handle derived from
    /// the client's identity, see [`crate::auth`]).
    pub client: ClientId,
    /// Bit set of `HELLO_*` flags.
    pub flags: u32,
    /// The client's fresh nonce for the node's proof.
    pub nonce: [u8; NONCE_LEN],
    /// The process that speaks for the identity (random, fixed for a process's life): while
    /// connections of one process hold an identity on a node, HELLOs of the identity from
    /// another are refused ([`Status::IdentityInUse`](super::Status::IdentityInUse)).
    pub instance: u64,
}

impl Hello {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client.0);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.instance.to_le_bytes());
    }
    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Hello, WireError> {
        let mut r = Reader::new(body);
        let client = ClientId(r.bytes(16)?.try_into().expect("16"));
        let flags = r.u32()?;
        let nonce = r.bytes(NONCE_LEN)?.try_into().expect("NONCE_LEN");
        let instance = r.u64()?;
        r.end()?;
        if flags & !HELLO_FLAGS != 0 {
            return Err(WireError::Invalid("HELLO with unknown flags"));
        }
        Ok(Hello {
            client,
            flags,
            nonce,
            instance,
        })
    }
}

/// AUTH request body: the client's proof (see [`crate::auth`]).
pub fn put_auth(out: &mut Vec<u8>, proof: &[u8; PROOF_LEN]) {
    out.extend_from_slice(proof);
}

/// Parses an AUTH request body.
pub fn parse_auth(body: &[u8]) -> Result<[u8; PROOF_LEN], WireError> {
    let mut r = Reader::new(body);
    let proof = r.bytes(PROOF_LEN)?.try_into().expect("PROOF_LEN");
    r.end()?;
    Ok(proof)
}

/// HELLO reply body: what a client must know about the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// The node's id as configured.
    pub node_id: u32,
    /// Size of every slab this node hands out.
    pub slab_size: u64,
    /// Bytes the node may donate in total.
    pub capacity: u64,
    /// Largest frame body the node accepts.
    pub max_body: u32,
    /// Random at every start of the node process: a client that reconnects and finds another
    /// value knows the node restarted and every slab it held there is gone.
    pub incarnation: u64,
    /// [`crate::auth::AUTH_NONE`] (the node has no key; the connection is identified now) or
    /// [`crate::auth::AUTH_HMAC`] (check `proof`, then send AUTH).
    pub auth: u32,
    /// The node's fresh nonce (zeros without a key).
    pub nonce: [u8; NONCE_LEN],
    /// The node's proof (zeros without a key).
    pub proof: [u8; PROOF_LEN],
}

impl HelloReply {
    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.node_id.to_le_bytes());
        out.extend_from_slice(&self.slab_size.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.max_body.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&self.auth.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.proof);
    }
    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<HelloReply, WireError> {
        let mut r = Reader::new(body);
        let v = HelloReply {
            node_id: r.u32()?,
            slab_size: r.u64()?,
            capacity: r.u64()?,
            max_body: r.u32()?,
            incarnation: r.u64()?,
            auth: r.u32()?,
            nonce: r.bytes(NONCE_LEN)?.try_into().expect("NONCE_LEN"),
            proof: r.bytes(PROOF_LEN)?.try_into().expect("PROOF_LEN"),
        };
        r.end()?;
        if v.auth > AUTH_HMAC {
            return Err(WireError::Invalid(
                "HELLO reply with an unknown authentication",
            ));
        }
        Ok(v)
    }
}

/// Counters of one slab, as reported by STATS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SlabStats {
    /// Slab id.
    pub slab: u32,
    /// Fingerprint of the owning client ([`ClientId::fingerprint`]).
    pub owner: u32,
    /// Tag the client gave at allocation.
    pub tag: u64,
    /// Read entries served.
    pub reads: u64,
    /// Write entries served.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes of the slab's slots that hold data: written and not given back with DISCARD
    /// since (the memory its data occupies on the node).
    pub held: u64,
    /// [`SLAB_RECLAIMED`] when the node wants the slab back.
    pub flags: u32,
    /// Recent accesses (decaying count per control period) the node ranks eviction by.
    pub activity: u64,
    /// Corrupted splits of this slab its owner reported (CORRUPT) since the slab was allocated.
    pub corrupt: u64,
}

/// [`SlabStats::flags`]: the node has asked the owner to move this slab away.
pub const SLAB_RECLAIMED: u32 = 1;

const SLAB_STATS_LEN: usize = 4 + 4 + 8 * 6 + 4 + 8 + 8;

/// STATS reply body: node-wide figures then one record per allocated slab.
///
/// | size | field |
/// |------|-------|
/// | 4    | node id |
/// | 8    | capacity (bytes the node may donate) |
/// | 8    | slab size |
/// | 8    | resident set size of the node process, bytes |
/// | 4    | connected clients |
/// | 4    | regenerations in progress on this node |
/// | 8    | pages rebuilt by regenerations since the node started |
/// | 8    | memory of the machine (or its cgroup limit), bytes, as last measured |
/// | 8    | of which available (free for use), bytes |
/// | 8    | headroom the node keeps free for local applications, bytes |
/// | 4    | slabs the node may hold now (its memory budget) |
/// | 4    | pre-allocated, unmapped slabs ready to hand out |
/// | 4    | draining (1) or not (0) |
/// | 4    | slabs reclaimed (owners asked to move them) and not yet gone |
/// | 8    | slabs moved away by their owners after a reclaim, since start |
/// | 8    | slabs dropped before their owner moved them (grace expired), since start |
/// | 8    | corrupted splits clients reported (CORRUPT) since start, all slabs (freed and unknown ones included) |
/// | 4    | count of slab records, then count × 76-byte records: slab u32, owner u32, tag u64, reads u64, writes u64, bytes_read u64, bytes_written u64, held u64, flags u32, activity u64, corrupt u64 |
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Stats {
    /// Node id.
    pub node_id: u32,
    /// Bytes the node may donate.
    pub capacity: u64,
    /// Slab size.
    pub slab_size: u64,
    /// Resident set size of the node process.
    pub rss: u64,
    /// Connections that have said HELLO as a client (not observers).
    pub clients: u32,
    /// Regenerations running on this node now.
    pub regenerating: u32,
    /// Pages rebuilt by regenerations since the node started.
    pub regen_pages: u64,
    /// Memory of the machine or its cgroup, as last measured.
    pub mem_total: u64,
    /// Of which available.
    pub mem_available: u64,
    /// Headroom kept free for local applications.
    pub headroom: u64,
    /// Slabs the node may hold now.
    pub budget_slabs: u32,
    /// Pre-allocated slabs ready to hand out.
    pub pool_slabs: u32,
    /// Whether the node is draining.
    pub draining: bool,
    /// Slabs reclaimed and not yet gone.
    pub reclaiming: u32,
    /// Slabs moved away by their owners after a reclaim.
    pub evicted_moved: u64,
    /// Slabs dropped when their grace period expired.
    pub evicted_forced: u64,
    /// Corrupted splits clients reported since the node started (the per-slab counts, plus
    /// those of slabs freed since and of reports that named no slab of their sender).
    pub corrupt_reported: u64,
    /// Who may connect and for how long memory outlives them.
    pub tenancy: TenancyStats,
    /// Every allocated slab.
    pub slabs: Vec<SlabStats>,
}

/// A node's authentication, quota and leases, as STATS reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct TenancyStats {
    /// Whether the node has a cluster key (every connection proves it).
    pub keyed: bool,
    /// Most slabs one identity may hold (0: no limit).
    pub quota: u64,
    /// Seconds an identity's slabs outlive its last connection.
    pub lease_s: u32,
    /// The same for kept identities.
    pub kept_lease_s: u32,
    /// Identities with a connection open or a lease running.
    pub identities: u32,
    /// Of those, identities with a connection open.
    pub connected: u32,
}

impl Stats {
    /// Bytes allocated to clients.
    pub fn used(&self) -> u64 {
        self.slabs.len() as u64 * self.slab_size
    }

    /// Appends the body.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.node_id.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&self.slab_size.to_le_bytes());
        out.extend_from_slice(&self.rss.to_le_bytes());
        out.extend_from_slice(&self.clients.to_le_bytes());
        out.extend_from_slice(&self.regenerating.to_le_bytes());
        out.extend_from_slice(&self.regen_pages.to_le_bytes());
        for v in [self.mem_total, self.mem_available, self.headroom] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.budget_slabs,
            self.pool_slabs,
            self.draining as u32,
            self.reclaiming,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.evicted_moved.to_le_bytes());
        out.extend_from_slice(&self.evicted_forced.to_le_bytes());
        out.extend_from_slice(&self.corrupt_reported.to_le_bytes());
        let t = &self.tenancy;
        out.extend_from_slice(&u32::from(t.keyed).to_le_bytes());
        out.extend_from_slice(&t.quota.to_le_bytes());
        for v in [t.lease_s, t.kept_lease_s, t.identities, t.connected] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.slabs.len() as u32).to_le_bytes());
        for s in &self.slabs {
            out.extend_from_slice(&s.slab.to_le_bytes());
            out.extend_from_slice(&s.owner.to_le_bytes());
            for v in [
                s.tag,
                s.reads,
                s.writes,
                s.bytes_read,
                s.bytes_written,
                s.held,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&s.flags.to_le_bytes());
            out.extend_from_slice(&s.activity.to_le_bytes());
            out.extend_from_slice(&s.corrupt.to_le_bytes());
        }
    }

    /// Parses the body.
    pub fn parse(body: &[u8]) -> Result<Stats, WireError> {
        let mut r = Reader::new(body);
        let node_id = r.u32()?;
        let capacity = r.u64()?;
        let slab_size = r.u64()?;
        let rss = r.u64()?;
        let clients = r.u32()?;
        let regenerating = r.u32()?;
        let regen_pages = r.u64()?;
        let mem_total = r.u64()?;
        let mem_available = r.u64()?;
        let headroom = r.u64()?;
        let budget_slabs = r.u32()?;
        let pool_slabs = r.u32()?;
        let draining = r.u32()? != 0;
        let reclaiming = r.u32()?;
        let evicted_moved = r.u64()?;
        let evicted_forced = r.u64()?;
        let corrupt_reported = r.u64()?;
        let tenancy = TenancyStats {
            keyed: r.u32()? != 0,
            quota: r.u64()?,
            lease_s: r.u32()?,
            kept_lease_s: r.u32()?,
            identities: r.u32()?,
            connected: r.u32()?,
        };
        let n = r.u32()? as usize;
        if n > r.remaining() / SLAB_STATS_LEN {
            return Err(WireError::Invalid("slab count exceeds the body"));
        }
        let mut slabs = Vec::with_capacity(n);
        for _ in 0..n {
            slabs.push(SlabStats {
                slab: r.u32()?,
                owner: r.u32()?,
                tag: r.u64()?,
                reads: r.u64()?,
                writes: r.u64()?,
                bytes_read: r.u64()?,
                bytes_written: r.u64()?,
                held: r.u64()?,
                flags: r.u32()?,
                activity: r.u64()?,
                corrupt: r.u64()?,
            });
        }
        r.end()?;
        Ok(Stats {
            node_id,
            capacity,
            slab_size,
            rss,
            clients,
            regenerating,
            regen_pages,
            mem_total,
            mem_available,
            headroom,
            budget_slabs,
            pool_slabs,
            draining,
            reclaiming,
            evicted_moved,
            evicted_forced,
            corrupt_reported,
            tenancy,
            slabs,
        })
    }
}

/// What a node tells a client in the reply to its heartbeat (PING): how many of the client's
/// slabs it has reclaimed, whether it takes new slabs, and how many slabs it holds for all
/// clients (so that placement sees other clients' allocations within a heartbeat, instead of
/// every client placing on the loads it saw at connect). An empty PING reply (an observer
/// connection, or an older node) means "nothing reclaimed, accepting, load unknown".
///
/// | size | field |
/// |------|-------|
/// | 4    | word: bits 0–30 slabs of the asking client the node has reclaimed; bit 31 = the node refuses new slabs (draining, or out of memory budget) |
/// | 4    | slabs the node holds, for all clients (`u32::MAX`: not reported) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notice {
    /// Reclaimed slabs of the asking client.
    pub reclaimed: u32,
    /// The node refuses new slabs.
    pub refusing: bool,
    /// Slabs the node holds (`None`: not reported).
    pub slabs: Option<u32>,
}

const NOTICE_REFUSING: u32 = 1 << 31;

impl Notice {
    /// The notice as one u64, exactly the 8 body bytes read little-endian (word in the low
    /// half, slab count in the high half), for lock-free storage.
    pub fn encode(self) -> u64 {
        let w = self.reclaimed.min(NOTICE_REFUSING - 1)
            | if self.refusing { NOTICE_REFUSING } else { 0 };
        u64::from(w) | u64::from(self.slabs.unwrap_or(u32::MAX)) << 32
    }

    /// Decodes [`Notice::encode`].
    pub fn decode(v: u64) -> Notice {
        let w = v as u32;
        let slabs = (v >> 32) as u32;
        Notice {
            reclaimed: w & !NOTICE_REFUSING,
            refusing: w & NOTICE_REFUSING != 0,
            slabs: (slabs != u32::MAX).then_some(slabs),
        }
    }

    /// Appends the PING reply body.
    pub fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode().to_le_bytes());
    }

    /// Decodes a PING reply body (empty = nothing to say).
    pub fn parse(body: &[u8]) -> Result<Notice, WireError> {
        if body.is_empty() {
            return Ok(Notice::default());
        }
        let mut r = Reader::new(body);
        let v = r.u64()?;
        r.end()?;
        Ok(Notice::decode(v))
    }
}

/// One reclaimed slab in a RECLAIMS reply: the slab and the milliseconds left before the node
/// drops it whether or not it was moved (`u32::MAX`: no deadline, the node waits — a drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    /// The slab.
    pub slab: u32,
    /// Milliseconds left.
    pub ms_left: u32,
}

/// Appends a RECLAIMS reply body.
pub fn put_reclaims(out: &mut Vec<u8>, list: &[Reclaim]) {
    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for c in list {
        out.extend_from_slice(&c.slab.to_le_bytes());
        out.extend_from_slice(&c.ms_left.to_le_bytes());
    }
}

/// Parses a RECLAIMS reply body.
pub fn parse_reclaims(body: &[u8]) -> Result<Vec<Reclaim>, WireError> {
    let mut r = Reader::new(body);
    let n = r.u32()? as usize;
    if n > r.remaining() / 8 {
        return Err(WireError::Invalid("reclaim count exceeds the body"));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Reclaim {
            slab: r.u32()?,
            ms_left: r.u32()?,
        });
    }
    r.end()?;
    Ok(v)
}

/// One slab in a LIST reply.
///
/// | size | field |
/// |------|-------|
/// | 4    | slab id |
/// | 8    | tag given at ALLOC |
/// | 8    | the newest version stored in any split of the slab (0: none written) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The slab id.
    pub slab: u32,
    /// The tag given at ALLOC.
    pub tag: u64,
    /// The newest version stored in the slab (0 when nothing was written).
    pub newest: u64,
}

/// Length of one [`Listed`] record.
const LISTED_LEN: usize = 20;

/// Parses a LIST reply body.
pub fn parse_list(body: &[u8]) -> Result<Vec<Listed>, WireError> {
    let mut r = Reader::new(body);
    let n = r.u32()? as usize;
    if n > r.remaining() / LISTED_LEN {
        return Err(WireError::Invalid("slab count exceeds the body"));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Listed {
            slab: r.u32()?,
            tag: r.u64()?,
            newest: r.u64()?,
        });
    }
    r.end()?;
    Ok(v)
}

/// Appends a LIST reply body.
pub fn put_list(out: &mut Vec<u8>, slabs: &[Listed]) {
    out.extend_from_slice(&(slabs.len() as u32).to_le_bytes());
    for l in slabs {
        out.extend_from_slice(&l.slab.to_le_bytes());
        out.extend_from_slice(&l.tag.to_le_bytes());
        out.extend_from_slice(&l.newest.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use crate::wire::{test_frame as frame, test_split as split};
    use proptest::prelude::*;

    #[test]
    fn list_records_carry_the_newest_version_per_the_table() {
        let l = Listed {
            slab: 7,
            tag: 0x11,
            newest: 0x99,
        };
        let mut out = Vec::new();
        put_list(&mut out, &[l, l]);
        assert_eq!(out.len(), 4 + 2 * LISTED_LEN);
        assert_eq!((out[0], out[4], out[8], out[16]), (2, 7, 0x11, 0x99));
        assert_eq!(parse_list(&out).unwrap(), vec![l, l]);
        assert!(parse_list(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn hello_reply_and_auth_bodies_match_the_table() {
        let h = Hello {
            client: ClientId([1; 16]),
            flags: HELLO_KEPT | HELLO_OPERATOR,
            nonce: [2; NONCE_LEN],
            instance: 0x0908,
        };
        let mut out = Vec::new();
        h.put(&mut out);
        assert_eq!(out.len(), 16 + 4 + 16 + 8);
        assert_eq!(
            (out[0], out[16], out[20], out[35], out[36], out[37]),
            (1, 6, 2, 2, 8, 9)
        );
        assert_eq!(Hello::parse(&out).unwrap(), h);
        // Unknown flags and short or long bodies are refused.
        let mut long = out.clone();
        long.push(0);
        assert!(Hello::parse(&long).is_err());
        out[16] = 8;
        assert!(Hello::parse(&out).is_err());
        assert!(Hello::parse(&out[..43]).is_err());
        let r = HelloReply {
            node_id: 3,
            slab_size: 4096,
            capacity: 8192,
            max_body: 5,
            incarnation: 6,
            auth: AUTH_HMAC,
            nonce: [7; NONCE_LEN],
            proof: [8; PROOF_LEN],
        };
        let mut out = Vec::new();
        r.put(&mut out);
        assert_eq!(out.len(), 4 + 8 + 8 + 4 + 8 + 4 + 16 + 32);
        assert_eq!((out[32], out[36], out[52], out[83]), (1, 7, 8, 8));
        assert_eq!(HelloReply::parse(&out).unwrap(), r);
        out[32] = 2;
        assert!(
            HelloReply::parse(&out).is_err(),
            "an unknown authentication"
        );
        let mut a = Vec::new();
        put_auth(&mut a, &[9; PROOF_LEN]);
        assert_eq!(parse_auth(&a).unwrap(), [9; PROOF_LEN]);
        assert!(parse_auth(&a[..31]).is_err());
    }

    #[test]
    fn client_id_hex_round_trip() {
        let id = ClientId::random();
        assert_eq!(ClientId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(ClientId::from_hex("xyz").is_err());
        assert!(ClientId::from_hex(&"é".repeat(16)).is_err());
    }

    #[test]
    fn notice_and_drain_bodies_match_the_tables() {
        assert_eq!(Notice::parse(&[]).unwrap(), Notice::default());
        let n = Notice {
            reclaimed: 3,
            refusing: true,
            slabs: Some(5),
        };
        let mut out = Vec::new();
        n.put(&mut out);
        assert_eq!(out, [3, 0, 0, 0x80, 5, 0, 0, 0]);
        assert!(Notice::parse(&[1, 2, 3, 4]).is_err());
        for (mode, want) in [(1u32, Some(true)), (0, Some(false)), (2, None)] {
            let buf = frame(Op::Drain, 4, |o| o.extend_from_slice(&mode.to_le_bytes()));
            let (h, body) = split(&buf);
            match (parse_request(&h, body), want) {
                (Ok(Request::Drain(d)), Some(w)) => assert_eq!(d, w),
                (Err(_), None) => {}
                (other, _) => panic!("DRAIN {mode} parsed as {other:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn stats_round_trip(node_id: u32, capacity: u64, rss: u64, n in 0usize..20, seed: u64) {
            let slabs = (0..n).map(|i| SlabStats { slab: i as u32, owner: seed as u32, tag: seed ^ i as u64, reads: i as u64, writes: 2, bytes_read: 3, bytes_written: 4, held: 5, flags: (i % 2) as u32, activity: seed >> 3, corrupt: seed.rotate_left(i as u32) }).collect();
            let s = Stats { node_id, capacity, slab_size: 1 << 20, rss, clients: 3, regenerating: 1, regen_pages: seed, mem_total: seed ^ 7, mem_available: rss, headroom: capacity, budget_slabs: n as u32, pool_slabs: 2, draining: seed % 2 == 0, reclaiming: 4, evicted_moved: 5, evicted_forced: 6, corrupt_reported: !seed, tenancy: TenancyStats { keyed: seed % 3 == 0, quota: seed >> 5, lease_s: 600, kept_lease_s: seed as u32, identities: n as u32, connected: 1 }, slabs };
            let mut out = Vec::new();
            s.put(&mut out);
            prop_assert_eq!(Stats::parse(&out).unwrap(), s);
        }

        #[test]
        fn notices_round_trip(reclaimed in 0u32..(1 << 31), refusing: bool, slabs in proptest::option::of(0u32..u32::MAX)) {
            let n = Notice { reclaimed, refusing, slabs };
            let mut out = Vec::new();
            n.put(&mut out);
            prop_assert_eq!(Notice::parse(&out).unwrap(), n);
        }

        #[test]
        fn reclaims_round_trip(list in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..50)) {
            let list: Vec<Reclaim> = list.into_iter().map(|(slab, ms_left)| Reclaim { slab, ms_left }).collect();
            let mut out = Vec::new();
            put_reclaims(&mut out, &list);
            prop_assert_eq!(parse_reclaims(&out).unwrap(), list);
        }
    }
}
