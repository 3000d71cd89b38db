//! A scheme as `hydramem bench` names and runs it: a store scheme (a resilience scheme, or
//! `ssd-backup`), with per-split checksums or without, with design choices of the data path
//! turned off or not.
//!
//! Its name is the store scheme's name ([`StoreScheme`]'s `FromStr`: `hydra-8+2-d1`,
//! `rep2`, `single`, `ssd-backup`, ...) followed by `+crc` when the client keeps checksums, then by any of
//! `/encode-first`, `/bounce`, `/unbatched` ([`Ablation`], paper Fig. 10), each at most once;
//! parsing a name that [`Display`](fmt::Display) wrote gives the same scheme back.

use std::fmt;
use std::str::FromStr;

use crate::backup::{StoreScheme, StoreSchemeError};
use crate::client::Ablation;

/// One scheme as the benchmark runs it: `hydra-8+2-d1`, `hydra-8+2-d1+crc`, `rep2+crc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchScheme {
    /// The store scheme (the client's resilience scheme is its
    /// [`resilience`](StoreScheme::resilience)).
    pub store: StoreScheme,
    /// Whether the client keeps per-split checksums.
    pub checksums: bool,
    /// Design choices turned off.
    pub ablation: Ablation,
}

/// One of [`Ablation`]'s switches.
type Switch = fn(&mut Ablation) -> &mut bool;

/// The switches of [`Ablation`] by name, in the order names print them.
const SWITCHES: [(&str, Switch); 3] = [
    ("encode-first", |a| &mut a.encode_first),
    ("bounce", |a| &mut a.bounce),
    ("unbatched", |a| &mut a.unbatched),
];

/// The suffix of a [`BenchScheme`]'s name that turns checksums on.
const CHECKSUMS_SUFFIX: &str = "+crc";

/// A benchmark scheme's name that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BenchSchemeError {
    /// The store scheme's name.
    #[error("{0}; each may end in {CHECKSUMS_SUFFIX} for per-split checksums, then in /encode-first, /bounce or /unbatched to turn a design choice off")]
    Scheme(StoreSchemeError),
    /// A design-choice switch.
    #[error("{switch:?} in {name:?} is not a design choice to turn off (once each): use /encode-first, /bounce or /unbatched")]
    Switch {
        /// The whole name.
        name: String,
        /// The switch.
        switch: String,
    },
}

impl FromStr for BenchScheme {
    type Err = BenchSchemeError;

    fn from_str(s: &str) -> Result<BenchScheme, BenchSchemeError> {
        let mut parts = s.split('/');
        let first = parts.next().unwrap_or_default();
        let (name, checksums) = match first.strip_suffix(CHECKSUMS_SUFFIX) {
            Some(name) => (name, true),
            None => (first, false),
        };
        let mut ablation = Ablation::default();
        for part in parts {
            let flag = SWITCHES
                .iter()
                .find(|(n, _)| *n == part)
                .map(|(_, f)| f(&mut ablation))
                .filter(|on| !**on)
                .ok_or_else(|| BenchSchemeError::Switch {
                    name: s.into(),
                    switch: part.into(),
                })?;
            *flag = true;
        }
        Ok(BenchScheme {
            store: name.parse().map_err(BenchSchemeError::Scheme)?,
            checksums,
            ablation,
        })
    }
}

impl fmt::Display for BenchScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = if self.checksums { CHECKSUMS_SUFFIX } else { "" };
        write!(f, "{}{suffix}", self.store)?;
        for name in self.switches() {
            write!(f, "/{name}")?;
        }
        Ok(())
    }
}

impl BenchScheme {
    /// The label of its results: "hydra 8+2 Δ=1", "hydra 8+2 Δ=1 +crc".
    pub fn label(&self) -> String {
        let mut label = match self.checksums {
            true => format!("{} {CHECKSUMS_SUFFIX}", self.store.label()),
            false => self.store.label(),
        };
        for name in self.switches() {
            label.push_str(&format!(" /{name}"));
        }
        label
    }

    /// The names of the switches turned on.
    fn switches(&self) -> impl Iterator<Item = &'static str> + '_ {
        SWITCHES.iter().filter_map(|(name, f)| {
            let mut a = self.ablation;
            (*f(&mut a)).then_some(*name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Mode, Resilience};

    #[test]
    fn names_with_and_without_checksums_read_back() {
        let hydra = Resilience::Hydra {
            k: 8,
            r: 2,
            delta: 1,
            mode: Mode::FailureRecovery,
        };
        let single = Resilience::Replication { copies: 1 };
        for (name, store, checksums, label) in [
            ("hydra-8+2-d1", hydra.into(), false, "hydra 8+2 Δ=1"),
            ("hydra-8+2-d1+crc", hydra.into(), true, "hydra 8+2 Δ=1 +crc"),
            ("single+crc", single.into(), true, "single copy +crc"),
            (
                "ssd-backup",
                StoreScheme::SsdBackup,
                false,
                "single copy + SSD backup",
            ),
        ] {
            let s: BenchScheme = name.parse().unwrap();
            assert_eq!(
                s,
                BenchScheme {
                    store,
                    checksums,
                    ablation: Ablation::default(),
                }
            );
            assert_eq!((s.to_string(), s.label()), (name.into(), label.into()));
        }
    }

    #[test]
    fn design_choices_turned_off_read_back() {
        let s: BenchScheme = "hydra-8+2-d1+crc/unbatched/encode-first".parse().unwrap();
        let want = Ablation {
            encode_first: true,
            bounce: false,
            unbatched: true,
        };
        assert_eq!((s.checksums, s.ablation), (true, want));
        assert_eq!(s.to_string(), "hydra-8+2-d1+crc/encode-first/unbatched");
        assert_eq!(s.label(), "hydra 8+2 Δ=1 +crc /encode-first /unbatched");
        assert_eq!(s.to_string().parse::<BenchScheme>().unwrap(), s);
        for bad in ["rep2/bounce/bounce", "rep2/fast", "rep2/"] {
            let e = bad.parse::<BenchScheme>().unwrap_err();
            assert!(matches!(e, BenchSchemeError::Switch { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("/unbatched"), "{e}");
        }
    }

    #[test]
    fn other_names_are_refused_with_every_form_that_works() {
        for name in ["raid5", "hydra-8+2-d1+crc+crc", "+crc", "hydra-8+2-d1 +crc"] {
            let text = name.parse::<BenchScheme>().unwrap_err().to_string();
            for form in ["hydra-K+R-dD", "repN", "single", "ssd-backup", "+crc"] {
                assert!(text.contains(form), "{form:?} missing from {text:?}");
            }
        }
    }
}
