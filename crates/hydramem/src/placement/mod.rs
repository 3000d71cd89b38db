//! Slab placement: which memory nodes hold the `width` slabs of a new address range.
//!
//! # Concept (Hydra §5, CodingSets)
//!
//! An address range is stored on `width` slabs on `width` distinct memory nodes, its *coding
//! group* (`width` = k + r for erasure coding, n for n-way replication). Data is lost when more
//! than `width − k` members of one coding group fail together, so every distinct set of nodes
//! that some coding group uses adds *copysets* (sets of r + 1 nodes whose simultaneous failure
//! loses data). Choosing each group freely among all nodes (EC-Cache) balances load but makes
//! nearly every (r + 1)-subset of the cluster a copyset, so almost any correlated failure loses
//! data.
//!
//! Three policies ([`Policy`]) share this module, so that the client and the simulator
//! (`crate::sim`) run the very same code:
//!
//! * **CodingSets** (Hydra's, the default) partitions the N memory nodes once into disjoint
//!   **extended groups** of `width + l` nodes (`l` = load-balancing factor). A new address range
//!   takes the `width` least-loaded available nodes of *one* extended group. Each extended group
//!   contributes at most C(width + l, r + 1) copysets and groups never share nodes, which cuts
//!   the probability of data loss under correlated failures by about an order of magnitude,
//!   while the `l` spare nodes per group still let the placer steer around loaded nodes.
//! * **EC-Cache** takes `width` nodes uniformly at random for every range, ignoring load (the
//!   baseline of the paper's §7.2).
//! * **Power of two choices** (Infiniswap) picks every split separately: two random candidates,
//!   preferring nodes this placer has not handed out yet, and the less loaded of the two.
//!
//! The rest of this section describes CodingSets; the random policies are described under
//! "Random policies" below.
//!
//! # Invariants
//!
//! * Groups are disjoint and cover all N nodes; every group has at least `width` nodes.
//! * The partition depends only on `width`, `l` and the nodes' failure domains — not on the seed,
//!   loads or availability — so every client built from the same cluster file forms the same
//!   extended groups (clients never coordinate; if each formed its own random partition, the
//!   copysets of all clients would add up).
//! * [`Placer::place`] returns `width` distinct, available nodes of one extended group, never two
//!   in one failure domain, and they are the least-loaded such nodes of that group.
//! * [`Placer::replace`] never returns a member of the coding group, an unavailable node, or a
//!   node in the failure domain of another member. It keeps the coding group inside its extended
//!   group whenever that group has a spare node; only when it has none does it take a node of
//!   another group, which breaks the CodingSets invariant for that one range (it then adds
//!   copysets spanning two extended groups) — availability wins over copyset minimality.
//! * A node that is unavailable is never chosen.
//!
//! # Group formation ([`Placer::new`])
//!
//! G = max(1, ⌊N / (width + l)⌋) groups. Nodes are ordered by failure domain — largest domain
//! first (ties by domain id), nodes of a domain by index, nodes without a domain last, each as
//! its own domain — and dealt round-robin into the G groups. Hence the N mod G leftover nodes
//! join existing groups one each (groups have ⌊N/G⌋ or ⌈N/G⌉ nodes, never fewer than `width`),
//! and each domain is spread over as many groups as possible, so each group spans as many
//! distinct domains as the cluster allows. Without domains, group g is the nodes
//! g, g + G, g + 2G, … (consecutive nodes of the cluster file, often on the same rack, land in
//! different groups).
//!
//! When domains are given and a group spans fewer than `width` distinct domains (a very skewed
//! domain layout), it could never host a range; such groups are merged with each other until
//! they span `width` domains, and a remainder is merged into the smallest group, so no node is
//! left unusable (at the cost of fewer, larger groups). If the whole cluster spans fewer than
//! `width` domains, [`Placer::new`] fails with [`PlacementError::TooFewDomains`].
//!
//! Failure domains: `Some(d)` puts a node in domain `d`; `None` means "unknown", and such a node
//! counts as a domain of its own. If no node has a domain, every node is its own domain and the
//! domain rule reduces to "distinct nodes".
//!
//! # Group choice ([`Placer::place`])
//!
//! The placer picks, among the groups that can host a range (at least `width` available nodes
//! in distinct failure domains), the one with the lowest *fill*: the mean load of its available
//! members (so groups with more or fewer working nodes fill per node evenly). Ties are broken at
//! random. If no group can host, `place` fails: [`PlacementError::TooFewNodes`] when fewer than
//! `width` nodes are available at all, [`PlacementError::TooFewDomains`] when the available
//! nodes span fewer than `width` domains, otherwise [`PlacementError::NoGroupCanHost`]. It never
//! spreads one new range over two extended groups.
//!
//! # Complexity
//!
//! Let s be the group size (≈ width + l) and G the number of groups.
//!
//! * `new`: O(N log N) time, O(N) memory.
//! * `place`: the groups sit in a min-heap keyed by the fill last seen for them, which is a lower
//!   bound of their true fill as long as loads only grow and availability does not change. A
//!   placement pops the heap, recomputes the popped group's fill from `nodes` in O(s), pushes it
//!   back if its fill changed, and otherwise selects in it in O(s log s). When the caller's only
//!   changes are loads growing (e.g. by the slabs it placed), each placement examines O(1)
//!   groups amortised: O(s log s + log G). Every G placements the heap is rebuilt from `nodes`
//!   (O(N), i.e. O(s) amortised per placement), so groups whose load dropped or whose nodes came
//!   back are found again within G placements; [`Placer::refresh`] rebuilds it at once.
//!   Between rebuilds the choice is exactly the emptiest hosting group when loads only grow; a
//!   group whose fill dropped may be passed over until its next examination or rebuild (its
//!   ranges are still placed correctly, just not in the emptiest group). Worst case (many groups
//!   that cannot host, or an error) O(N log s + G log G).
//! * `replace`: O(s · width) in the home group; the fallback walks the heap like `place`.
//!
//! # Random policies (`random.rs`)
//!
//! EC-Cache and power of two choices form no groups ([`Placer::groups`] is empty). For both:
//!
//! * [`Placer::place`] returns `width` distinct available nodes, never two in one failure
//!   domain, chosen split by split; each split's candidates are drawn uniformly among the nodes
//!   still eligible for it (available, not yet in the range, domain not yet used). Without
//!   domains and with every node available, EC-Cache's ranges are therefore uniform random
//!   `width`-subsets, independent of each other — the model behind the closed forms of
//!   `crate::sim::analysis`.
//! * Power of two draws two candidates per split (independently, so they may coincide) and
//!   takes the less loaded (ties at random). Like Infiniswap it prefers nodes that hold none of
//!   this client's slabs yet (`M_new`): while some eligible node is new, both candidates are new
//!   nodes. "Holds none of this client's slabs" is tracked as "never returned by this placer";
//!   [`Placer::forget_history`] clears that memory (the simulator uses it to model a new client).
//! * [`Placer::replace`] keeps each policy's rule: EC-Cache takes a uniformly random eligible
//!   node, power of two the less loaded of two random eligible candidates (new nodes first);
//!   eligible means available, not a member, and not in the domain of another member.
//! * When the available nodes span fewer than `width` failure domains, placement fails with
//!   [`PlacementError::TooFewDomains`] (and [`Placer::new`] does when all nodes do) — as for
//!   CodingSets, a range is never placed with two splits in one domain; the operator must add
//!   domains or lower k + r. With at least `width` domains available a range can always be
//!   completed, so the random policies never fail otherwise.
//! * Cost: a candidate is drawn by rejection (up to 64 uniform draws); only if all are rejected
//!   (most nodes ineligible, e.g. a few huge domains) does it scan all N nodes. So `place` is
//!   O(width²) expected, O(N · width) worst case.
//!
//! # Determinism
//!
//! Everything is a pure function of the arguments and of a [`SmallRng`] seeded from `seed`: the
//! same seed and the same sequence of calls give the same results (on one platform with one
//! version of `rand`). No I/O.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

