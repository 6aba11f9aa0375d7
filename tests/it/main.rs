//! The one integration test binary: every feature proven against the real containerd test bed
//! that `make test` starts (see hack/testbed.sh).

// The test helpers may unwrap too (clippy.toml allows it in the tests themselves): a panic is
// the test failing, with its place.
#![allow(clippy::unwrap_used)]

mod admin;
mod bed;
mod bootstrap;
mod cgroups;
mod cluster;
mod config;
mod config_data;
mod conformance;
mod control_plane;
mod cri;
mod devices;
mod dra;
mod eviction;
mod healthz;
mod http_source;
mod images;
mod kubelet;
mod lifecycle;
mod log_rotation;
mod network;
mod probes;
mod resilience;
mod run_once;
mod secure;
mod security;
mod static_pods;
mod status;
mod upstream;
