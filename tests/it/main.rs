//! The one integration test binary: every feature proven against the real containerd test bed
//! that `make test` starts (see hack/testbed.sh).

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
mod eviction;
mod healthz;
mod http_source;
mod images;
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
