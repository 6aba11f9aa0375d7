//! Images for containers: the pull policy decides whether the runtime's ImageService pulls.

use crate::runtime::{self, RuntimeClient, cri};

/// Why a container's image is not available, with the kubelet's waiting reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("image {image:?} is not present and the pull policy is Never")]
    NeverPull { image: String },
    #[error("pulling image {image:?} failed")]
    Pull {
        image: String,
        #[source]
        source: runtime::Error,
    },
    #[error("cannot inspect image {image:?}")]
    Inspect {
        image: String,
        #[source]
        source: runtime::Error,
    },
}

impl Error {
    /// The container waiting reason users see, as upstream.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NeverPull { .. } => "ErrImageNeverPull",
            Error::Pull { .. } | Error::Inspect { .. } => "ErrImagePull",
        }
    }
}

/// Makes sure the runtime has `image` according to `policy` (Always, IfNotPresent, Never) and
/// returns the reference to create the container from.
pub async fn ensure(
    runtime: &RuntimeClient,
    image: &str,
    policy: &str,
    sandbox: &cri::PodSandboxConfig,
) -> Result<String, Error> {
    if policy != "Always" {
        let present = runtime
            .image_status(image)
            .await
            .map_err(|source| Error::Inspect {
                image: image.into(),
                source,
            })?;
        match present {
            Some(found) => return Ok(found.id),
            None if policy == "Never" => {
                return Err(Error::NeverPull {
                    image: image.into(),
                });
            }
            None => {}
        }
    }
    tracing::info!(image, policy, "pulling image");
    runtime
        .pull_image(image, Some(sandbox.clone()))
        .await
        .map_err(|source| Error::Pull {
            image: image.into(),
            source,
        })
}
