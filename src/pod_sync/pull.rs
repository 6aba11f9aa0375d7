//! The images a container to start needs: its own and those of its image volumes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::start::Prepared;
use super::{Error, Syncer, actions};
use crate::events::Target;
use crate::images;
use crate::pod::spec;
use crate::types::PodUid;

/// The images a container to start needs, in the runtime.
#[derive(Default)]
pub(super) struct Pulled {
    /// Its own (none when the spec has no such container).
    pub image: Option<images::Image>,
    /// Its image volumes' image IDs by volume name.
    pub volumes: HashMap<String, String>,
}

impl Syncer {
    /// Makes sure the runtime has the images the container to start needs: its own and those
    /// of its image volumes (by volume name).
    pub(super) async fn pull_images(
        &self,
        pod: &Pod,
        start: &actions::Start,
        prepared: &Prepared<'_>,
    ) -> Result<Pulled, Error> {
        let s = spec(pod);
        let Some(container) = crate::pod::find_container(s, &start.name) else {
            return Ok(Pulled::default());
        };
        let image = container.image.as_deref().unwrap_or_default();
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let secrets = images::pull_secrets(pod, prepared.objects);
        let request = images::Request {
            pod: &PodUid::of(pod),
            target: &Target::container(pod, &start.name),
            image,
            policy,
            sandbox: prepared.sandbox_config,
            secrets: &secrets,
            diagnoses: &self.diagnoses,
        };
        let pull = async |request: &images::Request<'_>| {
            self.images
                .ensure(request)
                .await
                .map_err(|source| Error::Image {
                    container: start.name.clone(),
                    reason: source.reason(),
                    source,
                })
        };
        let mut pulled = Pulled {
            image: Some(pull(&request).await?),
            volumes: HashMap::new(),
        };
        for m in container.volume_mounts.iter().flatten() {
            let Some(source) = s
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == m.name)
                .and_then(|v| v.image.as_ref())
            else {
                continue;
            };
            let request = images::Request {
                image: source.reference.as_deref().unwrap_or_default(),
                policy: source.pull_policy.as_deref().unwrap_or("IfNotPresent"),
                ..request
            };
            let image = pull(&request).await?;
            pulled.volumes.insert(m.name.clone(), image.id);
        }
        Ok(pulled)
    }
}
