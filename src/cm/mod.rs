//! The container manager's parts beyond the cgroups: the CPU manager and its CPU sets, and the
//! device manager with its plugins.

pub mod cpu;
pub mod cpuset;
pub mod devices;
