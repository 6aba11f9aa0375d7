//! What produces desired pods: the manifest file source, and the mux that merges sources'
//! snapshots into ordered pod updates.

pub mod file;
pub mod mux;

pub use mux::Mux;
