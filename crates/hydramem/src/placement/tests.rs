//! Tests of placement: the partition into extended groups, the choice of a group and of its
//! nodes, replacement, the random policies, and properties over random clusters.

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
