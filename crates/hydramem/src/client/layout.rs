//! How one page maps onto splits, slabs and completions for each resilience scheme.
//!
//! A [`Layout`] is derived once per client from its [`Resilience`] and the cluster's slab size.
//! It answers, without allocation, every geometric question of the data path: how many splits a
//! page has and how long they are, where each split lands in memory (in the caller's page or in
//! the small side buffer), how many acknowledgements complete a write, and how many splits a read
//! asks for and needs.
//!
//! Erasure coding k + r: split j < k holds bytes `[j·s, (j+1)·s)` of the page with
//! `s = ceil(4096 / k)` rounded up to 64 bytes for the SIMD kernels; when k does not divide 4096
//! the last data splits reach past the page and live, zero-padded, in the side buffer, as do the
//! r parity splits. Replication n: every copy is the whole page (s = 4096) and all copies land in
//! the same place, the page, so a read claims that region for the first copy that arrives.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::PAGE_SIZE;

/// Most splits one page may have (k + r, or the copy count).
pub const MAX_WIDTH: usize = hydramem_isal::MAX_SPLITS;

/// When a write counts as done under erasure coding (paper Table 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// All k + r splits acknowledged: the page survives any r lost nodes.
    FailureRecovery,
    /// Any k acknowledged: fastest, no resilience guarantee.
    EcOnly,
    /// Corruption detection (paper Table 1): a write waits for k + Δ acknowledgements, a read
    /// for k + Δ splits of one version, decodes from k and re-encodes to check the others, so
    /// up to Δ corrupted splits per page are detected (and reported as an error, never
    /// returned). The paper's configuration is r = Δ (memory overhead 1 + Δ/k).
    Detection,
    /// Corruption correction (paper Table 1): a write waits for k + 2Δ + 1 acknowledgements; a
    /// read takes k + Δ splits and checks them as detection does, and when they disagree asks
    /// Δ + 1 more and keeps the one codeword that k + Δ + 1 of them agree with
    /// ([`super::correct`]), so up to Δ corrupted splits per page are corrected. Needs
    /// r >= 2Δ + 1 (memory overhead 1 + (2Δ + 1)/k).
    Correction,
}

/// A client's resilience scheme; the three schemes share the API, the transport and the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "scheme")]
pub enum Resilience {
    /// Hydra: Reed-Solomon k data + r parity splits per page, reads ask k + delta splits.
    Hydra {
        /// Data splits.
        k: u8,
        /// Parity splits.
        r: u8,
        /// Extra splits a read asks beyond k (late binding).
        delta: u8,
        /// Write completion rule.
        mode: Mode,
    },
    /// n whole copies on n nodes; a write waits for all n, a read takes the first copy.
    Replication {
        /// Number of copies (1 = single copy, no redundancy).
        copies: u8,
    },
    /// Span coding (Carbink): pages stay whole, each on one node; k pages written together
    /// form a *row* with r parity pages over them, on k + r distinct nodes. A healthy read is
    /// one request to the page's node. The client side lives in [`crate::span`]; at this
    /// layer a row is one unit of k + r whole-page splits with one version.
    Span {
        /// Data pages per row.
        k: u8,
        /// Parity pages per row.
        r: u8,
    },
}

impl Resilience {
    /// A short human label: "hydra 8+2 Δ=1", "replication ×2", "single copy".
    pub fn label(&self) -> String {
        match *self {
            Resilience::Hydra { k, r, delta, mode } => {
                let m = match mode {
                    Mode::FailureRecovery => "",
                    Mode::EcOnly => " ec-only",
                    Mode::Detection => " detection",
                    Mode::Correction => " correction",
                };
                format!("hydra {k}+{r} Δ={delta}{m}")
            }
            Resilience::Replication { copies: 1 } => "single copy".into(),
            Resilience::Replication { copies } => format!("replication ×{copies}"),
            Resilience::Span { k, r } => format!("span {k}+{r}"),
        }
    }
}

/// The forms a scheme's name takes (see [`Resilience`]'s `FromStr`), for help texts and errors.
pub const SCHEME_FORMS: &str = "hydra-K+R-dD (e.g. hydra-8+2-d1; add -ec for EC-only, -det for \
     corruption detection, -cor for correction), span-K+R (e.g. span-8+2), repN or single";

