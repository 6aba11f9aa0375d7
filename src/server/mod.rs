//! HTTP servers of the node. Each takes its listener and a shutdown signal.

pub mod healthz;
