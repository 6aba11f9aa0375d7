//! Static-pod rules: the node-suffixed name, the content-hashed UID and the config annotations.

use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};

use crate::types::Source;

/// The pod's config hash (its UID for static pods).
pub const ANNOTATION_CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// The source the pod came from: file, http or api.
pub const ANNOTATION_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// When the agent first saw the pod.
pub const ANNOTATION_CONFIG_SEEN: &str = "kubernetes.io/config.seen";

/// How long ago the agent first saw the pod's config (its `config.seen` annotation).
pub fn since_seen(pod: &k8s_openapi::api::core::v1::Pod) -> Option<std::time::Duration> {
    let seen: k8s_openapi::jiff::Timestamp = pod
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_CONFIG_SEEN)?
        .parse()
        .ok()?;
    let took = crate::types::now().duration_since(seen).as_secs_f64();
    Some(std::time::Duration::from_secs_f64(took.max(0.0)))
}
/// On a mirror pod: the hash of the static pod it mirrors.
pub const ANNOTATION_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// Where a static pod was read from: the file path or the manifest URL.
#[derive(Clone, Copy, Debug)]
pub enum StaticOrigin<'a> {
    File(&'a str),
    Url(&'a str),
}

impl StaticOrigin<'_> {
    fn source(self) -> Source {
        match self {
            StaticOrigin::File(_) => Source::File,
            StaticOrigin::Url(_) => Source::Http,
        }
    }
}

/// Applies the static-pod rules to a decoded and defaulted pod. `seen` is the RFC 3339 time the
/// pod was read. Names must have been checked to be present by the caller's validation.
pub fn make_static(pod: &mut Pod, node: &str, origin: StaticOrigin<'_>, seen: &str) {
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let mut hasher = Sha256::new();
        hasher.update(serde_json::to_vec(&*pod).unwrap_or_default());
        hasher.update(format!("host:{node}"));
        match origin {
            StaticOrigin::File(path) => hasher.update(format!("file:{path}")),
            StaticOrigin::Url(url) => hasher.update(format!("url:{url}")),
        }
        let digest = hasher.finalize();
        pod.metadata.uid = Some(digest[..16].iter().map(|b| format!("{b:02x}")).collect());
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{node}"));
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_CONFIG_HASH.into(), uid);
    annotations.insert(
        ANNOTATION_CONFIG_SOURCE.into(),
        origin.source().as_str().into(),
    );
    annotations.insert(ANNOTATION_CONFIG_SEEN.into(), seen.into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.into());
        if matches!(origin, StaticOrigin::File(_)) {
            spec.tolerations
                .get_or_insert_with(Vec::new)
                .push(Toleration {
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    ..Default::default()
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{apply_defaults, decode_manifest};

    fn static_pod(yaml: &str, node: &str, origin: StaticOrigin<'_>) -> Pod {
        let mut pod = decode_manifest(yaml).unwrap().pods.remove(0);
        apply_defaults(&mut pod);
        make_static(&mut pod, node, origin, "2026-11-29T00:00:00Z");
        pod
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: c, image: 'busybox:1'}]\n";

    #[test]
    fn static_pods_are_named_after_the_node_and_annotated() {
        let pod = static_pod(POD, "node-a", StaticOrigin::File("/m/web.yaml"));
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-a"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = pod.metadata.annotations.unwrap();
        assert_eq!(ann[ANNOTATION_CONFIG_HASH], uid);
        assert_eq!(ann[ANNOTATION_CONFIG_SOURCE], "file");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        let t = &spec.tolerations.unwrap()[0];
        assert_eq!(
            (t.operator.as_deref(), t.effect.as_deref()),
            (Some("Exists"), Some("NoExecute"))
        );
    }

    #[test]
    fn uids_are_stable_and_change_with_content_node_and_source() {
        let uid =
            |yaml: &str, node: &str, origin| static_pod(yaml, node, origin).metadata.uid.unwrap();
        let base = uid(POD, "n", StaticOrigin::File("/m/web.yaml"));
        assert_eq!(base, uid(POD, "n", StaticOrigin::File("/m/web.yaml")));
        assert_ne!(
            base,
            uid(
                &POD.replace("busybox:1", "busybox:2"),
                "n",
                StaticOrigin::File("/m/web.yaml")
            )
        );
        assert_ne!(base, uid(POD, "m", StaticOrigin::File("/m/web.yaml")));
        assert_ne!(base, uid(POD, "n", StaticOrigin::File("/m/other.yaml")));
        assert_ne!(base, uid(POD, "n", StaticOrigin::Url("http://x/")));
    }

    #[test]
    fn a_given_uid_is_kept() {
        let pod = static_pod(
            &POD.replace("{name: web}", "{name: web, uid: abc}"),
            "n",
            StaticOrigin::Url("u"),
        );
        assert_eq!(pod.metadata.uid.as_deref(), Some("abc"));
        assert!(pod.spec.unwrap().tolerations.is_none());
    }
}
