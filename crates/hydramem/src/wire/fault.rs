//! FAULT: the faults a test injects into a node, and the corruption rates among them.
//!
//! Invariants: a fault that parses re-encodes to the very bytes; rates above one million per
//! million and stray bits are refused.

#[cfg(doc)]
use super::Status;
use super::{Reader, WireError};

/// A fault a test asks a node to inject (FAULT request). Nodes refuse them with
/// [`Status::Forbidden`] unless started with `--allow-fault-injection`.
///
/// | kind | fault           | arg                                         |
/// |------|-----------------|---------------------------------------------|
/// | 0    | Clear           | 0                                           |
/// | 1    | DelayReplies    | microseconds                                |
/// | 2    | StopAnswering   | 0                                           |
/// | 3    | DropConnections | 0                                           |
/// | 4    | RefuseAlloc     | 0                                           |
/// | 5    | Crash           | 0                                           |
/// | 6    | MemoryTotal     | bytes                                       |
/// | 7    | MemoryAvailable | bytes                                       |
/// | 8    | CorruptSlab     | slab id                                     |
/// | 9    | CorruptWrites   | a [`Corruption`] (rate, optional slab)      |
/// | 10   | CorruptReplies  | a [`Corruption`]                            |
/// | 11   | MisdirectReads  | a [`Corruption`]                            |
///
/// `Clear` ends every fault, the corruptions included (a corruption already stored stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Remove every injected fault.
    Clear,
    /// Hold every reply (on every connection) this many microseconds before sending it.
    DelayReplies(u64),
    /// Stop answering: requests are read but not served until `Clear` (the connections stay
    /// open, as with a process that hangs).
    StopAnswering,
    /// Close every connection except the one that asked.
    DropConnections,
    /// Refuse every ALLOC as if the node were full.
    RefuseAlloc,
    /// Abort the node process at once.
    Crash,
    /// Simulate a machine with this much memory (bytes; 0 = measure the real one again).
    MemoryTotal(u64),
    /// Simulate this much memory available if the node held no slabs (bytes; the node takes
    /// its own slabs off it; `u64::MAX` = measure the real machine again).
    MemoryAvailable(u64),
    /// Flip one random bit in every written split of this slab (any owner's), once: memory
    /// corrupted at rest. Answered [`Status::NoSuchSlab`] if the slab does not exist.
    CorruptSlab(u32),
    /// After storing a written split, flip one random bit of the stored copy, at a rate.
    CorruptWrites(Corruption),
    /// Flip one random bit in the data of a READV reply entry, at a rate; the stored split
    /// is untouched (corruption on the wire).
    CorruptReplies(Corruption),
    /// Answer a READV entry with the data (and checksum) of the neighbouring slot of the same
    /// slab, under the requested slot's version, at a rate: a split of the wrong page whose
    /// metadata looks right (a misaddressed read).
    MisdirectReads(Corruption),
}

/// Which accesses an injected corruption hits: a rate in parts per million, optionally only
/// on one slab. On the wire (the FAULT `arg`): bits 0–30 the rate (at most 1 000 000), bit 31
/// set when the corruption is limited to one slab, bits 32–63 that slab. A rate of 0 turns
/// the corruption off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Corruption {
    /// Accesses hit per million.
    pub ppm: u32,
    /// Only this slab (`None`: every slab).
    pub slab: Option<u32>,
}

/// The largest corruption rate: every access.
pub const PPM_ALL: u32 = 1_000_000;
const CORRUPTION_ONE_SLAB: u64 = 1 << 31;

impl Corruption {
    /// Every access of every slab.
    pub const ALWAYS: Corruption = Corruption {
        ppm: PPM_ALL,
        slab: None,
    };

    /// The FAULT argument.
    pub fn encode(self) -> u64 {
        u64::from(self.ppm.min(PPM_ALL))
            | self
                .slab
                .map_or(0, |s| CORRUPTION_ONE_SLAB | u64::from(s) << 32)
    }

