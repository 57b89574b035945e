//! Rendezvous (highest-random-weight) hashing of communicators over the analyzer shards.
//!
//! Every communicator has one *owner* shard: the shard whose name gives the highest
//! weight `w(shard, comm_id)`. The full descending order of weights is the *failover
//! order*: when the owner is down, a client sends the communicator's records to the next
//! shard in that order, and so on. Because the weight of a (shard, communicator) pair does
//! not depend on the other shards, removing a shard only moves the communicators it owned,
//! and adding one only takes communicators from the others (about `1/n` of them).
//!
//! The hash is a fixed function (FNV-1a of the shard name, mixed with the communicator id
//! through the SplitMix64 finaliser), so clients and servers in different processes, on
//! different machines and different builds agree on the placement. Shards are named by
//! the exact string in the shard list (normally `host:port`), so every client and server
//! must be given the same list spelled the same way.

use std::fmt;

/// Error building a [`ShardMap`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// The shard list is empty.
    #[error("the shard list is empty")]
    Empty,
    /// A shard name is empty (e.g. `a,,b`).
    #[error("shard {index} in the shard list is an empty name")]
    EmptyName {
        /// Position in the list.
        index: usize,
    },
    /// The same shard is listed twice.
    #[error("shard {name:?} is listed twice in the shard list")]
    Duplicate {
        /// The repeated name.
        name: String,
    },
    /// `--shard-id` is not an index into the list.
    #[error("shard id {id} is out of range for a list of {len} shards")]
    BadId {
        /// The id given.
        id: usize,
        /// Length of the list.
        len: usize,
    },
}

/// 64-bit FNV-1a of a byte string.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64 finaliser: a bijective mixer with good avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Rendezvous weight of `comm_id` on the shard whose name hashes to `shard_hash`.
fn weight_with(shard_hash: u64, comm_id: u64) -> u64 {
    mix64(shard_hash ^ mix64(comm_id.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Rendezvous weight of `comm_id` on shard `shard` (public so tools can print it).
pub fn weight(shard: &str, comm_id: u64) -> u64 {
    weight_with(fnv1a64(shard.as_bytes()), comm_id)
}

/// A validated shard list with precomputed name hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct ShardMap {
    names: Vec<String>,
    hashes: Vec<u64>,
}

impl fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names.iter()).finish()
    }
}

