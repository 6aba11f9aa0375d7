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

/// An image the runtime has: its ID and the user it runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    /// The image's numeric user, when it names one.
    pub uid: Option<i64>,
    /// The image's user name, when it names one that is not numeric.
    pub username: String,
}

impl From<cri::Image> for Image {
    fn from(i: cri::Image) -> Self {
        Image {
            id: i.id,
            uid: i.uid.map(|u| u.value),
            username: i.username,
        }
    }
}

/// Makes sure the runtime has `image` according to `policy` (Always, IfNotPresent, Never).
pub async fn ensure(
    runtime: &RuntimeClient,
    image: &str,
    policy: &str,
    sandbox: &cri::PodSandboxConfig,
) -> Result<Image, Error> {
    let inspect = |source| Error::Inspect {
        image: image.into(),
        source,
    };
    if policy != "Always" {
        match runtime.image_status(image).await.map_err(inspect)? {
            Some(found) => return Ok(found.into()),
            None if policy == "Never" => {
                return Err(Error::NeverPull {
                    image: image.into(),
                });
            }
            None => {}
        }
    }
    tracing::info!(image, policy, "pulling image");
    let pulled = runtime
        .pull_image(image, Some(sandbox.clone()))
        .await
        .map_err(|source| Error::Pull {
            image: image.into(),
            source,
        })?;
    Ok(
        match runtime.image_status(&pulled).await.map_err(inspect)? {
            Some(found) => found.into(),
            None => Image {
                id: pulled,
                uid: None,
                username: String::new(),
            },
        },
    )
}