mod random;

/// What the placer knows about one memory node. Slices of these are indexed by node index
/// 0..N, the order of the cluster file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView {
    /// Whether the node can take new slabs now (reachable, not failed, not draining).
    pub available: bool,
    /// Slabs currently allocated on the node, as the client knows it.
    pub load: u64,
    /// Failure domain (rack, power domain, host, …); `None` = unknown, treated as a domain of
    /// its own.
    pub domain: Option<u32>,
}

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

/// Why a placement could not be made.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlacementError {
    /// The coding-group width is zero.
    #[error(
        "invalid coding-group width 0: an address range needs at least one slab \
         (k + r >= 1 for erasure coding, n >= 1 copies for replication)"
    )]
    ZeroWidth,
    /// Fewer usable memory nodes than slabs per address range.
    #[error(
        "too few memory nodes: an address range needs {needed} distinct memory nodes but only \
         {available} are configured and available; start more memory nodes, bring failed ones \
         back, or use a smaller k + r (or fewer replicas)"
    )]
    TooFewNodes {
        /// Nodes needed (the width).
        needed: usize,
        /// Nodes that exist (at construction) or are available (at placement).
        available: usize,
    },
    /// Fewer distinct failure domains than slabs per address range.
    #[error(
        "too few failure domains: an address range needs {needed} memory nodes in distinct \
         failure domains but the usable nodes span only {available}; add memory nodes in other \
         failure domains, fix the domains in the cluster file, or use a smaller k + r"
    )]
    TooFewDomains {
        /// Distinct domains needed (the width).
        needed: usize,
        /// Distinct domains among the nodes that exist (at construction) or are available (at
        /// placement).
        available: usize,
    },
    /// Enough nodes and domains in the cluster, but no single extended group can host a range.
    #[error(
        "no extended group can host a new address range: it needs {needed} available memory \
         nodes in distinct failure domains within one of the {groups} groups, but the best \
         group offers only {best}; restart failed memory nodes or wait for them to return, or \
         use a smaller l or k + r so that groups have more slack"
    )]
    NoGroupCanHost {
        /// Nodes needed (the width).
        needed: usize,
        /// Number of extended groups.
        groups: usize,
        /// Most available, domain-distinct nodes found in any one group.
        best: usize,
    },
    /// No node can replace a lost member of a coding group.
    #[error(
        "no memory node can replace node {lost}: every available node outside the coding group \
         is in the failure domain of a surviving member (or no node is available); the range \
         stays degraded until memory nodes are added or failed ones return"
    )]
    NoReplacement {
        /// The lost member's node index.
        lost: usize,
    },
    /// The node view does not match the cluster the placer was built for.
    #[error(
        "the node view has {got} entries but the placer was built for {expected} memory nodes; \
         build a new placer when the cluster membership changes"
    )]
    NodeCountMismatch {
        /// Nodes the placer was built for.
        expected: usize,
        /// Entries in the view passed.
        got: usize,
    },
    /// A request names nodes that do not exist or a lost node that is not a member.
    #[error("invalid placement request: {0}")]
    InvalidRequest(String),
}

/// Places the slabs of new address ranges and replacements for lost slabs. See the module
/// documentation for the rules.
#[derive(Debug, Clone)]
pub struct Placer {
    policy: Policy,
    width: usize,
    /// Nodes of the cluster the placer was built for.
    n: usize,
    /// The extended groups, each sorted by node index (CodingSets only; empty otherwise).
    groups: Vec<Vec<usize>>,
    /// Node index → group index (CodingSets only; empty otherwise).
    group_of: Vec<usize>,
    /// Nodes handed out so far (power of two only).
    history: Option<random::History>,
    /// One entry per group, keyed by the fill last seen for it (lazy min-heap).
    heap: BinaryHeap<Reverse<Entry>>,
    rng: SmallRng,
    /// `place` calls since the heap was last rebuilt from a full view.
    since_rebuild: usize,
    scratch: Scratch,
}

/// Reusable buffers, so that placement does not allocate except for its result.
#[derive(Debug, Clone, Default)]
struct Scratch {
    /// (load, random tie-break, node) of the candidates of one group.
    candidates: Vec<(u64, u64, usize)>,
    /// Failure-domain keys already taken.
    used: Vec<u64>,
    /// Nodes picked so far.
    picked: Vec<usize>,
    /// Heap entries popped and to be pushed back.
    aside: Vec<Entry>,
}

/// Fill of a group: the mean load of its available members, kept as an exact fraction.
/// A group without available members is "infinitely full".
#[derive(Debug, Clone, Copy)]
struct Fill {
    sum: u128,
    count: u64,
}

impl Fill {
    fn of(nodes: &[NodeView], members: &[usize]) -> Fill {
        let mut fill = Fill { sum: 0, count: 0 };
        for &i in members {
            let v = &nodes[i];
            if v.available {
                fill.sum += u128::from(v.load);
                fill.count += 1;
            }
        }
        fill
    }

    /// Same sum and count (not merely the same mean).
    fn identical(&self, other: &Fill) -> bool {
        self.sum == other.sum && self.count == other.count
    }
}

impl Ord for Fill {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.count, other.count) {
            (0, 0) => Ordering::Equal,
            (0, _) => Ordering::Greater,
            (_, 0) => Ordering::Less,
            // sum < count · 2^64, so a product is below count_a · count_b · 2^64: it fits in
            // u128 for any group below 2^32 nodes; saturation is only a guard.
            (a, b) => self
                .sum
                .saturating_mul(u128::from(b))
                .cmp(&other.sum.saturating_mul(u128::from(a))),
        }
    }
}

