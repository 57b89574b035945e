//! Algorithm and protocol of host-backend collectives: `NCCL_ALGO` and `NCCL_PROTO`, and the
//! automatic choice by size and rank count when they leave it open. Pure (the variables'
//! values are passed in), unit-tested.
//!
//! What the host backend runs (docs/host-backend.md, "Algorithms and protocols"):
//! - `Ring` with the `Simple` protocol: every collective.
//! - `Tree` (recursive doubling, log2 N exchange steps) for AllReduce, with `LL` (flag and
//!   data in each 8-byte word) or `Simple`.
//!
//! Automatic choice (both variables unset): AllReduce of at most [`TREE_MAX_BYTES`] per
//! rank (more with socket links: [`tree_limit`]), with no minimum channel count above
//! one, runs Tree/Simple; everything else Ring/Simple. On one rank Tree has no steps: the
//! input is loaded (scaled for PreMulSum/Avg) and written out without the ring schedule's
//! plan. `NCCL_ALGO` /
//! `NCCL_PROTO` restrict the candidates: with `NCCL_ALGO=Tree` every AllReduce runs Tree;
//! Tree runs LL only when `NCCL_PROTO` allows LL and not Simple (LL measured slower than
//! Simple at every size on the 2-core reference VM: docs/performance.md). Ring with LL is
//! not implemented: Ring always runs Simple (a set that allows only LL still runs Simple
//! for Ring, with a warning at init). Every rank must see the same values (as with NCCL).

use ccl_optype::CollKind;

use crate::error::{CclError, Result};
use crate::proto::ProtoSet;

/// The variable.
pub(crate) const ENV_ALGO: &ccl_params::Param = &ccl_params::NCCL_ALGO;

/// AllReduce operations of at most this many bytes per rank run Tree when the choice is
/// automatic and every rank is on one host (measured on the 2-core reference VM:
/// docs/performance.md).
pub(crate) const TREE_MAX_BYTES: usize = 8 << 10;

/// The same limit on a communicator of two ranks with a socket link between them (on two
/// hosts, or with `NCCL_P2P_DISABLE` and `NCCL_SHM_DISABLE` both set): each step pays the
/// link's latency, and a 2-rank ring takes two dependent steps where Tree takes one
/// exchange of the same bytes. Tree sends one FIFO slot (`NCCL_BUFFSIZE` / 8, 128 KiB by
/// default) per exchange and waits for the partner's before the next, so beyond one
/// slot the pipelined ring catches up (a tie at 256-512 KiB, ahead from 1 MiB): measured
/// on network-namespace hosts, docs/perf-net.md "Tree over sockets".
pub(crate) const TREE_MAX_BYTES_SOCKETS_2: usize = 128 << 10;

/// The limit with socket links and more than two ranks: Tree's log2 N exchanges each move
/// the whole buffer, where the ring's 2 (N - 1) steps move 1 / N of it, so the latency it
/// saves pays only for small messages (measured at 4 hosts of one rank and 2 hosts of two,
/// docs/perf-net.md "Tree over sockets").
pub(crate) const TREE_MAX_BYTES_SOCKETS: usize = 32 << 10;

// Socket links only ever widen Tree's range.
const _: () = assert!(TREE_MAX_BYTES_SOCKETS_2 >= TREE_MAX_BYTES);
const _: () = assert!(TREE_MAX_BYTES_SOCKETS >= TREE_MAX_BYTES);

/// Largest AllReduce (bytes per rank) the automatic choice runs as Tree on `nranks` ranks,
/// with socket links if `over_sockets`.
pub(crate) fn tree_limit(nranks: usize, over_sockets: bool) -> usize {
    match (over_sockets, nranks) {
        (false, _) => TREE_MAX_BYTES,
        (true, 2) => TREE_MAX_BYTES_SOCKETS_2,
        (true, _) => TREE_MAX_BYTES_SOCKETS,
    }
}

/// The algorithms `NCCL_ALGO` allows (of those the host backend runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AlgoSet {
    /// `Ring` allowed.
    pub ring: bool,
    /// `Tree` allowed.
    pub tree: bool,
}

impl AlgoSet {
    /// Both algorithms.
    pub(crate) const ALL: AlgoSet = AlgoSet {
        ring: true,
        tree: true,
    };
}

/// NCCL's algorithm names the host backend does not run (accepted, never chosen).
const OTHER_ALGOS: [&str; 6] = [
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
    "collnet",
];