    /// Decodes [`Corruption::encode`]; refuses rates above one million and stray bits.
    pub fn decode(arg: u64) -> Result<Corruption, WireError> {
        let ppm = (arg & (CORRUPTION_ONE_SLAB - 1)) as u32;
        if ppm > PPM_ALL {
            return Err(WireError::Invalid(
                "corruption rate above 1000000 per million",
            ));
        }
        let slab = (arg >> 32) as u32;
        match arg & CORRUPTION_ONE_SLAB != 0 {
            true => Ok(Corruption {
                ppm,
                slab: Some(slab),
            }),
            false if slab == 0 => Ok(Corruption { ppm, slab: None }),
            false => Err(WireError::Invalid(
                "corruption names a slab without its flag",
            )),
        }
    }

    /// Whether this access of `slab` is hit (`draw`: a uniform random number below one
    /// million).
    pub fn hits(self, slab: u32, draw: u32) -> bool {
        self.ppm > draw && self.slab.is_none_or(|s| s == slab)
    }
}

impl Fault {
    /// Appends the FAULT request body.
    pub fn put(&self, out: &mut Vec<u8>) {
        let (kind, arg) = match *self {
            Fault::Clear => (0u32, 0u64),
            Fault::DelayReplies(us) => (1, us),
            Fault::StopAnswering => (2, 0),
            Fault::DropConnections => (3, 0),
            Fault::RefuseAlloc => (4, 0),
            Fault::Crash => (5, 0),
            Fault::MemoryTotal(b) => (6, b),
            Fault::MemoryAvailable(b) => (7, b),
            Fault::CorruptSlab(slab) => (8, u64::from(slab)),
            Fault::CorruptWrites(c) => (9, c.encode()),
            Fault::CorruptReplies(c) => (10, c.encode()),
            Fault::MisdirectReads(c) => (11, c.encode()),
        };
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&arg.to_le_bytes());
    }

    /// Parses a FAULT request body.
    pub fn parse(body: &[u8]) -> Result<Fault, WireError> {
        let mut r = Reader::new(body);
        let kind = r.u32()?;
        let arg = r.u64()?;
        r.end()?;
        if matches!(kind, 0 | 2..=5) && arg != 0 {
            return Err(WireError::Invalid("this fault kind takes no argument (0)"));
        }
        Ok(match kind {
            0 => Fault::Clear,
            1 => Fault::DelayReplies(arg),
            2 => Fault::StopAnswering,
            3 => Fault::DropConnections,
            4 => Fault::RefuseAlloc,
            5 => Fault::Crash,
            6 => Fault::MemoryTotal(arg),
            7 => Fault::MemoryAvailable(arg),
            8 => Fault::CorruptSlab(
                u32::try_from(arg).map_err(|_| WireError::Invalid("slab id above u32"))?,
            ),
            9 => Fault::CorruptWrites(Corruption::decode(arg)?),
            10 => Fault::CorruptReplies(Corruption::decode(arg)?),
            11 => Fault::MisdirectReads(Corruption::decode(arg)?),
            _ => return Err(WireError::Invalid("unknown fault kind")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_round_trip_and_bad_corruption_args_are_refused() {
        let one = Corruption {
            ppm: 250,
            slab: Some(7),
        };
        for f in [
            Fault::Clear,
            Fault::DelayReplies(9),
            Fault::MemoryAvailable(u64::MAX),
            Fault::CorruptSlab(u32::MAX),
            Fault::CorruptWrites(Corruption::ALWAYS),
            Fault::CorruptReplies(one),
            Fault::MisdirectReads(Corruption { ppm: 0, slab: None }),
        ] {
            let mut out = Vec::new();
            f.put(&mut out);
            assert_eq!(Fault::parse(&out).unwrap(), f);
        }
        // kind 10, rate 250 on slab 7: bit 31 flags the slab in the high word.
        let mut out = Vec::new();
        Fault::CorruptReplies(one).put(&mut out);
        assert_eq!(out, [10, 0, 0, 0, 250, 0, 0, 0x80, 7, 0, 0, 0]);
        for (kind, bad) in [
            (9u32, PPM_ALL as u64 + 1),
            (10, 7 << 32),
            (11, 1 << 30),
            (0, 1),
        ] {
            let mut out = kind.to_le_bytes().to_vec();
            out.extend_from_slice(&bad.to_le_bytes());
            assert!(
                Fault::parse(&out).is_err(),
                "kind {kind} arg {bad:#x} accepted"
            );
        }
        assert!(one.hits(7, 249) && !one.hits(7, 250) && !one.hits(8, 0));
        assert!(Corruption::ALWAYS.hits(3, PPM_ALL - 1));
    }
}