impl PartialOrd for Fill {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Fill {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Fill {}

/// A heap entry: groups ordered by fill, then by a random tie-break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    fill: Fill,
    tie: u64,
    group: usize,
}

/// The failure-domain key of node `i`: its domain, or a key of its own when it has none.
fn domain_key(v: &NodeView, i: usize) -> u64 {
    match v.domain {
        Some(d) => u64::from(d),
        None => (1u64 << 32) + i as u64,
    }
}

/// The checks every policy makes at construction: a positive width, at least `width` nodes,
/// and (when domains are given) at least `width` distinct domains.
fn check_cluster(width: usize, nodes: &[NodeView]) -> Result<(), PlacementError> {
    if width == 0 {
        return Err(PlacementError::ZeroWidth);
    }
    if nodes.len() < width {
        return Err(PlacementError::TooFewNodes {
            needed: width,
            available: nodes.len(),
        });
    }
    if nodes.iter().any(|v| v.domain.is_some()) {
        let domains: HashSet<u64> = nodes
            .iter()
            .enumerate()
            .map(|(i, v)| domain_key(v, i))
            .collect();
        if domains.len() < width {
            return Err(PlacementError::TooFewDomains {
                needed: width,
                available: domains.len(),
            });
        }
    }
    Ok(())
}

/// Partitions the nodes into extended groups (see the module documentation).
fn form_groups(
    width: usize,
    l: usize,
    nodes: &[NodeView],
) -> Result<Vec<Vec<usize>>, PlacementError> {
    check_cluster(width, nodes)?;
    let n = nodes.len();
    let keys: Vec<u64> = nodes
        .iter()
        .enumerate()
        .map(|(i, v)| domain_key(v, i))
        .collect();
    let have_domains = nodes.iter().any(|v| v.domain.is_some());

    // Nodes sorted by (domain key, index); runs of equal keys are the domains.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| (keys[i], i));
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (start, len) in `order`
    let mut start = 0;
    for pos in 1..=n {
        if pos == n || keys[order[pos]] != keys[order[start]] {
            runs.push((start, pos - start));
            start = pos;
        }
    }
    // Largest domain first; the stable sort keeps ties in key order (unknown domains last).
    runs.sort_by_key(|&(_, len)| Reverse(len));

    let g = (n / width.saturating_add(l)).max(1);
    let mut groups: Vec<Vec<usize>> = (0..g).map(|_| Vec::with_capacity(n / g + 1)).collect();
    let dealt = runs
        .iter()
        .flat_map(|&(start, len)| order[start..start + len].iter().copied());
    for (pos, i) in dealt.enumerate() {
        groups[pos % g].push(i);
    }

    if have_domains {
        groups = merge_deficient(groups, &keys, width);
    }
    for group in &mut groups {
        group.sort_unstable();
    }
    Ok(groups)
}

/// Merges groups spanning fewer than `width` domains until every group spans `width` domains.
/// Requires the union of all groups to span at least `width` domains.
fn merge_deficient(groups: Vec<Vec<usize>>, keys: &[u64], width: usize) -> Vec<Vec<usize>> {
    let distinct = |members: &[usize]| -> usize {
        let mut k: Vec<u64> = members.iter().map(|&i| keys[i]).collect();
        k.sort_unstable();
        k.dedup();
        k.len()
    };
    let (mut out, deficient): (Vec<_>, Vec<_>) =
        groups.into_iter().partition(|g| distinct(g) >= width);
    let mut pending: Vec<usize> = Vec::new();
    let mut pending_domains: HashSet<u64> = HashSet::new();
    for group in deficient {
        pending_domains.extend(group.iter().map(|&i| keys[i]));
        pending.extend(group);
        if pending_domains.len() >= width {
            out.push(std::mem::take(&mut pending));
            pending_domains.clear();
        }
    }
    if !pending.is_empty() {
        match out.iter_mut().min_by_key(|g| g.len()) {
            Some(smallest) => smallest.extend(pending),
            None => out.push(pending),
        }
    }
    out
}

/// The `width` least-loaded available members of `members`, at most one per failure domain,
/// into `scratch.picked` (fewer if the group cannot host). Ties are broken at random.
fn pick_least_loaded(
    nodes: &[NodeView],
    members: &[usize],
    width: usize,
    rng: &mut SmallRng,
    scratch: &mut Scratch,
) {
    scratch.candidates.clear();
    scratch.used.clear();
    scratch.picked.clear();
    for &i in members {
        let v = &nodes[i];
        if v.available {
            scratch.candidates.push((v.load, rng.next_u64(), i));
        }
    }
    scratch.candidates.sort_unstable();
    // Greedy on a partition matroid (one node per domain): minimal total load, and every
    // skipped node is in the domain of a chosen node that is no more loaded.
    for &(_, _, i) in &scratch.candidates {
        if scratch.picked.len() == width {
            break;
        }
        let key = domain_key(&nodes[i], i);
        if scratch.used.contains(&key) {
            continue;
        }
        scratch.used.push(key);
        scratch.picked.push(i);
    }
}

/// The least-loaded member of `members` accepted by `eligible`; ties at random.
fn least_loaded_eligible(
    nodes: &[NodeView],
    members: &[usize],
    eligible: impl Fn(usize) -> bool,
    rng: &mut SmallRng,
) -> Option<usize> {
    let mut best: Option<(u64, u64, usize)> = None;
    for &i in members {
        if !eligible(i) {
            continue;
        }
        let candidate = (nodes[i].load, rng.next_u64(), i);
        if best.is_none_or(|b| candidate < b) {
            best = Some(candidate);
        }
    }
    best.map(|(_, _, i)| i)
}

impl Placer {
    /// A placer for the N nodes of `nodes` (`width` = k + r for erasure coding, n for n-way
    /// replication). CodingSets partitions them into disjoint extended groups of `width + l`
    /// nodes; leftover nodes join existing groups. The random policies form no groups.
    ///
    /// Only the nodes' failure domains shape the groups (availability and load do not), so
    /// clients with the same cluster file form the same groups; `seed` drives every random
    /// choice (tie-breaking, and the random policies' draws).
    ///
    /// Errors: [`PlacementError::ZeroWidth`]; [`PlacementError::TooFewNodes`] when N < `width`;
    /// [`PlacementError::TooFewDomains`] when domains are given and the nodes span fewer than
    /// `width` of them.
    pub fn new(
        policy: Policy,
        width: usize,
        nodes: &[NodeView],
        seed: u64,
    ) -> Result<Placer, PlacementError> {
        let (groups, history) = match policy {
            Policy::CodingSets { l } => (form_groups(width, l, nodes)?, None),
            Policy::EcCache => {
                check_cluster(width, nodes)?;
                (Vec::new(), None)
            }
            Policy::PowerOfTwo => {
                check_cluster(width, nodes)?;
                (Vec::new(), Some(random::History::new(nodes.len())))
            }
        };
        let mut group_of = vec![0; if groups.is_empty() { 0 } else { nodes.len() }];
        for (g, members) in groups.iter().enumerate() {
            for &i in members {
                group_of[i] = g;
            }
        }
        let mut placer = Placer {
            policy,
            width,
            n: nodes.len(),
            groups,
            group_of,
            history,
            heap: BinaryHeap::new(),
            rng: SmallRng::seed_from_u64(seed),
            since_rebuild: 0,
            scratch: Scratch::default(),
        };
        placer.rebuild(nodes);
        Ok(placer)
    }

    /// Nodes for a new address range: `width` distinct, available node indices, never two in
    /// the same failure domain, returned in split order 0..width.
    ///
    /// CodingSets: all from one extended group, the `width` least-loaded available nodes of
    /// that group (ties broken at random, least loaded first). The group is the one with the
    /// lowest fill (mean load of its available members) among those that can host a range;
    /// ties at random. EC-Cache and power of two: see the module documentation.
    ///
    /// The caller is expected to count the new slabs in the loads it passes next time; the
    /// placer keeps no load of its own.
    ///
    /// Errors: [`PlacementError::NodeCountMismatch`] if `nodes` is not the view of the N nodes
    /// the placer was built for; [`PlacementError::TooFewNodes`],
    /// [`PlacementError::TooFewDomains`] or [`PlacementError::NoGroupCanHost`] when no group
    /// has `width` available nodes in distinct domains.
    ///
    /// Cost: O(s log s + log G) amortised for CodingSets, O(width²) expected for the random
    /// policies (see the module documentation).
    pub fn place(&mut self, nodes: &[NodeView]) -> Result<Vec<usize>, PlacementError> {
        self.check_len(nodes)?;
        if !matches!(self.policy, Policy::CodingSets { .. }) {
            let prefer_low_load = self.policy == Policy::PowerOfTwo;
            let mut picked = Vec::with_capacity(self.width);
            let mut used = Vec::with_capacity(self.width);
            for _ in 0..self.width {
                let eligible = |i: usize| {
                    nodes[i].available
                        && !picked.contains(&i)
                        && !used.contains(&domain_key(&nodes[i], i))
                };
                let Some(i) = random::choose(
                    nodes,
                    &eligible,
                    prefer_low_load,
                    self.history.as_ref(),
                    &mut self.rng,
                ) else {
                    return Err(self.diagnose(nodes, picked.len()));
                };
                used.push(domain_key(&nodes[i], i));
                picked.push(i);
            }
            if let Some(h) = self.history.as_mut() {
                picked.iter().for_each(|&i| h.mark(i));
            }
            return Ok(picked);
        }
        self.since_rebuild += 1;
        if self.since_rebuild > self.groups.len() {
            self.rebuild(nodes);
        }
        let width = self.width;
        let mut best = 0;
        let found = self.walk_groups(nodes, None, |members, rng, scratch| {
            pick_least_loaded(nodes, members, width, rng, scratch);
            if scratch.picked.len() == width {
                Some(scratch.picked.clone())
            } else {
                best = best.max(scratch.picked.len());
                None
            }
        });
        found.ok_or_else(|| self.diagnose(nodes, best))
    }