/// A scheme name that is none of [`SCHEME_FORMS`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown scheme {name:?}: use {SCHEME_FORMS}")]
pub struct SchemeError {
    /// The name as given.
    pub name: String,
}

/// The mode suffixes of a Hydra scheme's name; failure recovery has none.
const MODE_SUFFIXES: [(&str, Mode); 3] = [
    ("-ec", Mode::EcOnly),
    ("-det", Mode::Detection),
    ("-cor", Mode::Correction),
];

/// A scheme's name, as the command line takes it: `hydra-8+2-d1`, `hydra-4+2-d0-ec`, `rep2`,
/// `single` (one copy). Parsing it back with `FromStr` gives the same scheme.
impl fmt::Display for Resilience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Resilience::Hydra { k, r, delta, mode } => {
                let suffix = MODE_SUFFIXES
                    .iter()
                    .find(|(_, m)| *m == mode)
                    .map_or("", |(s, _)| s);
                write!(f, "hydra-{k}+{r}-d{delta}{suffix}")
            }
            Resilience::Replication { copies: 1 } => f.write_str("single"),
            Resilience::Replication { copies } => write!(f, "rep{copies}"),
            Resilience::Span { k, r } => write!(f, "span-{k}+{r}"),
        }
    }
}

/// Parses a scheme's name ([`SCHEME_FORMS`]; numbers in decimal digits, each at most 255).
/// Only the form is checked here: whether the parameters can work (k ≥ 1, Δ ≤ r, ...) is
/// [`Layout::new`]'s to say.
impl FromStr for Resilience {
    type Err = SchemeError;

    fn from_str(s: &str) -> Result<Resilience, SchemeError> {
        let number = |n: &str| {
            n.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| n.parse::<u8>().ok())
                .flatten()
        };
        let hydra = |rest: &str| {
            let (rest, mode) = MODE_SUFFIXES
                .into_iter()
                .find_map(|(suffix, mode)| rest.strip_suffix(suffix).map(|r| (r, mode)))
                .unwrap_or((rest, Mode::FailureRecovery));
            let (kr, delta) = rest.split_once("-d")?;
            let (k, r) = kr.split_once('+')?;
            Some(Resilience::Hydra {
                k: number(k)?,
                r: number(r)?,
                delta: number(delta)?,
                mode,
            })
        };
        let span = |rest: &str| {
            let (k, r) = rest.split_once('+')?;
            Some(Resilience::Span {
                k: number(k)?,
                r: number(r)?,
            })
        };
        let parsed = match s {
            "single" => Some(Resilience::Replication { copies: 1 }),
            _ => match (
                s.strip_prefix("rep"),
                s.strip_prefix("hydra-"),
                s.strip_prefix("span-"),
            ) {
                (Some(n), _, _) => number(n).map(|copies| Resilience::Replication { copies }),
                (_, Some(rest), _) => hydra(rest),
                (_, _, Some(rest)) => span(rest),
                _ => None,
            },
        };
        parsed.ok_or_else(|| SchemeError { name: s.into() })
    }
}

/// Where a split lives in memory during an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// At this offset in the caller's page.
    Page(usize),
    /// At this offset in the operation's side buffer.
    Side(usize),
}

/// Errors in a resilience configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The parameters cannot work.
    #[error("invalid resilience {label}: {reason}")]
    Invalid {
        /// The scheme as given.
        label: String,
        /// What is wrong and what would work.
        reason: String,
    },
}

/// The geometry derived from a [`Resilience`] and a slab size.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The scheme.
    pub resilience: Resilience,
    /// Splits per page (k + r, or copies): also the number of slabs per address range.
    pub width: usize,
    /// Data splits (k, or 1 for replication).
    pub k: usize,
    /// Bytes per split.
    pub split_len: usize,
    /// Data splits that lie wholly inside the page (the others are padded in the side buffer).
    pub full_data: usize,
    /// Acknowledgements that complete a write.
    pub write_need: usize,
    /// Splits a read asks for at first.
    pub read_fanout: usize,
    /// Splits a read needs.
    pub read_need: usize,
    /// Pages per address range (= split slots per slab).
    pub pages_per_range: u64,
    /// Size of a slab.
    pub slab_size: u64,
}

