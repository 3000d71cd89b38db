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

mod groups;
mod policy;
mod random;

use groups::{check_cluster, domain_key, form_groups};
pub use policy::{Policy, PolicyKind};

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
mod tests;
