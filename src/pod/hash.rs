//! The container spec hash recorded on every container (`io.kubernetes.container.hash`): a
//! container whose recorded hash differs from its spec's current hash is replaced.

use k8s_openapi::api::core::v1::Container;

/// FNV-1a (64 bit) over the container's JSON, resources left out as upstream does since
/// in-place resize. Stable across restarts and builds of the agent, so running containers are adopted.
pub fn container_hash(container: &Container) -> String {
    let mut c = container.clone();
    c.resources = None;
    let json = serde_json::to_vec(&c).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_changes_with_the_spec_but_not_with_resources() {
        let a = Container {
            name: "a".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        b.resources = Some(Default::default());
        assert_eq!(container_hash(&a), container_hash(&b));
        b.image = Some("busybox:2".into());
        assert_ne!(container_hash(&a), container_hash(&b));
        assert_eq!(container_hash(&a), container_hash(&a.clone()));
    }
}
