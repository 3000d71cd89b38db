//! The machinery of the random policies (EC-Cache and power of two choices): drawing a node
//! uniformly among those eligible for a split, and power of two's memory of the nodes it has
//! already handed out.
//!
//! Invariants: [`choose`] returns only nodes accepted by the caller's `eligible` predicate
//! (the caller encodes availability, membership and failure domains there), and among them it
//! draws uniformly — rejection sampling with a bounded number of tries, then an exact scan —
//! so EC-Cache's ranges are uniform random sets, which the simulator's closed forms assume.
//! [`History`] partitions the nodes into "new" (never handed out since the last
//! [`History::forget`]) and "used" at all times.

use std::cmp::Ordering;

use rand::rngs::SmallRng;
use rand::Rng;

use super::NodeView;

/// Uniform draws tried before a candidate is found by a full scan instead.
const TRIES: usize = 64;

/// Marks a node that is not in the `fresh` list.
const USED: u32 = u32::MAX;

/// The nodes a placer has handed out (power of two's `M_old`), and the others (`M_new`), kept
/// as a list of new nodes with each node's position in it, so that drawing a new node is O(1)
/// and forgetting costs only the nodes handed out.
#[derive(Debug, Clone)]
pub(super) struct History {
    /// Node → its index in `fresh`, or [`USED`].
    pos: Vec<u32>,
    /// The new nodes, in no particular order.
    fresh: Vec<u32>,
    /// The nodes handed out since the last `forget`.
    used: Vec<u32>,
}

impl History {
    /// All `n` nodes new.
    pub(super) fn new(n: usize) -> History {
        let all: Vec<u32> = (0..n)
            .map(|i| u32::try_from(i).expect("fewer than 2^32 memory nodes"))
            .collect();
        History {
            pos: all.clone(),
            fresh: all,
            used: Vec::new(),
        }
    }

    /// Records that node `i` now holds a slab of this client.
    pub(super) fn mark(&mut self, i: usize) {
        let p = self.pos[i];
        if p == USED {
            return;
        }
        self.fresh.swap_remove(p as usize);
        if let Some(&moved) = self.fresh.get(p as usize) {
            self.pos[moved as usize] = p;
        }
        self.pos[i] = USED;
        self.used.push(i as u32);
    }

    /// Makes every node new again.
    pub(super) fn forget(&mut self) {
        for i in self.used.drain(..) {
            self.pos[i as usize] = self.fresh.len() as u32;
            self.fresh.push(i);
        }
    }

    #[cfg(test)]
    fn is_new(&self, i: usize) -> bool {
        self.pos[i] != USED
    }
}

/// A node drawn uniformly among the members of `pool` (all `n` nodes when `None`) accepted by
/// `eligible`, or `None` when none is.
fn draw(
    n: usize,
    pool: Option<&[u32]>,
    eligible: &dyn Fn(usize) -> bool,
    rng: &mut SmallRng,
) -> Option<usize> {
    let len = pool.map_or(n, <[u32]>::len);
    let at = |j: usize| pool.map_or(j, |p| p[j] as usize);
    if len == 0 {
        return None;
    }
    for _ in 0..TRIES {
        let i = at(rng.random_range(0..len));
        if eligible(i) {
            return Some(i);
        }
    }
    // Most of the pool is ineligible: count, then take a uniform rank among the eligible.
    let count = (0..len).filter(|&j| eligible(at(j))).count();
    if count == 0 {
        return None;
    }
    let rank = rng.random_range(0..count);
    (0..len).map(at).filter(|&i| eligible(i)).nth(rank)
}

/// One split's node for a random policy: EC-Cache (`two_choices` false) draws one eligible
/// node uniformly; power of two draws two and keeps the less loaded (ties at random). With a
/// `history`, candidates come from the new nodes while any new node is eligible.
pub(super) fn choose(
    nodes: &[NodeView],
    eligible: &dyn Fn(usize) -> bool,
    two_choices: bool,
    history: Option<&History>,
    rng: &mut SmallRng,
) -> Option<usize> {
    let n = nodes.len();
    let candidate = |rng: &mut SmallRng| {
        history
            .and_then(|h| draw(n, Some(&h.fresh), eligible, rng))
            .or_else(|| draw(n, None, eligible, rng))
    };
    let a = candidate(rng)?;
    if !two_choices {
        return Some(a);
    }
    let b = candidate(rng).unwrap_or(a);
    Some(match nodes[a].load.cmp(&nodes[b].load) {
        Ordering::Less => a,
        Ordering::Greater => b,
        Ordering::Equal if rng.random::<bool>() => a,
        Ordering::Equal => b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    use crate::placement::tests::up;

    #[test]
    fn history_partitions_the_nodes() {
        let mut h = History::new(6);
        for i in [3, 0, 5, 3] {
            h.mark(i);
        }
        assert_eq!(h.fresh.len(), 3);
        for i in 0..6 {
            assert_eq!(h.is_new(i), ![0, 3, 5].contains(&i), "node {i}");
            if h.is_new(i) {
                assert_eq!(h.fresh[h.pos[i] as usize] as usize, i);
            }
        }
        h.forget();
        assert_eq!(h.fresh.len(), 6);
        assert!((0..6).all(|i| h.is_new(i) && h.fresh[h.pos[i] as usize] as usize == i));
    }

    #[test]
    fn draw_is_uniform_among_eligible_even_when_most_are_not() {
        // Only every 50th node of 1000 is eligible: rejection mostly fails, the scan decides.
        let mut rng = SmallRng::seed_from_u64(3);
        let eligible = |i: usize| i % 50 == 7;
        let mut hits = [0u32; 20];
        for _ in 0..20_000 {
            let i = draw(1000, None, &eligible, &mut rng).unwrap();
            assert!(eligible(i));
            hits[i / 50] += 1;
        }
        // 1000 expected each; 5 standard deviations is about 155.
        assert!(hits.iter().all(|&h| (845..=1155).contains(&h)), "{hits:?}");
        assert_eq!(draw(1000, None, &|_| false, &mut rng), None);
        assert_eq!(draw(1000, Some(&[]), &|_| true, &mut rng), None);
    }

    #[test]
    fn two_choices_favour_the_lighter_node() {
        // Half the nodes carry load 10: one choice hits them half the time, two choices only
        // when both candidates do, a quarter of the time.
        let mut nodes = up(100);
        for v in nodes.iter_mut().step_by(2) {
            v.load = 10;
        }
        let mut rng = SmallRng::seed_from_u64(5);
        let heavy = |two: bool, rng: &mut SmallRng| {
            (0..8000)
                .filter(|_| nodes[choose(&nodes, &|_| true, two, None, rng).unwrap()].load > 0)
                .count()
        };
        let one = heavy(false, &mut rng);
        let two = heavy(true, &mut rng);
        assert!(
            (3700..=4300).contains(&one),
            "one choice: {one} of 8000 heavy"
        );
        assert!(
            (1700..=2300).contains(&two),
            "two choices: {two} of 8000 heavy"
        );
    }

    #[test]
    fn new_nodes_come_first() {
        let nodes = up(10);
        let mut rng = SmallRng::seed_from_u64(9);
        let mut h = History::new(10);
        let mut seen = Vec::new();
        for _ in 0..10 {
            let i = choose(&nodes, &|_| true, true, Some(&h), &mut rng).unwrap();
            h.mark(i);
            seen.push(i);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        // All used: candidates come from all nodes again.
        assert!(choose(&nodes, &|_| true, true, Some(&h), &mut rng).is_some());
    }
}
