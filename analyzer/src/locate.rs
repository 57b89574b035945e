//! Root-cause location: the decision tree of CCL-D Figure 7 (pure functions, O(N)).
