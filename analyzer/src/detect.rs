//! Detection formulas of CCL-D section 4.2.1 (pure functions, unit-tested).