impl Layout {
    /// Derives the layout; refuses parameters that cannot work.
    pub fn new(resilience: Resilience, slab_size: u64) -> Result<Layout, LayoutError> {
        let bad = |reason: String| LayoutError::Invalid {
            label: resilience.label(),
            reason,
        };
        let (width, k, split_len, write_need, read_fanout, read_need) = match resilience {
            Resilience::Hydra { k, r, delta, mode } => {
                let (k, r, delta) = (k as usize, r as usize, delta as usize);
                if k == 0 {
                    return Err(bad("k must be at least 1".into()));
                }
                if k + r > MAX_WIDTH {
                    return Err(bad(format!("k + r must be at most {MAX_WIDTH}")));
                }
                if delta > r {
                    return Err(bad(format!(
                        "delta {delta} exceeds r {r}: a read cannot ask more than k + r splits"
                    )));
                }
                let s = PAGE_SIZE.div_ceil(k).next_multiple_of(64);
                let need = match mode {
                    Mode::FailureRecovery => k + r,
                    Mode::EcOnly => k,
                    Mode::Detection => k + delta,
                    Mode::Correction => k + 2 * delta + 1,
                };
                let checks = matches!(mode, Mode::Detection | Mode::Correction);
                if checks && delta == 0 {
                    return Err(bad(format!(
                        "{} needs delta >= 1: the extra splits are what a read checks",
                        if mode == Mode::Detection {
                            "detection"
                        } else {
                            "correction"
                        }
                    )));
                }
                if mode == Mode::Correction && r < 2 * delta + 1 {
                    return Err(bad(format!(
                        "correction of delta = {delta} corrupted splits needs r >= 2 * delta + 1 = {}: \
                         use r = {} or a smaller delta",
                        2 * delta + 1,
                        2 * delta + 1
                    )));
                }
                let read_need = if checks { k + delta } else { k };
                (k + r, k, s, need, k + delta, read_need)
            }
            Resilience::Replication { copies } => {
                let n = copies as usize;
                if n == 0 || n > MAX_WIDTH {
                    return Err(bad(format!("copies must be 1..={MAX_WIDTH}")));
                }
                (n, 1, PAGE_SIZE, n, 1, 1)
            }
            Resilience::Span { k, r } => {
                let (k, r) = (k as usize, r as usize);
                if k == 0 {
                    return Err(bad("k must be at least 1".into()));
                }
                if k + r > MAX_WIDTH {
                    return Err(bad(format!("k + r must be at most {MAX_WIDTH}")));
                }
                // A row is written whole (every split acknowledged); a healthy read asks the
                // one split that is the page.
                (k + r, k, PAGE_SIZE, k + r, 1, 1)
            }
        };
        if slab_size < split_len as u64 {
            return Err(bad(format!(
                "slab size {slab_size} is smaller than one split ({split_len} bytes)"
            )));
        }
        let full_data = if matches!(resilience, Resilience::Replication { .. }) {
            1
        } else if matches!(resilience, Resilience::Span { .. }) {
            // Every piece of a row lands in the side buffer: the caller's page is one of them.
            0
        } else {
            (0..k)
                .take_while(|j| (j + 1) * split_len <= PAGE_SIZE)
                .count()
        };
        Ok(Layout {
            resilience,
            width,
            k,
            split_len,
            full_data,
            write_need,
            read_fanout,
            read_need,
            pages_per_range: slab_size / split_len as u64,
            slab_size,
        })
    }

    /// Whether pages are erasure coded (as opposed to replicated): per page (Hydra) or
    /// across the pages of a row (span).
    pub fn coded(&self) -> bool {
        matches!(
            self.resilience,
            Resilience::Hydra { .. } | Resilience::Span { .. }
        )
    }

    /// Whether this is span coding: the units of this layer are rows of whole pages
    /// ([`crate::span`] maps pages to them), not pages split k ways.
    pub fn span(&self) -> bool {
        matches!(self.resilience, Resilience::Span { .. })
    }

