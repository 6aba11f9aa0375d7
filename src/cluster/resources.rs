//! The API server's side of dynamic resource allocation: the ResourceClaims pods use, read when
//! their drivers prepare them, and the node's ResourceSlices, deleted when their drivers are
//! gone (the Node authorizer lets a node do exactly these).

use futures_util::future::BoxFuture;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams};

/// The DRA manager's API, for the node `node`.
pub struct ResourceApi {
    client: kube::Client,
    node: String,
}

impl ResourceApi {
    pub fn new(client: kube::Client, node: &str) -> ResourceApi {
        ResourceApi {
            client,
            node: node.to_string(),
        }
    }
}

impl crate::cm::dra::Api for ResourceApi {
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            claims
                .get(name)
                .await
                .map_err(|e| crate::types::error_chain(&e))
        })
    }

    fn delete_slices<'a>(&'a self, driver: Option<&'a str>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let slices: Api<ResourceSlice> = Api::all(self.client.clone());
            let mut fields = format!("spec.nodeName={}", self.node);
            if let Some(driver) = driver {
                fields.push_str(&format!(",spec.driver={driver}"));
            }
            let listed = ListParams::default().fields(&fields);
            slices
                .delete_collection(&DeleteParams::default(), &listed)
                .await
                .map(drop)
                .map_err(|e| crate::types::error_chain(&e))
        })
    }
}
