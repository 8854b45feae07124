//! End-to-end tests across the svnic crates; the helpers they share live here.

pub mod soak;
pub mod vm;
