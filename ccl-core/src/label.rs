//! Operation labels for messages (errors and log lines), formatted only when a message
//! needs one, never on the latency path.

/// What follows the operation's name in its label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LabelExtra {
    None,
    Root(usize),
    Peer(usize),
}

/// Where an operation runs (its communicator and this rank): what its label needs besides
/// the operation's own fields. Two words, so that a validated operation stays small enough
/// to be moved between the call's layers without a `memcpy` call (it carried a 104-byte
/// label before, formatted lazily; docs/performance.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OpPlace {
    pub comm_id: u64,
    pub rank: usize,
}

impl OpPlace {
    /// The label of operation `name` with `extra`, `count` elements of `dtype` here, e.g.
    /// `AllReduce (count 7, float) on comm 0x.. rank 1`.
    pub(crate) fn label(&self, name: &str, extra: LabelExtra, count: usize, dtype: &str) -> String {
        let extra = match extra {
            LabelExtra::None => String::new(),
            LabelExtra::Root(r) => format!(" root {r}"),
            LabelExtra::Peer(r) => format!(" peer {r}"),
        };
        format!(
            "{name}{extra} (count {count}, {dtype}) on comm {:#018x} rank {}",
            self.comm_id, self.rank
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{LabelExtra, OpPlace};

    #[test]
    fn labels_name_the_operation_and_where_it_runs() {
        let p = OpPlace {
            comm_id: 0x34,
            rank: 2,
        };
        assert_eq!(
            p.label("AllReduce", LabelExtra::None, 7, "float"),
            "AllReduce (count 7, float) on comm 0x0000000000000034 rank 2"
        );
        assert_eq!(
            p.label("Broadcast", LabelExtra::Root(1), 0, "int8"),
            "Broadcast root 1 (count 0, int8) on comm 0x0000000000000034 rank 2"
        );
        assert_eq!(
            p.label("Send", LabelExtra::Peer(3), 5, "int32"),
            "Send peer 3 (count 5, int32) on comm 0x0000000000000034 rank 2"
        );
    }
}