    /// The bytes of this layer's address space for a client of `size` bytes: `size` itself,
    /// or for span the row space, one 4096-byte unit per row. Rows are written whole and never
    /// in place, so the row space has room for every page alone in a row (k times what full
    /// rows need) plus an eighth: a write always finds a free row, even before compaction.
    /// Unused rows cost nothing: a range's slabs are allocated when a row of it is written.
    pub fn space(&self, size: u64) -> u64 {
        if !self.span() {
            return size;
        }
        let pages = size.div_ceil(PAGE_SIZE as u64);
        pages
            .saturating_add(pages / 8)
            .saturating_add(256)
            .saturating_mul(PAGE_SIZE as u64)
    }

    /// Bytes of client address space one address range covers.
    pub fn range_bytes(&self) -> u64 {
        self.pages_per_range * PAGE_SIZE as u64
    }

    /// Whether reads check the splits they get against each other (corruption detection and
    /// correction).
    pub fn detects(&self) -> bool {
        matches!(
            self.resilience,
            Resilience::Hydra {
                mode: Mode::Detection | Mode::Correction,
                ..
            }
        )
    }

    /// Whether reads correct the corrupted splits they detect (corruption correction).
    pub fn corrects(&self) -> bool {
        matches!(
            self.resilience,
            Resilience::Hydra {
                mode: Mode::Correction,
                ..
            }
        )
    }

    /// The Δ of a coded scheme (extra splits a read asks for), 0 for replication.
    pub fn delta(&self) -> usize {
        match self.resilience {
            Resilience::Hydra { delta, .. } => delta as usize,
            Resilience::Replication { .. } | Resilience::Span { .. } => 0,
        }
    }

    /// Size of the per-operation side buffer: padded tail and parity splits, then (detection)
    /// room to re-encode the parity of a read page.
    pub fn side_len(&self) -> usize {
        if self.span() {
            // Parity pieces of a row write; every piece of a degraded read.
            self.width * self.split_len
        } else if self.coded() {
            let check = if self.detects() {
                (self.width - self.k) * self.split_len
            } else {
                0
            };
            self.check_offset() + check
        } else {
            0
        }
    }

    /// Where the re-encoded parity of a detection read starts in the side buffer.
    pub fn check_offset(&self) -> usize {
        (self.width - self.full_data) * self.split_len
    }

    /// Where split `j` lives.
    pub fn place(&self, j: usize) -> Place {
        if !self.coded() {
            Place::Page(0)
        } else if j < self.full_data {
            Place::Page(j * self.split_len)
        } else {
            Place::Side((j - self.full_data) * self.split_len)
        }
    }

    /// The landing region of split `j`: copies of a replicated page share region 0.
    pub fn region(&self, j: usize) -> usize {
        if self.coded() {
            j
        } else {
            0
        }
    }

    /// Byte offset of a page's split inside its slab.
    pub fn split_offset(&self, page_in_range: u64) -> u64 {
        page_in_range * self.split_len as u64
    }

    /// A 16-bit code of the layout stored in slab tags, so that a client reconnecting with other
    /// parameters is told instead of misreading its slabs.
    pub fn code(&self) -> u16 {
        match self.resilience {
            Resilience::Hydra { k, r, .. } => (k as u16) << 8 | r as u16,
            Resilience::Replication { copies } => 0x8000 | copies as u16,
            Resilience::Span { k, r } => 0x4000 | (k as u16) << 8 | r as u16,
        }
    }
}

const TAG_MAGIC: u64 = 0x48;

/// The tag a client gives a slab: which layout, address range and split it holds.
pub fn tag(code: u16, range: u32, split: u8) -> u64 {
    TAG_MAGIC << 56 | (code as u64) << 40 | (range as u64) << 8 | split as u64
}