/// Parses a value of `NCCL_ALGO` (NVIDIA's syntax: comma-separated, case-insensitive
/// names, a leading `^` excludes the listed ones; unset or blank = all). Names of NCCL
/// algorithms the host backend does not implement are accepted and ignored; unknown names
/// are an error. A value that leaves neither Ring nor Tree allows both (with a warning at
/// init: [`describe_fallback`]).
pub(crate) fn parse_algo(raw: Option<&str>) -> Result<AlgoSet> {
    let Some(raw) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(AlgoSet::ALL);
    };
    let (negate, list) = match raw.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, raw),
    };
    if list.trim().is_empty() {
        return Err(CclError::arg(format!(
            "{ENV_ALGO}={raw:?}: empty algorithm list (expected Ring, Tree, ... comma-separated, \
             optionally after ^)"
        )));
    }
    let mut named = AlgoSet {
        ring: false,
        tree: false,
    };
    for tok in list.split(',') {
        match tok.trim().to_ascii_lowercase().as_str() {
            "ring" => named.ring = true,
            "tree" => named.tree = true,
            other if OTHER_ALGOS.contains(&other) => {}
            other => {
                return Err(CclError::arg(format!(
                    "{ENV_ALGO}={raw:?}: unknown algorithm {other:?} (expected Ring, Tree, \
                     CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT)"
                )))
            }
        }
    }
    let set = if negate {
        AlgoSet {
            ring: !named.ring,
            tree: !named.tree,
        }
    } else {
        named
    };
    Ok(if set.ring || set.tree {
        set
    } else {
        AlgoSet::ALL
    })
}

/// Why a parsed `NCCL_ALGO` value falls back to the automatic choice (it names no
/// algorithm the host backend runs), for the init warning; `None` when it does not.
pub(crate) fn describe_fallback(raw: Option<&str>) -> Option<String> {
    let raw = raw.map(str::trim).filter(|s| !s.is_empty())?;
    let lower = raw.to_ascii_lowercase();
    let names_ours = lower
        .trim_start_matches('^')
        .split(',')
        .any(|t| matches!(t.trim(), "ring" | "tree"));
    (!names_ours && !lower.starts_with('^')).then(|| {
        format!(
            "{ENV_ALGO}={raw}: the host backend runs Ring and Tree only; choosing automatically"
        )
    })
}

/// A host algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostAlgo {
    /// The ring schedules of [`crate::schedule`].
    Ring,
    /// Recursive doubling ([`crate::tree`]), AllReduce only.
    Tree,
}

/// A host protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostProto {
    /// Slots with head/tail counters.
    Simple,
    /// Flag and data in each 8-byte word ([`crate::transport::shm::LlSender`]).
    Ll,
}

/// The algorithm selection of a communicator (from `NCCL_ALGO` and `NCCL_PROTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Selection {
    /// Allowed algorithms.
    pub algos: AlgoSet,
    /// Allowed protocols.
    pub protos: ProtoSet,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            algos: AlgoSet::ALL,
            protos: ProtoSet::ALL,
        }
    }
}

impl Selection {
    /// Parses both variables' raw values.
    pub(crate) fn parse(algo: Option<&str>, proto: Option<&str>) -> Result<Selection> {
        Ok(Selection {
            algos: parse_algo(algo)?,
            protos: crate::proto::parse(proto)?,
        })
    }

