//! What decides that a running container no longer matches its spec.
//!
//! Two records go on every container. `io.kubernetes.container.hash` (annotation) is the
//! upstream-shaped hash over the whole container, for tools that show it. The decision reads
//! `nodelet.io/container-digest` (label): a versioned digest over an explicit list of fields, so
//! a new nodelet whose API types grew fields, or whose defaulting fills new ones, computes the
//! same digest for the same spec and restarts nothing. A digest of a version this nodelet does not
//! compute (an older or newer nodelet's, or none) never restarts a container by itself: only the
//! fields the runtime shows are compared then.

use k8s_openapi::api::core::v1::Container;

/// FNV-1a (64 bit) over the container's JSON, resources left out as upstream does since
/// in-place resize.
pub fn container_hash(container: &Container) -> String {
    let mut c = container.clone();
    c.resources = None;
    format!("{:x}", fnv(&serde_json::to_vec(&c).unwrap_or_default()))
}

/// The digest's version. A field added to [`DIGEST_FIELDS`] or a change of encoding takes a new
/// version (the golden unit test below fails until it does).
const DIGEST_VERSION: &str = "v1";

/// The container fields whose change makes a new container; resources and resizePolicy are
/// resized in place.
const DIGEST_FIELDS: [&str; 22] = [
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "ports",
    "envFrom",
    "env",
    "volumeMounts",
    "volumeDevices",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
    "restartPolicy",
];

/// `v1:<hex>`: FNV-1a over `field=<JSON>` lines of the fields of [`DIGEST_FIELDS`] that are set.
pub fn container_digest(container: &Container) -> String {
    let value = serde_json::to_value(container).unwrap_or_default();
    let mut text = Vec::new();
    for field in DIGEST_FIELDS {
        if let Some(v) = value.get(field).filter(|v| !v.is_null()) {
            text.extend_from_slice(field.as_bytes());
            text.push(b'=');
            text.extend_from_slice(v.to_string().as_bytes());
            text.push(b'\n');
        }
    }
    format!("{DIGEST_VERSION}:{:x}", fnv(&text))
}

/// Whether a container recorded with `digest`, reporting `image` as the image its creator asked
/// for (empty where the runtime does not say), must be replaced to run `want`.
pub fn changed(digest: &str, image: &str, want: &Container) -> bool {
    match digest.split_once(':') {
        Some((DIGEST_VERSION, _)) => digest != container_digest(want),
        _ => !image.is_empty() && want.image.as_deref().is_some_and(|i| i != image),
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn busybox() -> Container {
        Container {
            name: "a".into(),
            image: Some("busybox:1".into()),
            command: Some(vec!["sleep".into(), "3600".into()]),
            ..Default::default()
        }
    }

    #[test]
    fn hash_changes_with_the_spec_but_not_with_resources() {
        let a = busybox();
        let mut b = a.clone();
        b.resources = Some(ResourceRequirements::default());
        assert_eq!(container_hash(&a), container_hash(&b));
        b.image = Some("busybox:2".into());
        assert_ne!(container_hash(&a), container_hash(&b));
    }

    /// A new value here is a new digest for every running container: bump [`DIGEST_VERSION`].
    #[test]
    fn the_digest_of_a_known_spec_stays_what_it_was() {
        assert_eq!(container_digest(&busybox()), "v1:eb11b7fee7ed77a5");
    }

    #[test]
    fn the_digest_follows_its_fields_only() {
        let a = busybox();
        let mut b = a.clone();
        b.resources = Some(ResourceRequirements::default());
        b.resize_policy = Some(Vec::new());
        assert_eq!(container_digest(&a), container_digest(&b));
        b.args = Some(vec!["x".into()]);
        assert_ne!(container_digest(&a), container_digest(&b));
    }

    #[test]
    fn a_digest_of_another_version_compares_only_the_image() {
        let want = busybox();
        assert!(!changed(&container_digest(&want), "", &want));
        let mut edited = want.clone();
        edited.args = Some(vec!["x".into()]);
        assert!(changed(&container_digest(&want), "", &edited));
        // Written by an older nodelet (no digest) or a newer one (another version).
        for old in ["", "v0:1234", "v9:abcd", "1234"] {
            assert!(!changed(old, "", &edited), "{old}");
            assert!(!changed(old, "busybox:1", &edited), "{old}");
            assert!(changed(old, "busybox:0", &edited), "{old}");
        }
    }
}
