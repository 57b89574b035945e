//! Deterministic rank simulator producing record streams (clean or with one anomaly).
