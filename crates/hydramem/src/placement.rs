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
//! CodingSets partitions the N memory nodes once into disjoint **extended groups** of
//! `width + l` nodes (`l` = load-balancing factor). A new address range takes the `width`
//! least-loaded available nodes of *one* extended group. Each extended group contributes at most
//! C(width + l, r + 1) copysets and groups never share nodes, which cuts the probability of data
//! loss under correlated failures by about an order of magnitude, while the `l` spare nodes per
//! group still let the placer steer around loaded nodes.
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
//! # Determinism
//!
//! Everything is a pure function of the arguments and of a [`SmallRng`] seeded from `seed`: the
//! same seed and the same sequence of calls give the same results (on one platform with one
//! version of `rand`). No I/O.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

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
    /// The extended groups, each sorted by node index.
    groups: Vec<Vec<usize>>,
    /// Node index → group index.
    group_of: Vec<usize>,
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

/// Partitions the nodes into extended groups (see the module documentation).
fn form_groups(
    width: usize,
    l: usize,
    nodes: &[NodeView],
) -> Result<Vec<Vec<usize>>, PlacementError> {
    let n = nodes.len();
    if width == 0 {
        return Err(PlacementError::ZeroWidth);
    }
    if n < width {
        return Err(PlacementError::TooFewNodes {
            needed: width,
            available: n,
        });
    }
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
    if have_domains && runs.len() < width {
        return Err(PlacementError::TooFewDomains {
            needed: width,
            available: runs.len(),
        });
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
    /// Partitions the N nodes into disjoint extended groups of `width + l` nodes (`width` =
    /// k + r for erasure coding, n for n-way replication); leftover nodes join existing groups.
    ///
    /// Only the nodes' failure domains shape the groups (availability and load do not), so
    /// clients with the same cluster file form the same groups; `seed` drives tie-breaking.
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
        let groups = match policy {
            Policy::CodingSets { l } => form_groups(width, l, nodes)?,
        };
        let mut group_of = vec![0; nodes.len()];
        for (g, members) in groups.iter().enumerate() {
            for &i in members {
                group_of[i] = g;
            }
        }
        let mut placer = Placer {
            policy,
            width,
            groups,
            group_of,
            heap: BinaryHeap::new(),
            rng: SmallRng::seed_from_u64(seed),
            since_rebuild: 0,
            scratch: Scratch::default(),
        };
        placer.rebuild(nodes);
        Ok(placer)
    }

    /// Nodes for a new address range: `width` distinct node indices, all from one extended
    /// group, the `width` least-loaded available nodes of that group (ties broken at random),
    /// never two in the same failure domain. The group is the one with the lowest fill (mean
    /// load of its available members) among those that can host a range; ties at random.
    /// Returned in split order 0..width (least loaded first).
    ///
    /// The caller is expected to count the new slabs in the loads it passes next time; the
    /// placer keeps no load of its own.
    ///
    /// Errors: [`PlacementError::NodeCountMismatch`] if `nodes` is not the view of the N nodes
    /// the placer was built for; [`PlacementError::TooFewNodes`],
    /// [`PlacementError::TooFewDomains`] or [`PlacementError::NoGroupCanHost`] when no group
    /// has `width` available nodes in distinct domains.
    ///
    /// Cost: O(s log s + log G) amortised (see the module documentation).
    pub fn place(&mut self, nodes: &[NodeView]) -> Result<Vec<usize>, PlacementError> {
        self.check_len(nodes)?;
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
    /// It prefers the extended group of the coding group (the group holding most of
    /// `current`, the lost node's group on a tie), taking its least-loaded eligible node (ties
    /// at random). Only when that group has no eligible spare — always the case when l = 0 and
    /// the group has no leftover nodes — it falls back to the least-filled other group that has
    /// one; that breaks the CodingSets invariant for this range (its nodes then span two
    /// extended groups, adding copysets) in exchange for restoring its redundancy.
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

        let home = self.home_group(current, lost);
        if let Some(i) = least_loaded_eligible(nodes, &self.groups[home], eligible, &mut self.rng) {
            return Ok(i);
        }
        self.walk_groups(nodes, Some(home), |members, rng, _| {
            least_loaded_eligible(nodes, members, eligible, rng)
        })
        .ok_or(PlacementError::NoReplacement { lost })
    }

    /// The extended groups, each sorted by node index (for status and simulation).
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.groups
    }

    /// The index in [`Placer::groups`] of the extended group of `node`, if it exists.
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

    /// Re-reads every group's fill from `nodes` (O(N)). `place` does this by itself every G
    /// placements; call it after loads dropped (slabs freed) or nodes came back to make the
    /// very next placement exact again.
    pub fn refresh(&mut self, nodes: &[NodeView]) -> Result<(), PlacementError> {
        self.check_len(nodes)?;
        self.rebuild(nodes);
        Ok(())
    }

    fn check_len(&self, nodes: &[NodeView]) -> Result<(), PlacementError> {
        if nodes.len() == self.group_of.len() {
            Ok(())
        } else {
            Err(PlacementError::NodeCountMismatch {
                expected: self.group_of.len(),
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

    fn up(n: usize) -> Vec<NodeView> {
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
        fn prop_same_seed_same_result((width, l, mut nodes, seed) in cluster()) {
            let Ok(mut a) = Placer::new(Policy::CodingSets { l }, width, &nodes, seed) else {
                return Ok(());
            };
            let mut b = Placer::new(Policy::CodingSets { l }, width, &nodes, seed).unwrap();
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
