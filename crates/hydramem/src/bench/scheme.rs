//! A scheme as `hydramem bench` names and runs it: a resilience scheme, with per-split
//! checksums or without.
//!
//! Its name is the resilience scheme's name ([`Resilience`]'s `FromStr`: `hydra-8+2-d1`,
//! `rep2`, `single`, ...) followed by `+crc` when the client keeps checksums; parsing a name
//! that [`Display`](fmt::Display) wrote gives the same scheme back.

use std::fmt;
use std::str::FromStr;

use crate::client::layout::SchemeError;
use crate::client::Resilience;

/// One scheme as the benchmark runs it: `hydra-8+2-d1`, `hydra-8+2-d1+crc`, `rep2+crc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchScheme {
    /// The resilience scheme.
    pub resilience: Resilience,
    /// Whether the client keeps per-split checksums.
    pub checksums: bool,
}

/// The suffix of a [`BenchScheme`]'s name that turns checksums on.
const CHECKSUMS_SUFFIX: &str = "+crc";

/// A benchmark scheme's name that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}; each may end in {CHECKSUMS_SUFFIX} for per-split checksums")]
pub struct BenchSchemeError(pub SchemeError);

impl FromStr for BenchScheme {
    type Err = BenchSchemeError;

    fn from_str(s: &str) -> Result<BenchScheme, BenchSchemeError> {
        let (name, checksums) = match s.strip_suffix(CHECKSUMS_SUFFIX) {
            Some(name) => (name, true),
            None => (s, false),
        };
        Ok(BenchScheme {
            resilience: name.parse().map_err(BenchSchemeError)?,
            checksums,
        })
    }
}

impl fmt::Display for BenchScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = if self.checksums { CHECKSUMS_SUFFIX } else { "" };
        write!(f, "{}{suffix}", self.resilience)
    }
}

impl BenchScheme {
    /// The label of its results: "hydra 8+2 Δ=1", "hydra 8+2 Δ=1 +crc".
    pub fn label(&self) -> String {
        match self.checksums {
            true => format!("{} {CHECKSUMS_SUFFIX}", self.resilience.label()),
            false => self.resilience.label(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Mode;

    #[test]
    fn names_with_and_without_checksums_read_back() {
        let hydra = Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode: Mode::FailureRecovery,
        };
        let single = Resilience::Replication { copies: 1 };
        for (name, resilience, checksums, label) in [
            ("hydra-8+2-d1", hydra, false, "hydra 8+2 Δ=1"),
            ("hydra-8+2-d1+crc", hydra, true, "hydra 8+2 Δ=1 +crc"),
            ("single+crc", single, true, "single copy +crc"),
        ] {
            let s: BenchScheme = name.parse().unwrap();
            assert_eq!(
                s,
                BenchScheme {
                    resilience,
                    checksums
                }
            );
            assert_eq!((s.to_string(), s.label()), (name.into(), label.into()));
        }
    }

    #[test]
    fn other_names_are_refused_with_every_form_that_works() {
        for name in ["raid5", "hydra-8+2-d1+crc+crc", "+crc", "hydra-8+2-d1 +crc"] {
            let text = name.parse::<BenchScheme>().unwrap_err().to_string();
            for form in ["hydra-K+R-dD", "repN", "single", "+crc"] {
                assert!(text.contains(form), "{form:?} missing from {text:?}");
            }
        }
    }
}