impl ShardMap {
    /// Builds a map from shard names (normally `host:port`). Names are trimmed; empty and
    /// duplicate names are errors.
    pub fn new<I, S>(names: I) -> Result<Self, ShardError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<String> = Vec::new();
        for (index, n) in names.into_iter().enumerate() {
            let n = n.as_ref().trim();
            if n.is_empty() {
                return Err(ShardError::EmptyName { index });
            }
            if out.iter().any(|o| o == n) {
                return Err(ShardError::Duplicate {
                    name: n.to_string(),
                });
            }
            out.push(n.to_string());
        }
        if out.is_empty() {
            return Err(ShardError::Empty);
        }
        let hashes = out.iter().map(|n| fnv1a64(n.as_bytes())).collect();
        Ok(Self { names: out, hashes })
    }

    /// Parses a comma-separated list (`a:1,b:2`).
    pub fn parse(list: &str) -> Result<Self, ShardError> {
        Self::new(list.split(','))
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Always false: a map has at least one shard.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Shard names in list order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Name of shard `i`, if in range.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.names.get(i).map(String::as_str)
    }

    /// Checks that `id` indexes this list.
    pub fn check_id(&self, id: usize) -> Result<(), ShardError> {
        if id < self.names.len() {
            Ok(())
        } else {
            Err(ShardError::BadId {
                id,
                len: self.names.len(),
            })
        }
    }

    /// Index of the shard that owns `comm_id` (highest weight; ties, which need a 64-bit
    /// collision, go to the lower index).
    pub fn owner(&self, comm_id: u64) -> usize {
        let mut best = 0usize;
        let mut best_w = weight_with(self.hashes[0], comm_id);
        for (i, &h) in self.hashes.iter().enumerate().skip(1) {
            let w = weight_with(h, comm_id);
            if w > best_w {
                best = i;
                best_w = w;
            }
        }
        best
    }

    /// All shard indices in failover order for `comm_id`: owner first, then by
    /// descending weight.
    pub fn order(&self, comm_id: u64) -> Vec<usize> {
        let mut v: Vec<(u64, usize)> = self
            .hashes
            .iter()
            .enumerate()
            .map(|(i, &h)| (weight_with(h, comm_id), i))
            .collect();
        // Descending weight, ascending index on ties (matches `owner`).
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, i)| i).collect()
    }

    /// The first shard in failover order for `comm_id` for which `up(i)` is true.
    pub fn first_up(&self, comm_id: u64, mut up: impl FnMut(usize) -> bool) -> Option<usize> {
        self.order(comm_id).into_iter().find(|&i| up(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:7070")).collect()
    }

    #[test]
    fn rejects_bad_lists() {
        assert_eq!(ShardMap::parse(""), Err(ShardError::EmptyName { index: 0 }));
        assert_eq!(ShardMap::new(Vec::<String>::new()), Err(ShardError::Empty));
        assert_eq!(
            ShardMap::parse("a,,b"),
            Err(ShardError::EmptyName { index: 1 })
        );
        assert_eq!(
            ShardMap::parse("a, b ,a"),
            Err(ShardError::Duplicate { name: "a".into() })
        );
        let m = ShardMap::parse(" a , b ").unwrap();
        assert_eq!(m.names(), &["a".to_string(), "b".to_string()]);
        assert!(m.check_id(1).is_ok());
        assert_eq!(m.check_id(2), Err(ShardError::BadId { id: 2, len: 2 }));
    }

    #[test]
    fn fnv_matches_published_vectors() {
        // Published FNV-1a 64-bit test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn owner_is_argmax_of_weight_and_order_is_sorted_permutation() {
        let m = ShardMap::new(names(5)).unwrap();
        for c in 0..2000u64 {
            let comm = mix64(c);
            let ws: Vec<u64> = m.names().iter().map(|n| weight(n, comm)).collect();
            let order = m.order(comm);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
            for pair in order.windows(2) {
                assert!(ws[pair[0]] >= ws[pair[1]]);
            }
            assert_eq!(order[0], m.owner(comm));
            let max = ws.iter().copied().max().unwrap();
            assert_eq!(ws[m.owner(comm)], max);
        }
    }

    #[test]
    fn placement_is_independent_of_list_order() {
        let a = ShardMap::new(names(4)).unwrap();
        let mut rev = names(4);
        rev.reverse();
        let b = ShardMap::new(rev).unwrap();
        for c in 0..1000u64 {
            assert_eq!(a.name(a.owner(c)), b.name(b.owner(c)));
        }
    }

    #[test]
    fn spread_is_roughly_uniform() {
        let m = ShardMap::new(names(4)).unwrap();
        let mut counts = [0usize; 4];
        let n = 40_000u64;
        for c in 0..n {
            counts[m.owner(c)] += 1;
        }
        for &k in &counts {
            // Expected 10,000 each; allow +-5% (about 10 standard deviations).
            assert!((9_500..=10_500).contains(&k), "{counts:?}");
        }
    }

    #[test]
    fn removing_a_shard_moves_only_its_communicators() {
        let full = ShardMap::new(names(5)).unwrap();
        let mut less_names = names(5);
        let removed = less_names.remove(2);
        let less = ShardMap::new(less_names).unwrap();
        for c in 0..5000u64 {
            let before = full.name(full.owner(c)).unwrap();
            let after = less.name(less.owner(c)).unwrap();
            if before == removed {
                // Goes to the second choice of the full map.
                let second = full.order(c)[1];
                assert_eq!(after, full.name(second).unwrap());
            } else {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn first_up_skips_down_shards() {
        let m = ShardMap::new(names(3)).unwrap();
        for c in 0..200u64 {
            let order = m.order(c);
            assert_eq!(m.first_up(c, |_| true), Some(order[0]));
            assert_eq!(m.first_up(c, |i| i != order[0]), Some(order[1]));
            assert_eq!(m.first_up(c, |i| i == order[2]), Some(order[2]));
            assert_eq!(m.first_up(c, |_| false), None);
        }
    }
}
