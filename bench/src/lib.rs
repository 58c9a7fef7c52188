//! What the benchmark binaries share: percentiles over measured durations, first sightings of
//! objects by a watch, and processes' memory and CPU time.

pub mod procfs;
pub mod sightings;
pub mod stats;
