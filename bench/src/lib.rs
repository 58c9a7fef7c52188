//! What the benchmark binaries share: percentiles over measured durations, and first sightings
//! of objects by a watch.

pub mod sightings;
pub mod stats;
