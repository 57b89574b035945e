//! Tests of the reduction arithmetic.
