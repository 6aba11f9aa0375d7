//! The node's heartbeat: its Lease in `kube-node-lease`, renewed every quarter of its duration
//! (each renewal given half that to answer), owned by the Node once the Node's UID is known, and
//! created again when it is deleted.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// How long a failed renewal waits before the next try: upstream's 200 ms doubling to 7 s.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(7);

/// The lease as nodelet wants it now.
fn lease(node: &str, duration_seconds: u32, owner: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            owner_references: owner.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(duration_seconds as i32),
            renew_time: Some(MicroTime(crate::types::now())),
            ..Default::default()
        }),
    }
}

/// Renews (or creates) the lease once.
async fn renew(leases: &Api<Lease>, wanted: &Lease) -> kube::Result<()> {
    let name = wanted.metadata.name.as_deref().unwrap_or_default();
    let mut patch = serde_json::json!({"spec": wanted.spec});
    if let Some(owners) = &wanted.metadata.owner_references {
        patch["metadata"] = serde_json::json!({"ownerReferences": owners});
    }
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            leases.create(&PostParams::default(), wanted).await?;
            tracing::info!(lease = %name, "created the node lease");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Keeps the node's lease renewed until `cancel`.
pub async fn run(
    client: kube::Client,
    node: String,
    duration_seconds: u32,
    mut node_uid: watch::Receiver<Option<String>>,
    cancel: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let interval = Duration::from_secs(u64::from(duration_seconds)) / 4;
    // With retries no further apart, a path that comes back sees a renewal within an interval.
    let deadline = (interval / 2).max(Duration::from_secs(1));
    let mut retry = RETRY_FIRST;
    loop {
        let owner = node_uid.borrow_and_update().clone();
        let wanted = lease(&node, duration_seconds, owner.as_deref());
        // A renewal gets half an interval to answer: a connection black-holed on the way is
        // given up with the request, and the next try goes over another one.
        let renewed = match tokio::time::timeout(deadline, renew(&leases, &wanted)).await {
            Ok(done) => done.map_err(|e| crate::types::error_chain(&e)),
            Err(_) => Err(format!("no answer within {deadline:?}")),
        };
        let wait = match renewed {
            Ok(()) => {
                retry = RETRY_FIRST;
                interval
            }
            Err(why) => {
                tracing::warn!(lease = %node, error = %why, "cannot renew the node lease");
                let wait = retry.min(deadline);
                retry = (retry * 2).min(RETRY_MAX);
                wait
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // A Node registered (again) owns the lease at once.
            Ok(()) = node_uid.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_held_by_the_node_and_owned_by_it_once_known() {
        let l = lease("n1", 40, None);
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert!(l.metadata.owner_references.is_none());
        let owned = lease("n1", 40, Some("u-1"));
        let owner = &owned.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "u-1"));
    }
}