    /// A replacement for member `lost` (a node index that appears in `current`) of the coding
    /// group `current` (node indices in split order), after a failure or an eviction: an
    /// available node that is not in `current` and not in the failure domain of another
    /// member (it may share the lost node's domain).
    ///
    /// CodingSets prefers the extended group of the coding group (the group holding most of
    /// `current`, the lost node's group on a tie), taking its least-loaded eligible node (ties
    /// at random). Only when that group has no eligible spare — always the case when l = 0 and
    /// the group has no leftover nodes — it falls back to the least-filled other group that has
    /// one; that breaks the CodingSets invariant for this range (its nodes then span two
    /// extended groups, adding copysets) in exchange for restoring its redundancy.
    /// EC-Cache takes a uniformly random eligible node; power of two the less loaded of two
    /// random eligible candidates, nodes new to this placer first.
    ///
    /// Errors: [`PlacementError::NodeCountMismatch`]; [`PlacementError::InvalidRequest`] when
    /// `current` names a node ≥ N or `lost` is not in `current`;
    /// [`PlacementError::NoReplacement`] when no node in the cluster is eligible.
    ///
    /// Cost: O(s · width) in the home group; the fallback walks groups like [`Placer::place`].
    pub fn replace(
        &mut self,
        nodes: &[NodeView],
        current: &[usize],
        lost: usize,
    ) -> Result<usize, PlacementError> {
        self.check_len(nodes)?;
        let n = nodes.len();
        if let Some(&bad) = current.iter().find(|&&i| i >= n) {
            return Err(PlacementError::InvalidRequest(format!(
                "coding group names node {bad}, but the cluster has only {n} memory nodes"
            )));
        }
        if !current.contains(&lost) {
            return Err(PlacementError::InvalidRequest(format!(
                "node {lost} is not a member of the coding group {current:?}"
            )));
        }
        let forbidden: Vec<u64> = current
            .iter()
            .filter(|&&i| i != lost)
            .map(|&i| domain_key(&nodes[i], i))
            .collect();
        let eligible = |i: usize| {
            nodes[i].available
                && !current.contains(&i)
                && !forbidden.contains(&domain_key(&nodes[i], i))
        };

        if !matches!(self.policy, Policy::CodingSets { .. }) {
            let prefer_low_load = self.policy == Policy::PowerOfTwo;
            let chosen = random::choose(
                nodes,
                &eligible,
                prefer_low_load,
                self.history.as_ref(),
                &mut self.rng,
            )
            .ok_or(PlacementError::NoReplacement { lost })?;
            if let Some(h) = self.history.as_mut() {
                h.mark(chosen);
            }
            return Ok(chosen);
        }
        let home = self.home_group(current, lost);
        if let Some(i) = least_loaded_eligible(nodes, &self.groups[home], eligible, &mut self.rng) {
            return Ok(i);
        }
        self.walk_groups(nodes, Some(home), |members, rng, _| {
            least_loaded_eligible(nodes, members, eligible, rng)
        })
        .ok_or(PlacementError::NoReplacement { lost })
    }

    /// The extended groups, each sorted by node index (for status and simulation); empty for
    /// the random policies, which form no groups.
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.groups
    }

    /// The index in [`Placer::groups`] of the extended group of `node`, if it exists (never
    /// for the random policies).
    pub fn group_of(&self, node: usize) -> Option<usize> {
        self.group_of.get(node).copied()
    }

    /// Slabs per address range (k + r, or n for replication).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The policy the placer was built with.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Memory nodes of the cluster the placer was built for.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// Re-reads every group's fill from `nodes` (O(N)). `place` does this by itself every G
    /// placements; call it after loads dropped (slabs freed) or nodes came back to make the
    /// very next placement exact again. The random policies keep no cached view: for them it
    /// only checks the length.
    pub fn refresh(&mut self, nodes: &[NodeView]) -> Result<(), PlacementError> {
        self.check_len(nodes)?;
        self.rebuild(nodes);
        Ok(())
    }

    /// Forgets which nodes this placer has handed out, so that power of two prefers all nodes
    /// alike again (no effect on the other policies). A client never needs it; the simulator
    /// reuses one placer for many simulated clients and calls it between them. O(nodes handed
    /// out since the last call).
    pub fn forget_history(&mut self) {
        if let Some(h) = self.history.as_mut() {
            h.forget();
        }
    }

    fn check_len(&self, nodes: &[NodeView]) -> Result<(), PlacementError> {
        if nodes.len() == self.n {
            Ok(())
        } else {
            Err(PlacementError::NodeCountMismatch {
                expected: self.n,
                got: nodes.len(),
            })
        }
    }

    /// Rebuilds the heap from a full view: O(N + G).
    fn rebuild(&mut self, nodes: &[NodeView]) {
        let rng = &mut self.rng;
        let entries: Vec<Reverse<Entry>> = self
            .groups
            .iter()
            .enumerate()
            .map(|(group, members)| {
                Reverse(Entry {
                    fill: Fill::of(nodes, members),
                    tie: rng.next_u64(),
                    group,
                })
            })
            .collect();
        self.heap = BinaryHeap::from(entries);
        self.since_rebuild = 0;
    }

    /// Visits groups in increasing fill (ties at random), skipping `skip`, until `visit`
    /// returns a value. A popped group whose fill changed since it was pushed is pushed back
    /// with its current fill instead of being visited, so a group is visited only once its
    /// heap key is up to date. Every group is back in the heap on return.
    fn walk_groups<T>(
        &mut self,
        nodes: &[NodeView],
        skip: Option<usize>,
        mut visit: impl FnMut(&[usize], &mut SmallRng, &mut Scratch) -> Option<T>,
    ) -> Option<T> {
        let Placer {
            groups,
            heap,
            rng,
            scratch,
            ..
        } = self;
        let mut aside = std::mem::take(&mut scratch.aside);
        let mut result = None;
        while let Some(Reverse(entry)) = heap.pop() {
            if Some(entry.group) == skip {
                aside.push(entry);
                continue;
            }
            let members = &groups[entry.group];
            let fill = Fill::of(nodes, members);
            if !fill.identical(&entry.fill) {
                heap.push(Reverse(Entry {
                    fill,
                    tie: rng.next_u64(),
                    group: entry.group,
                }));
                continue;
            }
            aside.push(entry);
            if let Some(found) = visit(members, rng, scratch) {
                result = Some(found);
                break;
            }
        }
        for entry in aside.drain(..) {
            heap.push(Reverse(Entry {
                tie: rng.next_u64(),
                ..entry
            }));
        }
        scratch.aside = aside;
        result
    }

