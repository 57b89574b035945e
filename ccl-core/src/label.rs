//! Operation labels for messages, formatted on first use (see [`Label`]).

/// What follows the operation's name in its [`Label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LabelExtra {
    None,
    Root(usize),
    Peer(usize),
}

/// The parts of a [`Label`].
#[derive(Clone, Debug)]
struct LabelParts {
    name: &'static str,
    extra: LabelExtra,
    count: usize,
    dtype: &'static str,
    comm_id: u64,
    rank: usize,
}

/// An operation's name for messages, e.g. `AllReduce (count 7, float) on comm 0x.. rank 1`:
/// formatted on first use (errors and log lines), not on every call, so that it costs
/// nothing on the latency path. Dereferences to the text.
#[derive(Clone, Debug)]
pub(crate) struct Label {
    parts: Option<LabelParts>,
    text: std::sync::OnceLock<String>,
}

impl Label {
    /// The label of operation `name` with `extra`, `count` elements of `dtype` on rank
    /// `rank` of communicator `comm_id`.
    pub(crate) fn new(
        name: &'static str,
        extra: LabelExtra,
        count: usize,
        dtype: &'static str,
        comm_id: u64,
        rank: usize,
    ) -> Label {
        Label {
            parts: Some(LabelParts {
                name,
                extra,
                count,
                dtype,
                comm_id,
                rank,
            }),
            text: std::sync::OnceLock::new(),
        }
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label {
            parts: None,
            text: std::sync::OnceLock::from(s.to_string()),
        }
    }
}

impl std::ops::Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        self.text.get_or_init(|| match &self.parts {
            None => String::new(),
            Some(p) => {
                let extra = match p.extra {
                    LabelExtra::None => String::new(),
                    LabelExtra::Root(r) => format!(" root {r}"),
                    LabelExtra::Peer(r) => format!(" peer {r}"),
                };
                format!(
                    "{}{extra} (count {}, {}) on comm {:#018x} rank {}",
                    p.name, p.count, p.dtype, p.comm_id, p.rank
                )
            }
        })
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}