    /// Algorithm and protocol of a collective `coll` of `bytes` per rank on `nranks` ranks
    /// with at least `min_channels` channels asked for, on a communicator with socket
    /// links if `over_sockets` (the same on every rank, given the same variables: every
    /// rank knows every rank's host). A minimum above one channel
    /// (`NCCL_MIN_CTAS`, `config.minCTAs`) keeps the automatic choice on the ring, which
    /// honours it (Tree runs one channel).
    pub(crate) fn choose(
        &self,
        coll: CollKind,
        bytes: usize,
        nranks: usize,
        min_channels: usize,
        over_sockets: bool,
    ) -> (HostAlgo, HostProto) {
        let ring = (HostAlgo::Ring, HostProto::Simple);
        if coll != CollKind::AllReduce || nranks == 0 || bytes == 0 || !self.algos.tree {
            return ring;
        }
        let small = bytes <= tree_limit(nranks, over_sockets);
        if self.algos.ring && (!small || min_channels > 1) {
            return ring;
        }
        // Simple whenever allowed: measured faster than LL at every size on the 2-core
        // reference VM (docs/performance.md); LL when it is the only one allowed.
        let (ll, simple) = (self.protos.ll, self.protos.simple);
        let proto = if ll && !simple {
            HostProto::Ll
        } else if simple {
            HostProto::Simple
        } else if self.algos.ring {
            // Only protocols the host does not run (LL128): Ring/Simple.
            return ring;
        } else {
            HostProto::Simple
        };
        (HostAlgo::Tree, proto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_algo_lists_negation_and_rejects_junk() {
        let set = |ring, tree| AlgoSet { ring, tree };
        assert_eq!(parse_algo(None).unwrap(), AlgoSet::ALL);
        assert_eq!(parse_algo(Some(" ")).unwrap(), AlgoSet::ALL);
        assert_eq!(parse_algo(Some("Ring")).unwrap(), set(true, false));
        assert_eq!(parse_algo(Some("tree")).unwrap(), set(false, true));
        assert_eq!(parse_algo(Some("TREE, ring")).unwrap(), set(true, true));
        assert_eq!(parse_algo(Some("^Tree")).unwrap(), set(true, false));
        assert_eq!(parse_algo(Some("Ring,NVLS")).unwrap(), set(true, false));
        // Nothing the host runs: automatic.
        assert_eq!(parse_algo(Some("NVLS")).unwrap(), AlgoSet::ALL);
        assert_eq!(parse_algo(Some("^Ring,Tree")).unwrap(), AlgoSet::ALL);
        for bad in ["Rong", "^", "Ring,,Tree", "Ring;Tree"] {
            let e = parse_algo(Some(bad)).unwrap_err();
            assert!(e.to_string().contains(ENV_ALGO.name), "{bad}: {e}");
        }
        assert!(describe_fallback(Some("NVLS")).is_some());
        assert!(describe_fallback(Some("Ring")).is_none());
        assert!(describe_fallback(None).is_none());
    }

    #[test]
    fn chooses_by_collective_size_and_variables() {
        use CollKind::*;
        use HostAlgo::*;
        use HostProto::*;
        let auto = Selection::default();
        assert_eq!(auto.choose(AllReduce, 8, 2, 1, false), (Tree, Simple));
        assert_eq!(
            auto.choose(AllReduce, TREE_MAX_BYTES, 5, 1, false),
            (Tree, Simple)
        );
        assert_eq!(
            auto.choose(AllReduce, TREE_MAX_BYTES + 4, 2, 1, false),
            (Ring, Simple)
        );
        assert_eq!(auto.choose(AllReduce, 8, 1, 1, false), (Tree, Simple));
        assert_eq!(
            auto.choose(AllReduce, 64 << 10, 1, 1, false),
            (Ring, Simple)
        );
        assert_eq!(auto.choose(AllReduce, 8, 2, 3, false), (Ring, Simple));
        assert_eq!(
            Selection::parse(Some("Tree"), None)
                .unwrap()
                .choose(AllReduce, 8, 2, 3, false),
            (Tree, Simple)
        );
        assert_eq!(auto.choose(AllReduce, 0, 4, 1, false), (Ring, Simple));
        assert_eq!(auto.choose(Broadcast, 8, 4, 1, false), (Ring, Simple));
        assert_eq!(auto.choose(ReduceScatter, 8, 4, 1, false), (Ring, Simple));
        let sel = |a, p| Selection::parse(a, p).unwrap();
        assert_eq!(
            sel(Some("Ring"), None).choose(AllReduce, 8, 2, 1, false),
            (Ring, Simple)
        );
        assert_eq!(
            sel(Some("Tree"), None).choose(AllReduce, 1 << 20, 2, 1, false),
            (Tree, Simple)
        );
        assert_eq!(
            sel(Some("Tree"), Some("LL")).choose(AllReduce, 1 << 20, 2, 1, false),
            (Tree, Ll)
        );
        assert_eq!(
            sel(None, Some("Simple")).choose(AllReduce, 8, 2, 1, false),
            (Tree, Simple)
        );
        assert_eq!(
            sel(None, Some("LL")).choose(AllReduce, 8, 2, 1, false),
            (Tree, Ll)
        );
        assert_eq!(
            sel(None, Some("LL")).choose(AllReduce, 1 << 20, 2, 1, false),
            (Ring, Simple)
        );
        assert_eq!(
            sel(None, Some("LL128")).choose(AllReduce, 8, 2, 1, false),
            (Ring, Simple)
        );
        assert_eq!(
            sel(Some("Tree"), Some("LL128")).choose(AllReduce, 8, 2, 1, false),
            (Tree, Simple)
        );
    }

    #[test]
    fn over_sockets_tree_runs_up_to_its_own_limit() {
        use CollKind::*;
        use HostAlgo::*;
        use HostProto::*;
        let auto = Selection::default();
        let sel = |a, p| Selection::parse(a, p).unwrap();
        for n in [1, 2, 3, 4, 8] {
            let limit = tree_limit(n, true);
            assert_eq!(
                limit,
                if n == 2 {
                    TREE_MAX_BYTES_SOCKETS_2
                } else {
                    TREE_MAX_BYTES_SOCKETS
                }
            );
            assert_eq!(tree_limit(n, false), TREE_MAX_BYTES);
            assert_eq!(auto.choose(AllReduce, 16 << 10, n, 1, true), (Tree, Simple));
            assert_eq!(auto.choose(AllReduce, limit, n, 1, true), (Tree, Simple));
            assert_eq!(
                auto.choose(AllReduce, limit + 4, n, 1, true),
                (Ring, Simple)
            );
            // The same size over shared memory stays on the ring.
            assert_eq!(
                auto.choose(AllReduce, 16 << 10, n, 1, false),
                (Ring, Simple)
            );
        }
        // What limits Tree over shared memory limits it over sockets too.
        assert_eq!(auto.choose(AllReduce, 8, 2, 3, true), (Ring, Simple));
        assert_eq!(auto.choose(Broadcast, 8, 2, 1, true), (Ring, Simple));
        assert_eq!(
            sel(Some("Ring"), None).choose(AllReduce, 8, 2, 1, true),
            (Ring, Simple)
        );
        assert_eq!(
            sel(None, Some("LL")).choose(AllReduce, 16 << 10, 2, 1, true),
            (Tree, Ll)
        );
    }
}
