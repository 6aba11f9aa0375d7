//! HTTP servers of the node. Each takes its listener and a shutdown signal, and holds read
//! handles only (`/stats/summary` also asks the runtime for container stats).

pub mod healthz;
pub mod read_only;
pub mod stats;
