//! What produces desired pods: the manifest file and URL sources, and the mux that merges
//! sources' snapshots into ordered pod updates.

pub mod file;
pub mod http;
pub mod mux;

pub use mux::Mux;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{StaticOrigin, apply_defaults, decode_pods, make_static, validate};

/// Largest manifest (file or URL body) accepted, as upstream.
pub const MAX_MANIFEST_BYTES: u64 = 10 * 1024 * 1024;

/// Decodes manifest bytes into static pods: API defaulting, validation, then the static-pod
/// rules. Any problem fails the whole manifest, with every problem listed.
pub fn static_pods(
    bytes: &[u8],
    node: &str,
    origin: StaticOrigin<'_>,
    seen: &str,
) -> Result<Vec<Pod>, Vec<String>> {
    let text = std::str::from_utf8(bytes).map_err(|_| vec!["not UTF-8 text".to_string()])?;
    let mut pods = decode_pods(text)?;
    let mut problems = Vec::new();
    for (i, pod) in pods.iter_mut().enumerate() {
        apply_defaults(pod);
        let found = validate(pod);
        if found.is_empty() {
            make_static(pod, node, origin, seen);
        } else {
            let name = pod.metadata.name.clone().unwrap_or_default();
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("pod {} ({name}): {p}", i + 1)),
            );
        }
    }
    if problems.is_empty() {
        Ok(pods)
    } else {
        Err(problems)
    }
}
