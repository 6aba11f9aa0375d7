//! What produces desired pods (and the ConfigMaps and Secrets beside them): the manifest file
//! and URL sources, and the mux that merges sources' snapshots into ordered pod updates.

pub mod file;
pub mod http;
pub mod mux;

pub use mux::Mux;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::objects::{self, Object};
use crate::pod::{StaticOrigin, apply_defaults, decode_manifest, make_static, validate};

/// A source's complete current state: every pod it wants on this node, and the ConfigMaps and
/// Secrets it offers them. A pod the source has not changed since its last snapshot is the same
/// `Arc` as then.
#[derive(Clone, Debug)]
pub struct SourceSnapshot {
    pub source: crate::types::Source,
    pub pods: Vec<Arc<Pod>>,
    pub objects: Vec<Object>,
}

/// Largest manifest (file or URL body) accepted, as upstream.
pub const MAX_MANIFEST_BYTES: u64 = 10 * 1024 * 1024;

/// What one manifest describes: static pods and the ConfigMaps and Secrets beside them.
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    pub pods: Vec<Arc<Pod>>,
    pub objects: Vec<Object>,
}

/// What static pods referring to API objects (ConfigMaps, Secrets, service accounts, ...) get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiReferences {
    /// Standalone: ConfigMaps and Secrets come from beside the manifests.
    #[default]
    Local,
    /// In a cluster: the pod is refused, as upstream refuses it (its mirror pod could not exist).
    Refused,
}

