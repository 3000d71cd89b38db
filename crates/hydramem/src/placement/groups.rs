//! CodingSets' extended groups: the partition of the cluster's nodes into disjoint groups of
//! at least `width` nodes spanning at least `width` failure domains (the rules are under
//! "Group formation" in the module documentation of [`super`]), and the checks every policy
//! makes of a cluster at construction.
//!
//! Invariant: the partition depends only on `width`, `l` and the nodes' failure domains, so
//! every client built from one cluster file forms the same groups.

use std::cmp::Reverse;
use std::collections::HashSet;

use super::{NodeView, PlacementError};

/// The failure-domain key of node `i`: its domain, or a key of its own when it has none.
pub(super) fn domain_key(v: &NodeView, i: usize) -> u64 {
    match v.domain {
        Some(d) => u64::from(d),
        None => (1u64 << 32) + i as u64,
    }
}

/// The checks every policy makes at construction: a positive width, at least `width` nodes,
/// and (when domains are given) at least `width` distinct domains.
pub(super) fn check_cluster(width: usize, nodes: &[NodeView]) -> Result<(), PlacementError> {
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
pub(super) fn form_groups(
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
