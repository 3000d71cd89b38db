//! The placement policies a cluster file or command line names: CodingSets (with its
//! load-balancing factor l), EC-Cache and power of two choices, their names and parsing. What
//! each does is the module documentation of [`super`].

/// Placement policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Hydra's CodingSets: disjoint extended groups of `width + l` nodes; a range takes the
    /// `width` least-loaded nodes of one group.
    CodingSets {
        /// Load-balancing factor: spare nodes per extended group (the paper uses 2).
        l: usize,
    },
    /// EC-Cache: `width` nodes uniformly at random per range, load ignored.
    EcCache,
    /// Power of two choices per split (Infiniswap): new nodes first, then the less loaded of
    /// two random candidates.
    PowerOfTwo,
}

/// The name of a policy without its parameters, as the cluster file and the command line
/// spell it: `codingsets`, `ec-cache`, `power-of-two`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// [`Policy::CodingSets`].
    Codingsets,
    /// [`Policy::EcCache`].
    EcCache,
    /// [`Policy::PowerOfTwo`].
    PowerOfTwo,
}

impl PolicyKind {
    /// Every policy, in the order reports list them.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::Codingsets,
        PolicyKind::EcCache,
        PolicyKind::PowerOfTwo,
    ];

    /// The spelling used in cluster files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Codingsets => "codingsets",
            PolicyKind::EcCache => "ec-cache",
            PolicyKind::PowerOfTwo => "power-of-two",
        }
    }

    /// The policy of this kind; `l` is used by CodingSets only.
    pub fn with_l(self, l: usize) -> Policy {
        match self {
            PolicyKind::Codingsets => Policy::CodingSets { l },
            PolicyKind::EcCache => Policy::EcCache,
            PolicyKind::PowerOfTwo => Policy::PowerOfTwo,
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown placement policy {s:?}: use codingsets, ec-cache or power-of-two")
            })
    }
}

impl Policy {
    /// The policy's kind (its name without parameters).
    pub fn kind(self) -> PolicyKind {
        match self {
            Policy::CodingSets { .. } => PolicyKind::Codingsets,
            Policy::EcCache => PolicyKind::EcCache,
            Policy::PowerOfTwo => PolicyKind::PowerOfTwo,
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::CodingSets { l } => write!(f, "codingsets l={l}"),
            other => f.write_str(other.kind().name()),
        }
    }
}