    /// The extended group holding most members of `current`; the lost node's group on a tie.
    fn home_group(&self, current: &[usize], lost: usize) -> usize {
        let count = |g: usize| current.iter().filter(|&&i| self.group_of[i] == g).count();
        let mut home = self.group_of[lost];
        let mut home_count = count(home);
        for &i in current {
            let g = self.group_of[i];
            let c = count(g);
            if c > home_count {
                home = g;
                home_count = c;
            }
        }
        home
    }

    /// The most specific reason why no group could host a range (O(N)).
    fn diagnose(&self, nodes: &[NodeView], best: usize) -> PlacementError {
        let available = nodes.iter().filter(|v| v.available).count();
        if available < self.width {
            return PlacementError::TooFewNodes {
                needed: self.width,
                available,
            };
        }
        let domains: HashSet<u64> = nodes
            .iter()
            .enumerate()
            .filter(|(_, v)| v.available)
            .map(|(i, v)| domain_key(v, i))
            .collect();
        if domains.len() < self.width {
            return PlacementError::TooFewDomains {
                needed: self.width,
                available: domains.len(),
            };
        }
        PlacementError::NoGroupCanHost {
            needed: self.width,
            groups: self.groups.len(),
            best,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` available nodes with no load and no domain.
    pub(super) fn up(n: usize) -> Vec<NodeView> {
        vec![
            NodeView {
                available: true,
                load: 0,
                domain: None,
            };
            n
        ]
    }

    fn coding_sets(l: usize) -> Policy {
        Policy::CodingSets { l }
    }

    /// Checks the partition invariants: disjoint, covering, every group ≥ width.
    fn assert_partition(p: &Placer, n: usize) {
        let mut seen = vec![false; n];
        for (g, members) in p.groups().iter().enumerate() {
            assert!(members.len() >= p.width(), "group {g} smaller than width");
            for &i in members {
                assert!(!seen[i], "node {i} in two groups");
                seen[i] = true;
                assert_eq!(p.group_of(i), Some(g));
            }
        }
        assert!(seen.iter().all(|&s| s), "some node in no group");
    }

    #[test]
    fn one_group_for_12_nodes_width_10_l_2() {
        let nodes = up(12);
        let p = Placer::new(coding_sets(2), 10, &nodes, 1).unwrap();
        assert_eq!(p.groups(), &[(0..12).collect::<Vec<_>>()]);
    }

    #[test]
    fn groups_are_dealt_round_robin() {
        let nodes = up(24);
        let p = Placer::new(coding_sets(2), 10, &nodes, 1).unwrap();
        let even: Vec<usize> = (0..24).step_by(2).collect();
        let odd: Vec<usize> = (1..24).step_by(2).collect();
        assert_eq!(p.groups(), &[even, odd]);
    }

    #[test]
    fn leftovers_join_existing_groups() {
        // 27 = 2 × 12 + 3: two groups of 14 and 13.
        let p = Placer::new(coding_sets(2), 10, &up(27), 1).unwrap();
        let sizes: Vec<usize> = p.groups().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![14, 13]);
        assert_partition(&p, 27);
        // Fewer nodes than width + l but at least width: one group of all.
        let p = Placer::new(coding_sets(2), 10, &up(11), 1).unwrap();
        assert_eq!(p.groups().len(), 1);
        assert_eq!(p.groups()[0].len(), 11);
        // 35 = 2 × 12 + 11: never a group of 11 < width + l, two groups of 18 and 17.
        let p = Placer::new(coding_sets(2), 10, &up(35), 1).unwrap();
        let sizes: Vec<usize> = p.groups().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![18, 17]);
    }

    #[test]
    fn construction_errors() {
        assert_eq!(
            Placer::new(coding_sets(2), 10, &up(9), 1).unwrap_err(),
            PlacementError::TooFewNodes {
                needed: 10,
                available: 9
            }
        );
        assert_eq!(
            Placer::new(coding_sets(2), 0, &up(9), 1).unwrap_err(),
            PlacementError::ZeroWidth
        );
        let mut nodes = up(12);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some((i % 3) as u32);
        }
        let err = Placer::new(coding_sets(0), 4, &nodes, 1).unwrap_err();
        assert_eq!(
            err,
            PlacementError::TooFewDomains {
                needed: 4,
                available: 3
            }
        );
        assert!(err.to_string().contains("failure domains"));
    }

    #[test]
    fn groups_span_distinct_domains() {
        // 4 racks of 6 consecutive nodes; width 3, l 1: 6 groups, each spanning all 4 racks.
        let mut nodes = up(24);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some((i / 6) as u32);
        }
        let mut p = Placer::new(coding_sets(1), 3, &nodes, 7).unwrap();
        assert_eq!(p.groups().len(), 6);
        for members in p.groups() {
            let mut d: Vec<_> = members.iter().map(|&i| nodes[i].domain).collect();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 4, "group {members:?}");
        }
        for _ in 0..50 {
            let chosen = p.place(&nodes).unwrap();
            let mut d: Vec<_> = chosen.iter().map(|&i| nodes[i].domain).collect();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3);
            for i in chosen {
                nodes[i].load += 1;
            }
        }
    }

    #[test]
    fn skewed_domains_merge_groups_so_every_group_can_host() {
        // Domain 0 has 20 nodes, domains 1 and 2 one each; width 3, l 0 → 7 dealt groups, only
        // two of which see domains 1 and 2; the rest are merged.
        let mut nodes = up(22);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some(match i {
                20 => 1,
                21 => 2,
                _ => 0,
            });
        }
        let mut p = Placer::new(coding_sets(0), 3, &nodes, 1).unwrap();
        assert_partition(&p, 22);
        assert_eq!(p.groups().len(), 1);
        let chosen = p.place(&nodes).unwrap();
        let mut d: Vec<_> = chosen.iter().map(|&i| nodes[i].domain).collect();
        d.sort();
        assert_eq!(d, vec![Some(0), Some(1), Some(2)]);
    }

    #[test]
    fn place_skips_a_group_that_lost_its_domains_and_errors_when_none_can() {
        // Two groups of 4 over domains 0..4 (node i in domain i % 4), width 3, l 1.
        let mut nodes = up(8);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some((i % 4) as u32);
        }
        let mut p = Placer::new(coding_sets(1), 3, &nodes, 3).unwrap();
        assert_eq!(p.groups().len(), 2);
        let g0 = p.groups()[0].clone();
        let g1 = p.groups()[1].clone();
        // Group 0 is emptier but has only 2 available nodes.
        for &i in &g1 {
            nodes[i].load = 100;
        }
        nodes[g0[0]].available = false;
        nodes[g0[1]].available = false;
        let chosen = p.place(&nodes).unwrap();
        assert!(chosen.iter().all(|i| g1.contains(i)));
        // Now group 1 loses two nodes: 4 available nodes in 4 domains, but no group can host.
        nodes[g1[2]].available = false;
        nodes[g1[3]].available = false;
        let err = p.place(&nodes).unwrap_err();
        assert_eq!(
            err,
            PlacementError::NoGroupCanHost {
                needed: 3,
                groups: 2,
                best: 2
            }
        );
        // Only 2 nodes left anywhere.
        nodes[g1[0]].available = false;
        nodes[g1[1]].available = false;
        assert_eq!(
            p.place(&nodes).unwrap_err(),
            PlacementError::TooFewNodes {
                needed: 3,
                available: 2
            }
        );
    }

    #[test]
    fn place_too_few_available_domains() {
        let mut nodes = up(6);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some((i % 3) as u32);
        }
        let mut p = Placer::new(coding_sets(3), 3, &nodes, 3).unwrap();
        nodes[2].available = false;
        nodes[5].available = false;
        assert_eq!(
            p.place(&nodes).unwrap_err(),
            PlacementError::TooFewDomains {
                needed: 3,
                available: 2
            }
        );
    }

    #[test]
    fn takes_the_least_loaded_available_nodes() {
        let mut nodes = up(12);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.load = 100 - i as u64;
        }
        nodes[11].available = false;
        nodes[10].available = false;
        let mut p = Placer::new(coding_sets(2), 10, &nodes, 5).unwrap();
        let chosen = p.place(&nodes).unwrap();
        assert_eq!(chosen, (0..10).rev().collect::<Vec<_>>());
    }

    #[test]
    fn fills_the_emptiest_group() {
        let mut nodes = up(36);
        let mut p = Placer::new(coding_sets(2), 10, &nodes, 9).unwrap();
        assert_eq!(p.groups().len(), 3);
        for &i in &p.groups()[0] {
            nodes[i].load = 5;
        }
        for &i in &p.groups()[2] {
            nodes[i].load = 3;
        }
        let chosen = p.place(&nodes).unwrap();
        assert_eq!(p.group_of(chosen[0]), Some(1));
        // Loads dropped in group 0: an explicit refresh makes the next placement see it.
        for &i in &p.groups()[0].clone() {
            nodes[i].load = 0;
        }
        for &i in &p.groups()[1].clone() {
            nodes[i].load = 9;
        }
        p.refresh(&nodes).unwrap();
        let chosen = p.place(&nodes).unwrap();
        assert_eq!(p.group_of(chosen[0]), Some(0));
    }

    #[test]
    fn ties_are_broken_at_random() {
        // Equal loads everywhere: the group and the nodes vary between calls and seeds.
        let nodes = up(36);
        let mut p = Placer::new(coding_sets(2), 10, &nodes, 4).unwrap();
        let mut groups_hit = HashSet::new();
        let mut sets = HashSet::new();
        for _ in 0..30 {
            let mut chosen = p.place(&nodes).unwrap();
            groups_hit.insert(p.group_of(chosen[0]).unwrap());
            chosen.sort_unstable();
            sets.insert(chosen);
        }
        assert_eq!(groups_hit.len(), 3);
        assert!(sets.len() > 3);
        let firsts: HashSet<Vec<usize>> = (0..16)
            .map(|seed| {
                Placer::new(coding_sets(2), 10, &nodes, seed)
                    .unwrap()
                    .place(&nodes)
                    .unwrap()
            })
            .collect();
        assert!(firsts.len() > 1);
    }

    #[test]
    fn node_count_must_match() {
        let mut p = Placer::new(coding_sets(2), 10, &up(12), 1).unwrap();
        assert_eq!(
            p.place(&up(13)).unwrap_err(),
            PlacementError::NodeCountMismatch {
                expected: 12,
                got: 13
            }
        );
        assert!(p.replace(&up(11), &[0], 0).is_err());
    }

    #[test]
    fn replace_prefers_the_extended_group() {
        let mut nodes = up(24);
        let mut p = Placer::new(coding_sets(2), 10, &nodes, 11).unwrap();
        let current = p.place(&nodes).unwrap();
        let g = p.group_of(current[0]).unwrap();
        let spares: Vec<usize> = p.groups()[g]
            .iter()
            .copied()
            .filter(|i| !current.contains(i))
            .collect();
        assert_eq!(spares.len(), 2);
        nodes[spares[0]].load = 3;
        nodes[spares[1]].load = 2;
        nodes[current[4]].available = false;
        assert_eq!(p.replace(&nodes, &current, current[4]), Ok(spares[1]));
        // No spare left in the group: falls back to another group.
        nodes[spares[1]].available = false;
        nodes[spares[0]].available = false;
        let r = p.replace(&nodes, &current, current[4]).unwrap();
        assert_ne!(p.group_of(r), Some(g));
        assert!(nodes[r].available && !current.contains(&r));
    }

    #[test]
    fn replace_with_l_0_falls_back_and_respects_domains() {
        // Two groups of 3 (width 3, l 0), node i in domain i % 3.
        let mut nodes = up(6);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.domain = Some((i % 3) as u32);
        }
        let mut p = Placer::new(coding_sets(0), 3, &nodes, 2).unwrap();
        let current = p.place(&nodes).unwrap();
        let lost = current[0];
        nodes[lost].available = false;
        let r = p.replace(&nodes, &current, lost).unwrap();
        // Only the node of the other group in the lost node's domain is eligible.
        assert_eq!(nodes[r].domain, nodes[lost].domain);
        assert_ne!(r, lost);
        nodes[r].available = false;
        assert_eq!(
            p.replace(&nodes, &current, lost),
            Err(PlacementError::NoReplacement { lost })
        );
        assert!(matches!(
            p.replace(&nodes, &current, 99),
            Err(PlacementError::InvalidRequest(_))
        ));
        assert!(matches!(
            p.replace(&nodes, &[0, 77], 0),
            Err(PlacementError::InvalidRequest(_))
        ));
    }

    #[test]
    fn random_policies_check_the_cluster_and_form_no_groups() {
        for policy in [Policy::EcCache, Policy::PowerOfTwo] {
            assert_eq!(
                Placer::new(policy, 0, &up(5), 1).unwrap_err(),
                PlacementError::ZeroWidth
            );
            assert_eq!(
                Placer::new(policy, 6, &up(5), 1).unwrap_err(),
                PlacementError::TooFewNodes {
                    needed: 6,
                    available: 5
                }
            );
            let mut nodes = up(12);
            for (i, v) in nodes.iter_mut().enumerate() {
                v.domain = Some((i % 3) as u32);
            }
            assert_eq!(
                Placer::new(policy, 4, &nodes, 1).unwrap_err(),
                PlacementError::TooFewDomains {
                    needed: 4,
                    available: 3
                }
            );
            let mut p = Placer::new(policy, 3, &nodes, 1).unwrap();
            assert!(p.groups().is_empty());
            assert_eq!(p.group_of(0), None);
            assert_eq!(p.policy(), policy);
            // Three domains, one of them down: no range can be placed.
            for v in nodes.iter_mut().filter(|v| v.domain == Some(1)) {
                v.available = false;
            }
            assert_eq!(
                p.place(&nodes).unwrap_err(),
                PlacementError::TooFewDomains {
                    needed: 3,
                    available: 2
                }
            );
            assert!(p.place(&up(11)).is_err());
        }
    }

    #[test]
    fn ec_cache_ignores_load_and_spreads_uniformly() {
        // 20 nodes, width 4, loads never updated and skewed: each node is still in 1/5 of the
        // ranges (1000 of 5000, standard deviation about 28).
        let mut nodes = up(20);
        for (i, v) in nodes.iter_mut().enumerate() {
            v.load = (i * i) as u64;
        }
        let mut p = Placer::new(Policy::EcCache, 4, &nodes, 8).unwrap();
        let mut hits = [0u32; 20];
        for _ in 0..5000 {
            for i in p.place(&nodes).unwrap() {
                hits[i] += 1;
            }
        }
        assert!(hits.iter().all(|&h| (860..=1140).contains(&h)), "{hits:?}");
    }

    #[test]
    fn power_of_two_balances_better_than_ec_cache() {
        // 200 nodes, width 10, 400 ranges (20 slabs per node on average), one client per range.
        let spread = |policy| {
            let mut nodes = up(200);
            let mut p = Placer::new(policy, 10, &nodes, 4).unwrap();
            for _ in 0..400 {
                p.forget_history();
                for i in p.place(&nodes).unwrap() {
                    nodes[i].load += 1;
                }
            }
            nodes.iter().map(|v| v.load).max().unwrap()
        };
        let ec = spread(Policy::EcCache);
        let two = spread(Policy::PowerOfTwo);
        assert!(two < ec, "power of two max {two}, EC-Cache max {ec}");
        assert!(two <= 25, "power of two max {two} for a mean of 20");
    }

    #[test]
    fn policy_names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
            assert_eq!(kind.with_l(3).kind(), kind);
        }
        assert_eq!(Policy::CodingSets { l: 2 }.to_string(), "codingsets l=2");
        assert_eq!(Policy::PowerOfTwo.to_string(), "power-of-two");
        let e = "copysets".parse::<PolicyKind>().unwrap_err();
        assert!(e.contains("codingsets, ec-cache or power-of-two"), "{e}");
    }

    #[test]
    fn large_cluster_places_quickly() {
        // 1,000,000 nodes, 8 + 2 with l = 2: 83,333 groups; 200,000 placements.
        let n = 1_000_000;
        let mut nodes = up(n);
        let mut p = Placer::new(coding_sets(2), 10, &nodes, 42).unwrap();
        for _ in 0..200_000 {
            for i in p.place(&nodes).unwrap() {
                nodes[i].load += 1;
            }
        }
        let total: u64 = nodes.iter().map(|v| v.load).sum();
        assert_eq!(total, 2_000_000);
        // Every group got 2 or 3 ranges' worth, i.e. ≤ one range apart.
        let loads: Vec<u64> = p
            .groups()
            .iter()
            .map(|m| m.iter().map(|&i| nodes[i].load).sum())
            .collect();
        let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
        assert!(max - min <= 10, "min {min} max {max}");
    }

    // ---- property tests ----

    /// A random cluster: width, l, node views (random loads, availability and domains).
    fn cluster() -> impl Strategy<Value = (usize, usize, Vec<NodeView>, u64)> {
        (1usize..=16, 0usize..4)
            .prop_flat_map(|(width, l)| {
                (
                    Just(width),
                    Just(l),
                    width..300usize,
                    0u8..3,   // 0: no domains, 1: all domains, 2: mixed
                    1u32..40, // number of domains
                    any::<u64>(),
                )
            })
            .prop_flat_map(|(width, l, n, mode, nd, seed)| {
                let node = (
                    proptest::bool::weighted(0.85),
                    0u64..20,
                    0..nd,
                    any::<bool>(),
                )
                    .prop_map(move |(available, load, d, known)| NodeView {
                        available,
                        load,
                        domain: match mode {
                            0 => None,
                            1 => Some(d),
                            _ => known.then_some(d),
                        },
                    });
                (
                    Just(width),
                    Just(l),
                    proptest::collection::vec(node, n),
                    Just(seed),
                )
            })
    }

    fn key(nodes: &[NodeView], i: usize) -> u64 {
        domain_key(&nodes[i], i)
    }

    /// Available, domain-distinct nodes in a group (brute force).
    fn hostable(nodes: &[NodeView], members: &[usize], width: usize) -> bool {
        let mut d: Vec<u64> = members
            .iter()
            .filter(|&&i| nodes[i].available)
            .map(|&i| key(nodes, i))
            .collect();
        d.sort_unstable();
        d.dedup();
        d.len() >= width
    }

    fn mean(nodes: &[NodeView], members: &[usize]) -> f64 {
        let avail: Vec<u64> = members
            .iter()
            .filter(|&&i| nodes[i].available)
            .map(|&i| nodes[i].load)
            .collect();
        avail.iter().sum::<u64>() as f64 / avail.len() as f64
    }

    fn check_placement(p: &Placer, nodes: &[NodeView], chosen: &[usize]) {
        let width = p.width();
        assert_eq!(chosen.len(), width);
        let g = p.group_of(chosen[0]).unwrap();
        for (a, &i) in chosen.iter().enumerate() {
            assert!(nodes[i].available, "unavailable node {i} chosen");
            assert_eq!(p.group_of(i), Some(g), "nodes from two groups");
            for &j in &chosen[a + 1..] {
                assert_ne!(i, j, "node chosen twice");
                assert_ne!(key(nodes, i), key(nodes, j), "two nodes in one domain");
            }
        }
        // Least loaded: an unchosen, available member lighter than a chosen node c must be
        // in the domain of another chosen node.
        for &u in &p.groups()[g] {
            if !nodes[u].available || chosen.contains(&u) {
                continue;
            }
            for &c in chosen {
                if nodes[u].load < nodes[c].load {
                    assert!(
                        chosen
                            .iter()
                            .any(|&o| o != c && key(nodes, o) == key(nodes, u)),
                        "node {u} (load {}) lighter than chosen {c} (load {}) and compatible",
                        nodes[u].load,
                        nodes[c].load
                    );
                }
            }
        }
    }

    /// The invariants every random-policy range keeps: `width` distinct, available nodes in
    /// distinct failure domains.
    fn check_random_placement(nodes: &[NodeView], width: usize, chosen: &[usize]) {
        assert_eq!(chosen.len(), width);
        for (a, &i) in chosen.iter().enumerate() {
            assert!(nodes[i].available, "unavailable node {i} chosen");
            for &j in &chosen[a + 1..] {
                assert_ne!(i, j, "node chosen twice");
                assert_ne!(key(nodes, i), key(nodes, j), "two nodes in one domain");
            }
        }
    }

    fn check_new_error(err: &PlacementError, width: usize, nodes: &[NodeView]) {
        let mut d: Vec<u64> = (0..nodes.len()).map(|i| key(nodes, i)).collect();
        d.sort_unstable();
        d.dedup();
        assert_eq!(
            err,
            &PlacementError::TooFewDomains {
                needed: width,
                available: d.len()
            }
        );
        assert!(d.len() < width);
    }

    proptest! {
        #[test]
        fn prop_place_is_valid((width, l, nodes, seed) in cluster(), reload in any::<u64>()) {
            let mut p = match Placer::new(Policy::CodingSets { l }, width, &nodes, seed) {
                Ok(p) => p,
                Err(e) => { check_new_error(&e, width, &nodes); return Ok(()); }
            };
            assert_partition(&p, nodes.len());
            // Also with loads that changed arbitrarily since construction.
            let mut later = nodes.clone();
            let mut x = reload;
            for v in &mut later {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                v.load = (x >> 59) % 20;
            }
            for view in [&nodes, &later] {
                match p.place(view) {
                    Ok(chosen) => check_placement(&p, view, &chosen),
                    Err(_) => prop_assert!(
                        p.groups().iter().all(|m| !hostable(view, m, width)),
                        "place failed although a group can host"
                    ),
                }
            }
        }

        #[test]
        fn prop_groups_fill_evenly((width, l, mut nodes, seed) in cluster()) {
            let Ok(mut p) = Placer::new(Policy::CodingSets { l }, width, &nodes, seed) else {
                return Ok(());
            };
            let groups = p.groups().to_vec();
            let hosts: Vec<usize> = (0..groups.len())
                .filter(|&g| hostable(&nodes, &groups[g], width))
                .collect();
            let spread = |nodes: &[NodeView]| {
                let means: Vec<f64> = hosts.iter().map(|&g| mean(nodes, &groups[g])).collect();
                means.iter().cloned().fold(f64::MIN, f64::max)
                    - means.iter().cloned().fold(f64::MAX, f64::min)
            };
            let step = hosts
                .iter()
                .map(|&g| {
                    let a = groups[g].iter().filter(|&&i| nodes[i].available).count();
                    width as f64 / a as f64
                })
                .fold(0.0, f64::max);
            let bound = if hosts.is_empty() { 0.0 } else { spread(&nodes).max(step) };
            for _ in 0..60 {
                let chosen = match p.place(&nodes) {
                    Ok(c) => c,
                    Err(_) => { prop_assert!(hosts.is_empty()); return Ok(()); }
                };
                check_placement(&p, &nodes, &chosen);
                // Exact: the chosen group is an emptiest hosting group.
                let g = p.group_of(chosen[0]).unwrap();
                let m = mean(&nodes, &groups[g]);
                for &h in &hosts {
                    prop_assert!(m <= mean(&nodes, &groups[h]) + 1e-9);
                }
                for i in chosen {
                    nodes[i].load += 1;
                }
                prop_assert!(spread(&nodes) <= bound + 1e-9, "spread {} > {}", spread(&nodes), bound);
            }
        }

        #[test]
        fn prop_replace_is_valid((width, l, mut nodes, seed) in cluster(), pick in any::<usize>(), down in any::<bool>()) {
            let Ok(mut p) = Placer::new(Policy::CodingSets { l }, width, &nodes, seed) else {
                return Ok(());
            };
            let Ok(current) = p.place(&nodes) else { return Ok(()); };
            let lost = current[pick % width];
            if down {
                nodes[lost].available = false;
            }
            let eligible = |i: usize| {
                nodes[i].available
                    && !current.contains(&i)
                    && !current.iter().any(|&o| o != lost && key(&nodes, o) == key(&nodes, i))
            };
            let home = p.group_of(lost).unwrap();
            match p.replace(&nodes, &current, lost) {
                Ok(r) => {
                    prop_assert!(eligible(r));
                    let home_best = p.groups()[home].iter().copied().filter(|&i| eligible(i)).map(|i| nodes[i].load).min();
                    if let Some(best) = home_best {
                        prop_assert_eq!(p.group_of(r), Some(home));
                        prop_assert_eq!(nodes[r].load, best);
                    }
                }
                Err(e) => {
                    prop_assert_eq!(e, PlacementError::NoReplacement { lost });
                    prop_assert!((0..nodes.len()).all(|i| !eligible(i)));
                }
            }
        }

        #[test]
        fn prop_random_place_is_valid(
            (width, _l, mut nodes, seed) in cluster(),
            two in any::<bool>(),
        ) {
            let policy = if two { Policy::PowerOfTwo } else { Policy::EcCache };
            let mut p = match Placer::new(policy, width, &nodes, seed) {
                Ok(p) => p,
                Err(e) => { check_new_error(&e, width, &nodes); return Ok(()); }
            };
            prop_assert!(p.groups().is_empty());
            for _ in 0..20 {
                match p.place(&nodes) {
                    Ok(chosen) => {
                        check_random_placement(&nodes, width, &chosen);
                        for i in chosen {
                            nodes[i].load += 1;
                        }
                    }
                    Err(e) => {
                        // Only when the available nodes span fewer than `width` domains.
                        let mut d: Vec<u64> = (0..nodes.len())
                            .filter(|&i| nodes[i].available)
                            .map(|i| key(&nodes, i))
                            .collect();
                        d.sort_unstable();
                        d.dedup();
                        prop_assert!(d.len() < width, "{e} with {} domains available", d.len());
                        let expected = matches!(
                            e,
                            PlacementError::TooFewNodes { .. } | PlacementError::TooFewDomains { .. }
                        );
                        prop_assert!(expected, "unexpected error {}", e);
                        return Ok(());
                    }
                }
            }
        }

        #[test]
        fn prop_random_replace_is_valid(
            (width, _l, mut nodes, seed) in cluster(),
            two in any::<bool>(),
            pick in any::<usize>(),
            down in any::<bool>(),
        ) {
            let policy = if two { Policy::PowerOfTwo } else { Policy::EcCache };
            let Ok(mut p) = Placer::new(policy, width, &nodes, seed) else { return Ok(()); };
            let Ok(current) = p.place(&nodes) else { return Ok(()); };
            let lost = current[pick % width];
            if down {
                nodes[lost].available = false;
            }
            let eligible = |i: usize| {
                nodes[i].available
                    && !current.contains(&i)
                    && !current.iter().any(|&o| o != lost && key(&nodes, o) == key(&nodes, i))
            };
            match p.replace(&nodes, &current, lost) {
                Ok(r) => prop_assert!(eligible(r), "replacement {r} not eligible"),
                Err(e) => {
                    prop_assert_eq!(e, PlacementError::NoReplacement { lost });
                    prop_assert!((0..nodes.len()).all(|i| !eligible(i)));
                }
            }
        }

        #[test]
        fn prop_power_of_two_spreads_over_new_nodes_first(
            n in 1usize..200,
            width in 1usize..12,
            down in proptest::collection::vec(any::<bool>(), 200),
            seed in any::<u64>(),
        ) {
            // Without domains, every range finds `width` new available nodes as long as any are
            // left, so the first ⌊available / width⌋ ranges never share a node.
            let mut nodes = up(n.max(width));
            for (v, d) in nodes.iter_mut().zip(&down) {
                v.available = !d;
            }
            let available = nodes.iter().filter(|v| v.available).count();
            let mut p = Placer::new(Policy::PowerOfTwo, width, &nodes, seed).unwrap();
            let mut seen = HashSet::new();
            for _ in 0..available / width {
                for i in p.place(&nodes).unwrap() {
                    prop_assert!(seen.insert(i), "node {} handed out twice", i);
                    nodes[i].load += 1;
                }
            }
            // After forgetting, the nodes handed out are candidates again.
            p.forget_history();
            if available >= width {
                let again = p.place(&nodes).unwrap();
                check_random_placement(&nodes, width, &again);
            }
        }

        #[test]
        fn prop_same_seed_same_result(
            (width, l, mut nodes, seed) in cluster(),
            which in 0usize..3,
        ) {
            let policy = PolicyKind::ALL[which].with_l(l);
            let Ok(mut a) = Placer::new(policy, width, &nodes, seed) else {
                return Ok(());
            };
            let mut b = Placer::new(policy, width, &nodes, seed).unwrap();
            prop_assert_eq!(a.groups(), b.groups());
            for round in 0..20 {
                let ra = a.place(&nodes);
                prop_assert_eq!(&ra, &b.place(&nodes));
                if let Ok(chosen) = ra {
                    let lost = chosen[round % width];
                    prop_assert_eq!(
                        a.replace(&nodes, &chosen, lost),
                        b.replace(&nodes, &chosen, lost)
                    );
                    for i in chosen {
                        nodes[i].load += 1;
                    }
                }
            }
        }
    }
}