/// Decodes manifest bytes: pods get API defaulting, validation, then the static-pod rules;
/// ConfigMaps and Secrets are validated. Any problem fails the whole manifest, with every problem
/// listed.
pub fn manifest(
    bytes: &[u8],
    node: &str,
    (origin, references): (StaticOrigin<'_>, ApiReferences),
    seen: &str,
) -> Result<Manifest, Vec<String>> {
    let text = std::str::from_utf8(bytes).map_err(|_| vec!["not UTF-8 text".to_string()])?;
    let decoded = decode_manifest(text)?;
    let mut pods = decoded.pods;
    let mut problems = Vec::new();
    for (i, pod) in pods.iter_mut().enumerate() {
        apply_defaults(pod);
        let mut found = validate(pod);
        if references == ApiReferences::Refused
            && let Some(resource) = crate::pod::api_object_reference(pod)
        {
            found.push(format!("static pods may not reference {resource}"));
        }
        if found.is_empty() {
            make_static(pod, node, origin, seen);
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if name.len() > 253 {
                found.push(format!(
                    "metadata.name: with the node name appended, {name:?} is longer than 253 characters"
                ));
            }
        }
        if !found.is_empty() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("pod {} ({name}): {p}", i + 1)),
            );
        }
    }
    let mut objects = Vec::new();
    let checked = decoded
        .config_maps
        .into_iter()
        .map(|cm| {
            (
                "ConfigMap",
                cm.metadata.name.clone(),
                objects::config_map(cm),
            )
        })
        .chain(
            decoded
                .secrets
                .into_iter()
                .map(|s| ("Secret", s.metadata.name.clone(), objects::secret(s))),
        )
        .chain(decoded.runtime_classes.into_iter().map(|rc| {
            (
                "RuntimeClass",
                rc.metadata.name.clone(),
                objects::runtime_class(rc),
            )
        }));
    for (kind, name, result) in checked {
        match result {
            Ok(o) => objects.push(o),
            Err(found) => problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("{kind} {:?}: {p}", name.as_deref().unwrap_or_default())),
            ),
        }
    }
    if problems.is_empty() {
        Ok(Manifest {
            pods: pods.into_iter().map(Arc::new).collect(),
            objects,
        })
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  volumes: [{name: v, emptyDir: {}}]\n  containers:\n  - name: c\n    image: busybox:1\n    ports: [{containerPort: 80, name: http}]\n    env: [{name: A, value: b}]\n    volumeMounts: [{name: v, mountPath: /v}]\n";

    const OBJECTS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\nbinaryData: {b: AAEC}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {p: aGk=}\nstringData: {q: x}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes: [{name: v, projected: {sources: [{configMap: {name: c}}, {secret: {name: s}}, {downwardAPI: {items: [{path: l, fieldRef: {fieldPath: metadata.labels}}]}}]}}]\n  containers:\n  - {name: c, image: i, envFrom: [{configMapRef: {name: c}}], volumeMounts: [{name: v, mountPath: /v}]}\n";

    /// A tiny deterministic generator (xorshift) so the smoke fuzz needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Smoke fuzz over manifest decoding: mutated manifests (bytes flipped, removed, repeated,
    /// truncated, spliced) are refused or accepted, never a panic. Bounded to stay quick;
    /// `NODELET_FUZZ_ITERATIONS` (and `NODELET_FUZZ_SEED`) run it longer on demand.
    #[test]
    fn mutated_manifests_never_panic() {
        let number = |var: &str, default: u64| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        let iterations = number("NODELET_FUZZ_ITERATIONS", 3000);
        let mut rng = Rng(number("NODELET_FUZZ_SEED", 0x9e37_79b9_7f4a_7c15).max(1));
        let json =
            serde_json::to_vec(&serde_yaml_ng::from_str::<serde_json::Value>(VALID).unwrap())
                .unwrap();
        let objects = manifest(
            OBJECTS.as_bytes(),
            "n",
            (StaticOrigin::File("f"), ApiReferences::Local),
            "t",
        )
        .unwrap();
        assert_eq!((objects.pods.len(), objects.objects.len()), (1, 2));
        let seeds = [VALID.as_bytes().to_vec(), json, OBJECTS.as_bytes().to_vec()];
        for i in 0..iterations {
            let mut bytes = seeds[(i % 3) as usize].clone();
            for _ in 0..=rng.below(4) {
                let at = rng.below(bytes.len());
                match rng.below(5) {
                    0 => bytes[at] = rng.next() as u8,
                    1 => {
                        bytes.remove(at);
                    }
                    2 => {
                        let end = (at + rng.below(16)).min(bytes.len());
                        let chunk = bytes[at..end].to_vec();
                        bytes.splice(at..at, chunk);
                    }
                    3 => bytes.truncate(at),
                    _ => {
                        let tokens: [&[u8]; 6] = [b"&a ", b"*a", b"- ", b"{", b"]", b"\n---\n"];
                        let t = tokens[rng.below(tokens.len())];
                        bytes.splice(at..at, t.iter().copied());
                    }
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = manifest(
                &bytes,
                "n",
                (StaticOrigin::File("/m/x.yaml"), ApiReferences::Local),
                "t",
            );
        }
    }

    #[test]
    fn in_a_cluster_static_pods_referring_to_api_objects_are_refused() {
        let origin = StaticOrigin::File("/m/objects.yaml");
        assert!(manifest(OBJECTS.as_bytes(), "n", (origin, ApiReferences::Local), "t").is_ok());
        let problems = manifest(
            OBJECTS.as_bytes(),
            "n",
            (origin, ApiReferences::Refused),
            "t",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].ends_with("static pods may not reference secrets"),
            "{problems:?}"
        );
        let account = VALID.replace("spec:\n", "spec:\n  serviceAccountName: robot\n");
        let problems = manifest(
            account.as_bytes(),
            "n",
            (origin, ApiReferences::Refused),
            "t",
        )
        .unwrap_err();
        assert!(problems[0].ends_with("static pods may not reference serviceaccounts"));
        assert!(manifest(VALID.as_bytes(), "n", (origin, ApiReferences::Refused), "t").is_ok());
    }

    #[test]
    fn yaml_bombs_and_deep_nesting_are_refused() {
        let mut bomb = String::from(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: bomb}\nx0: &x0 [a, a, a, a, a, a, a, a, a, a]\n",
        );
        for i in 1..10 {
            let prev = format!("*x{}", i - 1);
            bomb += &format!("x{i}: &x{i} [{}]\n", vec![prev; 10].join(", "));
        }
        assert!(
            manifest(
                bomb.as_bytes(),
                "n",
                (StaticOrigin::File("f"), ApiReferences::Local),
                "t"
            )
            .is_err()
        );
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(
            manifest(
                deep.as_bytes(),
                "n",
                (StaticOrigin::File("f"), ApiReferences::Local),
                "t"
            )
            .is_err()
        );
    }
}
