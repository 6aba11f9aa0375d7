//! The container manager's parts beyond the cgroups: the CPU manager and its CPU sets.

pub mod cpu;
pub mod cpuset;
