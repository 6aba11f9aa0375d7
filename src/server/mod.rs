//! Servers of the node. Each takes its listener and a shutdown signal, and holds read handles
//! only; the logs, exec and stats endpoints also ask the runtime.

pub mod admin;
pub mod auth;
pub mod exec;
pub mod healthz;
mod instrument;
pub mod listen;
pub mod logs;
pub mod pod_resources;
pub mod read_only;
pub mod secure;
pub mod stats;
pub mod unix_authority;
