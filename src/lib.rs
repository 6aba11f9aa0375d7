//! nodelet: a node agent that does the kubelet's job.
//!
//! Data flow: sources (`sources::file`) produce full snapshots of the pods they want;
//! `sources::mux` merges them into ordered [`types::PodUpdate`]s; the `sync_loop` owns the
//! desired state and hands each pod to its worker in `pod_workers`; a worker runs `pod_sync`,
//! which plans the pod's actions and carries them out through `runtime` (CRI).
//!
//! Dependency rules (arrows mean "may use"): `types`, `metrics`, `events`, `backoff`, `pod`,
//! `host` (the one place for facts about the machine), `service_links` (the Services containers
//! learn of through their environment) and `objects`
//! (the ConfigMaps, Secrets and RuntimeClasses beside static pods, which carries the service
//! links) are leaves; `oom` (system OOM kills from the kernel's log) uses only `events`;
//! `pod_startup` (the API pods' startup latency, fed by `images` and `cluster`) uses only
//! `metrics` and `pod`; `config`, `runtime`,
//! `cgroups`, `status`, `sources` and `volumes` use only leaves; `pleg`, `probe`, `images`,
//! `log_rotation`, `eviction` and `cm` (the CPU manager, and the device manager with its
//! plugins) use `runtime`; `admission` (the admit handlers' stateless checks)
//! uses `pod`; `shutdown` (graceful node shutdown's stages and
//! record) uses `config` and `pod`; `pod_workers` defines the `PodSyncer` trait and knows nothing of
//! the runtime; `pod_sync` uses runtime, images, log_rotation, cgroups, volumes, probe and status
//! and implements `PodSyncer`; `sync_loop` drives `pod_workers`; `server` holds read handles
//! only (the admin socket's `debug` hands its ephemeral containers to the sync loop); `agent` and `run_once` are the only places that wire everything together; `cli` is the
//! client of the agent's admin socket; `cluster` (cluster mode: node registration, lease, the
//! API pod source, status and mirror pods) holds read handles and feeds the mux like a source.
//!
//! Modules the binary, the tests and the examples do not use are `pub(crate)`, so the compiler
//! reports what nobody calls.

pub(crate) mod admission;
pub mod agent;
pub(crate) mod backoff;
pub mod cgroups;
pub mod cli;
pub(crate) mod cluster;
pub mod cm;
pub mod config;
pub(crate) mod events;
pub(crate) mod eviction;
pub mod host;
pub(crate) mod images;
pub mod lock;
pub(crate) mod log_rotation;
pub mod metrics;
pub(crate) mod objects;
pub(crate) mod oom;
pub(crate) mod pleg;
pub mod pod;
pub(crate) mod pod_startup;
pub mod pod_sync;
pub(crate) mod pod_workers;
pub(crate) mod probe;
pub mod run_once;
pub mod runtime;
pub(crate) mod runtime_state;
pub mod server;
pub(crate) mod service_links;
pub(crate) mod shutdown;
pub mod sources;
pub mod status;
pub(crate) mod sync_loop;
pub mod types;
pub(crate) mod volumes;
