//! HTTP servers of the node. Each takes its listener and a shutdown signal, and holds read
//! handles only.

pub mod healthz;
pub mod read_only;