/// Decodes a tag made by [`tag`]; `None` for tags of unknown shape.
pub fn untag(tag: u64) -> Option<(u16, u32, u8)> {
    if tag >> 56 != TAG_MAGIC {
        return None;
    }
    Some(((tag >> 40) as u16, (tag >> 8) as u32, tag as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hydra(k: u8, r: u8) -> Layout {
        Layout::new(
            Resilience::Hydra {
                k,
                r,
                delta: 1.min(r),
                mode: Mode::FailureRecovery,
            },
            1 << 20,
        )
        .unwrap()
    }

    #[test]
    fn eight_plus_two_is_all_in_page() {
        let l = hydra(8, 2);
        assert_eq!((l.width, l.split_len, l.full_data), (10, 512, 8));
        assert_eq!(l.place(7), Place::Page(3584));
        assert_eq!(l.place(8), Place::Side(0));
        assert_eq!(l.side_len(), 1024);
        assert_eq!(l.range_bytes(), 8 << 20);
        assert_eq!((l.write_need, l.read_fanout, l.read_need), (10, 9, 8));
    }

    #[test]
    fn uneven_k_pads_the_tail_in_the_side_buffer() {
        let l = hydra(6, 3);
        assert_eq!(l.split_len, 704);
        assert_eq!(l.full_data, 5);
        assert_eq!(l.place(5), Place::Side(0));
        assert_eq!(l.side_len(), 4 * 704);
    }

    #[test]
    fn detection_waits_for_k_plus_delta_and_keeps_room_to_re_encode() {
        let det = |delta| {
            Layout::new(
                Resilience::Hydra {
                    k: 8,
                    r: 2,
                    delta,
                    mode: Mode::Detection,
                },
                1 << 20,
            )
        };
        let l = det(1).unwrap();
        assert_eq!((l.write_need, l.read_fanout, l.read_need), (9, 9, 9));
        assert_eq!((l.check_offset(), l.side_len()), (1024, 2048));
        assert!(l.detects() && !hydra(8, 2).detects());
        assert!(det(0).unwrap_err().to_string().contains("delta >= 1"));
    }

    #[test]
    fn correction_writes_k_plus_2_delta_plus_1_and_needs_that_much_parity() {
        let cor = |r, delta| {
            Layout::new(
                Resilience::Hydra {
                    k: 8,
                    r,
                    delta,
                    mode: Mode::Correction,
                },
                1 << 20,
            )
        };
        let l = cor(3, 1).unwrap();
        assert_eq!((l.write_need, l.read_fanout, l.read_need), (11, 9, 9));
        assert!(l.detects() && l.corrects());
        assert!(cor(2, 1)
            .unwrap_err()
            .to_string()
            .contains("r >= 2 * delta + 1"));
        assert!(cor(3, 0).unwrap_err().to_string().contains("delta >= 1"));
    }

    #[test]
    fn a_span_row_is_k_plus_r_whole_pages_all_in_the_side_buffer() {
        let l = Layout::new(Resilience::Span { k: 8, r: 2 }, 1 << 20).unwrap();
        assert_eq!(
            (l.width, l.k, l.split_len, l.write_need, l.read_need),
            (10, 8, 4096, 10, 1)
        );
        assert!(l.span() && l.coded() && !l.detects());
        assert_eq!(l.place(0), Place::Side(0));
        assert_eq!(l.place(9), Place::Side(9 * 4096));
        assert_eq!(l.side_len(), 10 * 4096);
        assert_eq!(l.pages_per_range, 256, "rows per range");
        // Room for every page alone in a row, plus an eighth and 256 rows.
        assert_eq!(l.space(800 * 4096), (800 + 100 + 256) * 4096);
        assert_ne!(l.code(), Layout::new(HYDRA_8_2, 1 << 20).unwrap().code());
        assert!(Layout::new(Resilience::Span { k: 0, r: 2 }, 1 << 20).is_err());
        assert!(Layout::new(Resilience::Span { k: 30, r: 3 }, 1 << 20).is_err());
    }

    const HYDRA_8_2: Resilience = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };

    #[test]
    fn replication_shares_one_region() {
        let l = Layout::new(Resilience::Replication { copies: 3 }, 1 << 20).unwrap();
        assert_eq!(
            (l.width, l.split_len, l.write_need, l.read_need),
            (3, 4096, 3, 1)
        );
        assert_eq!(l.region(2), 0);
        assert_eq!(l.place(2), Place::Page(0));
    }

    #[test]
    fn scheme_names_parse() {
        let hydra = |k, r, delta, mode| Resilience::Hydra { k, r, delta, mode };
        for (name, scheme) in [
            ("hydra-8+2-d1", hydra(8, 2, 1, Mode::FailureRecovery)),
            ("hydra-4+2-d0-ec", hydra(4, 2, 0, Mode::EcOnly)),
            ("hydra-8+1-d1-det", hydra(8, 1, 1, Mode::Detection)),
            ("hydra-8+3-d1-cor", hydra(8, 3, 1, Mode::Correction)),
            ("rep3", Resilience::Replication { copies: 3 }),
            ("single", Resilience::Replication { copies: 1 }),
            ("span-8+2", Resilience::Span { k: 8, r: 2 }),
        ] {
            assert_eq!(name.parse::<Resilience>(), Ok(scheme), "{name}");
            assert_eq!(scheme.to_string(), name);
        }
        // One copy is "single" whichever way it was named.
        assert_eq!("rep1".parse::<Resilience>().unwrap().to_string(), "single");
    }

    #[test]
    fn other_names_are_refused_with_the_forms_that_work() {
        for name in [
            "raid5",
            "",
            "rep",
            "rep+2",
            "rep256",
            "hydra",
            "hydra-8+2",
            "hydra-8-d1",
            "hydra-8+2-d",
            "hydra-+8+2-d1",
            "hydra-8+2-d1-xx",
            "hydra-256+2-d1",
            "Hydra-8+2-d1",
            "hydra-8+2-d1+crc",
            "span-8",
            "span-8+2-d1",
            "span-+8+2",
        ] {
            let e = name.parse::<Resilience>().unwrap_err();
            assert_eq!(e.name, name);
            let text = e.to_string();
            for form in [
                "hydra-K+R-dD",
                "-ec",
                "-det",
                "-cor",
                "span-K+R",
                "repN",
                "single",
            ] {
                assert!(text.contains(form), "{form:?} missing from {text:?}");
            }
        }
    }

    /// Every scheme a layout accepts, by its parameters.
    fn valid_schemes() -> impl Iterator<Item = Resilience> {
        let modes = [
            Mode::FailureRecovery,
            Mode::EcOnly,
            Mode::Detection,
            Mode::Correction,
        ];
        let max = MAX_WIDTH as u8;
        let hydra = (1..=max).flat_map(move |k| {
            (0..=max - k).flat_map(move |r| {
                (0..=r).flat_map(move |delta| {
                    modes.map(|mode| Resilience::Hydra { k, r, delta, mode })
                })
            })
        });
        let copies = (1..=max).map(|copies| Resilience::Replication { copies });
        let span =
            (1..=max).flat_map(move |k| (0..=max - k).map(move |r| Resilience::Span { k, r }));
        hydra
            .chain(copies)
            .chain(span)
            .filter(|s| Layout::new(*s, 1 << 20).is_ok())
    }

    #[test]
    fn every_valid_scheme_reads_back_from_its_name() {
        let mut n = 0;
        for s in valid_schemes() {
            assert_eq!(s.to_string().parse::<Resilience>(), Ok(s));
            n += 1;
        }
        assert!(n > 1000, "{n} valid schemes");
    }

    proptest::proptest! {
        #[test]
        fn any_scheme_reads_back_from_its_name(
            k: u8,
            r: u8,
            delta: u8,
            mode in proptest::sample::select(vec![
                Mode::FailureRecovery,
                Mode::EcOnly,
                Mode::Detection,
                Mode::Correction,
            ]),
            copies: u8,
        ) {
            for s in [
                Resilience::Hydra { k, r, delta, mode },
                Resilience::Replication { copies },
                Resilience::Span { k, r },
            ] {
                proptest::prop_assert_eq!(s.to_string().parse::<Resilience>(), Ok(s));
            }
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        let e = Layout::new(
            Resilience::Hydra {
                k: 8,
                r: 1,
                delta: 2,
                mode: Mode::EcOnly,
            },
            1 << 20,
        );
        assert!(e.unwrap_err().to_string().contains("delta 2 exceeds r 1"));
        assert!(Layout::new(
            Resilience::Hydra {
                k: 0,
                r: 1,
                delta: 0,
                mode: Mode::EcOnly
            },
            1 << 20
        )
        .is_err());
        assert!(Layout::new(Resilience::Replication { copies: 0 }, 1 << 20).is_err());
    }

    #[test]
    fn tags_round_trip() {
        let t = tag(0x0802, 123_456, 9);
        assert_eq!(untag(t), Some((0x0802, 123_456, 9)));
        assert_eq!(untag(7), None);
    }
}
