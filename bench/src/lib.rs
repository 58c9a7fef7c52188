//! What the benchmark binaries share: percentiles over measured durations.

pub mod stats;
