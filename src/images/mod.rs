//! Images for containers, pulled through the runtime's ImageService the kubelet's way: the pull
//! policy decides whether to pull, references are checked and given their default tag,
//! node-level credentials come from the docker keyring and credential provider plugins, failed
//! pulls back off per pod and image
//! (ErrImagePull, then ImagePullBackOff), and pulls are paced (in parallel in a bounded pool
//! no registry may fill, or serialized; QPS with a burst) with one pull per image at a time.

mod credential_provider;
pub mod gc;
mod keyring;
mod progress;
mod pull_records;
mod reference;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;

use crate::backoff::{Backoff, TokenBucket};
use crate::events::{Recorder, Target};
use crate::runtime::{self, RuntimeClient, cri};
use crate::types::PodUid;

pub use credential_provider::Providers;
pub use keyring::Keyring;
pub use pull_records::{PullRecords, SecretRef};
pub use reference::{Reference, parse as parse_reference};

/// The most pulls at once when pulls are parallel and maxParallelImagePulls is not set.
pub const DEFAULT_PARALLEL_PULLS: u32 = 10;

/// First delay after a failed pull; it doubles up to [`PULL_BACKOFF_MAX`] (upstream values).
pub const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why a container's image is not available, with the kubelet's waiting reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Failed to apply default image tag {image:?}: couldn't parse image name: {why}")]
    InvalidName { image: String, why: String },
    #[error("Container image {image:?} is not present with pull policy of Never")]
    NeverPull { image: String },
    #[error("Failed to pull image {image:?}")]
    Pull {
        image: String,
        #[source]
        source: runtime::Error,
    },
    /// No progress for the deadline: `why` names the registry, the window and the bytes.
    #[error("Failed to pull image {image:?}: {why}; the pull was cancelled")]
    Stalled { image: String, why: String },
    #[error("Back-off pulling image {image:?}")]
    BackOff { image: String, remaining: Duration },
    #[error("cannot inspect image {image:?}")]
    Inspect {
        image: String,
        #[source]
        source: runtime::Error,
    },
    #[error("Failed to record image pull intent for container image {image:?}")]
    Intent {
        image: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The container waiting reason users see, as upstream.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidName { .. } => "InvalidImageName",
            Error::NeverPull { .. } => "ErrImageNeverPull",
            Error::BackOff { .. } => "ImagePullBackOff",
            Error::Pull { .. }
            | Error::Stalled { .. }
            | Error::Inspect { .. }
            | Error::Intent { .. } => "ErrImagePull",
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
    /// Bytes, as the runtime counts them.
    pub size: u64,
    /// The references the runtime knows it by (its repository tags and digests).
    pub names: Vec<String>,
}

impl From<cri::Image> for Image {
    fn from(i: cri::Image) -> Self {
        Image {
            id: i.id,
            uid: i.uid.map(|u| u.value),
            username: i.username,
            size: i.size,
            names: i.repo_tags.into_iter().chain(i.repo_digests).collect(),
        }
    }
}

/// How pulls are made.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where `config.json` / `.dockercfg` are looked for first (--root-dir).
    pub root_dir: PathBuf,
    /// One pull at a time (serializeImagePulls; nodelet's default is false).
    pub serialize: bool,
    /// With parallel pulls, at most this many at once (maxParallelImagePulls; none means
    /// [`DEFAULT_PARALLEL_PULLS`]).
    pub max_parallel: Option<u32>,
    /// Pulls per second (registryPullQPS, default 5; 0 = no limit) with a burst (registryBurst).
    pub qps: f64,
    pub burst: u32,
    /// First delay after a failed pull.
    pub backoff_initial: Duration,
    /// Credential provider plugins (--image-credential-provider-config), asked after the
    /// pod's pull secrets and the docker config file.
    pub credential_providers: Option<Arc<Providers>>,
    /// A pull whose downloads do not move for this long is cancelled
    /// (--image-pull-progress-deadline); `None`: never.
    pub progress_deadline: Option<Duration>,
    /// Which credentials each image was pulled with, so that a pod proves it may use an image
    /// on the node (`None`: KubeletEnsureSecretPulledImages is off, any pod may).
    pub pull_records: Option<Arc<PullRecords>>,
}

/// How often a pull's progress is looked at.
const PROGRESS_SAMPLE: Duration = Duration::from_secs(1);

/// How often a pull's progress is told in the pod's events.
const PROGRESS_EVENTS: Duration = Duration::from_secs(10);

/// The pull pool: at most `total` pulls at once, and no registry holds more than half of them,
/// so a registry that stalls leaves the others room. Waiters are served in order.
struct Slots {
    total: tokio::sync::Semaphore,
    size: usize,
    per_registry: usize,
    registries: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// A pull's place in the pool.
struct Slot<'a> {
    _registry: tokio::sync::OwnedSemaphorePermit,
    _total: tokio::sync::SemaphorePermit<'a>,
}

impl Slots {
    fn new(total: usize) -> Slots {
        let total = total.max(1);
        Slots {
            total: tokio::sync::Semaphore::new(total),
            size: total,
            per_registry: (total / 2).max(1),
            registries: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a place for a pull from `registry`: first among its pulls, then in the pool.
    async fn acquire(&self, registry: &str) -> Option<Slot<'_>> {
        let queue = {
            let mut registries = self.registries.lock().unwrap_or_else(|e| e.into_inner());
            // A registry no pull holds or waits for is forgotten as others are named.
            registries.retain(|_, q| Arc::strong_count(q) > 1);
            registries
                .entry(registry.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_registry)))
                .clone()
        };
        let registry = queue.acquire_owned().await.ok()?;
        let total = self.total.acquire().await.ok()?;
        Some(Slot {
            _registry: registry,
            _total: total,
        })
    }
}

/// How a watched pull failed.
enum Watched {
    Failed(runtime::Error),
    /// Its downloads did not move for the deadline.
    Stalled(Duration),
}

/// Pulls images for pods.
pub struct Puller {
    runtime: RuntimeClient,
    config: Config,
    events: Recorder,
    slots: Slots,
    bucket: Mutex<TokenBucket>,
    backoff: Mutex<Backoff>,
    /// One lock per image: a second pod waits for the first pull instead of pulling again.
    in_flight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What one container needs.
pub struct Request<'a> {
    pub pod: &'a PodUid,
    /// The container, for the pull events.
    pub target: &'a Target,
    pub image: &'a str,
    /// Always, IfNotPresent or Never.
    pub policy: &'a str,
    pub sandbox: &'a cri::PodSandboxConfig,
    /// The pod's imagePullSecrets, tried before the node's credentials.
    pub secrets: &'a [PullSecret],
    /// Where the pod's wait on the pull shows (`nodelet describe`).
    pub diagnoses: &'a crate::status::Diagnoses,
}

/// One of the pod's imagePullSecrets: the Secret, and the registry logins it holds.
pub struct PullSecret {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub keyring: Keyring,
}

/// The pod's imagePullSecrets that hold docker configs (`kubernetes.io/dockerconfigjson` or
/// the legacy `kubernetes.io/dockercfg`). A missing or unreadable one is reported and skipped:
/// the pull is tried without it, as upstream does.
pub fn pull_secrets(pod: &Pod, objects: &crate::objects::View) -> Vec<PullSecret> {
    let names = crate::pod::spec(pod)
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.as_str());
    let mut out = Vec::new();
    for name in names {
        let Some(secret) = objects.get(crate::objects::Kind::Secret, name) else {
            tracing::warn!(pod = %crate::types::full_name(pod), secret = %name, "the image pull secret is missing; pulling without it");
            continue;
        };
        let parsed = match (
            secret.data.get(".dockerconfigjson"),
            secret.data.get(".dockercfg"),
        ) {
            (Some(json), _) => Keyring::parse(json, true),
            (None, Some(cfg)) => Keyring::parse(cfg, false),
            (None, None) => Err("it has neither .dockerconfigjson nor .dockercfg".into()),
        };
        match parsed {
            Ok(keyring) => out.push(PullSecret {
                uid: secret.uid.clone(),
                namespace: secret.namespace.clone(),
                name: secret.name.clone(),
                keyring,
            }),
            Err(why) => {
                tracing::warn!(pod = %crate::types::full_name(pod), secret = %name, "cannot use the image pull secret: {why}")
            }
        }
    }
    out
}

/// A login to try for a pull: its credentials (none: anonymous) and the pod's Secret they come
/// from (none: the node's own, which every pod may use).
struct Attempt {
    auth: Option<cri::AuthConfig>,
    secret: Option<SecretRef>,
}

/// The logins the pod's pull secrets hold for the image's registry and path.
fn secret_attempts(req: &Request<'_>, r: &Reference) -> Vec<Attempt> {
    let logins = req.secrets.iter().flat_map(|s| {
        let found = s.keyring.lookup(&r.domain, &r.path);
        found.into_iter().map(move |c| (s, c.auth_config()))
    });
    logins
        .map(|(s, auth)| Attempt {
            secret: Some(SecretRef {
                uid: s.uid.clone(),
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                credential_hash: pull_records::credential_hash(&auth),
            }),
            auth: Some(auth),
        })
        .collect()
}

impl Puller {
    pub fn new(runtime: RuntimeClient, config: Config, events: Recorder) -> Puller {
        let parallel = if config.serialize {
            1
        } else {
            config
                .max_parallel
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_PARALLEL_PULLS)
        };
        Puller {
            runtime,
            slots: Slots::new(parallel as usize),
            bucket: Mutex::new(TokenBucket::new(config.qps, config.burst, Instant::now())),
            backoff: Mutex::new(Backoff::new(config.backoff_initial, PULL_BACKOFF_MAX)),
            in_flight: Mutex::new(HashMap::new()),
            config,
            events,
        }
    }

    /// Makes sure the runtime has the request's image according to its pull policy.
    pub async fn ensure(&self, req: &Request<'_>) -> Result<Image, Error> {
        let image = req.image;
        // Whether the image was present and had to be pulled, as upstream counts each request
        // (None: not known, as for an invalid name or an image the runtime cannot inspect).
        let count = |present: Option<bool>, pull: Option<bool>| {
            crate::metrics::get().ensure_image_request(req.policy, present, pull);
        };
        let parsed = parse_reference(image).map_err(|why| {
            count(None, None);
            Error::InvalidName {
                image: image.into(),
                why,
            }
        })?;
        let wanted = reference::with_default_tag(image, &parsed);
        if req.policy != "Always" {
            let found = self
                .present(&wanted)
                .await
                .inspect_err(|_| count(None, None))?;
            let present = found.is_some();
            if let Some(found) = found
                && !self.must_pull(req, &parsed, &found)
            {
                count(Some(true), Some(false));
                let message = match self.config.pull_records {
                    Some(_) => format!(
                        "Container image {image:?} already present on machine and can be accessed by the pod"
                    ),
                    None => format!("Container image {image:?} already present on machine"),
                };
                self.events.normal(req.target.clone(), "Pulled", message);
                return Ok(found);
            }
            if req.policy == "Never" {
                count(Some(present), present.then_some(true));
                return Err(Error::NeverPull {
                    image: image.into(),
                });
            }
            count(Some(present), Some(true));
        } else {
            count(None, Some(true));
        }
        self.pull_once(req, &wanted, &parsed).await
    }

    /// Pulls the image unless the pod's pulls of it are backing off, one pull per image at a
    /// time (a pod that waited for another's may find it present).
    async fn pull_once(
        &self,
        req: &Request<'_>,
        wanted: &str,
        parsed: &Reference,
    ) -> Result<Image, Error> {
        let image = req.image;
        let key = format!("{}_{wanted}", req.pod);
        let remaining = self
            .backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remaining_since_last(&key, SystemTime::now());
        if let Some(remaining) = remaining {
            self.events.normal(
                req.target.clone(),
                "BackOff",
                format!("Back-off pulling image {image:?}"),
            );
            return Err(Error::BackOff {
                image: image.into(),
                remaining,
            });
        }
        // The pod's pull lasts from here, its wait on another pod's pull of the image included.
        let started = Instant::now();
        let lock = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(wanted.to_string())
            .or_default()
            .clone();
        let waiting = format!("another pod's pull of image {image:?}");
        let step = req.diagnoses.begin(req.pod, waiting);
        let _one_pull_per_image = lock.lock().await;
        drop(step);
        // Another pod may have pulled it while this one waited, with credentials this pod
        // may not have.
        if req.policy != "Always"
            && let Some(found) = self.present(wanted).await?
            && !self.must_pull(req, parsed, &found)
        {
            crate::pod_startup::get().pulled(&req.pod.0, started);
            return Ok(found);
        }
        if let Some(records) = &self.config.pull_records {
            records
                .pull_started(image)
                .map_err(|source| Error::Intent {
                    image: image.into(),
                    source,
                })?;
        }
        // Boxed: a pull's state is large, and most requests find the image present.
        let result = Box::pin(self.pull(req, wanted, parsed)).await;
        crate::pod_startup::get().pulled(&req.pod.0, started);
        if let Some(records) = &self.config.pull_records {
            let pulled = result.as_ref().ok();
            records.pull_ended(
                image,
                pulled.map(|(i, secret)| (i.id.as_str(), secret.clone())),
            );
        }
        let result = result.map(|(image, _)| image);
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(found) => {
                backoff.forget_key(&key);
                Ok(found)
            }
            Err(e) => {
                backoff.next(&key, SystemTime::now());
                Err(e)
            }
        }
    }

    async fn present(&self, image: &str) -> Result<Option<Image>, Error> {
        let found = self
            .runtime
            .image_status(image)
            .await
            .map_err(|source| Error::Inspect {
                image: image.into(),
                source,
            })?;
        Ok(found.map(Image::from))
    }

    /// Waits for a pull slot for the registry and a QPS token.
    async fn paced(&self, registry: &str) -> Option<Slot<'_>> {
        let permit = self.slots.acquire(registry).await;
        if self.config.qps > 0.0 {
            loop {
                let taken = self
                    .bucket
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(Instant::now());
                match taken {
                    Ok(()) => break,
                    Err(d) => tokio::time::sleep(d).await,
                }
            }
        }
        permit
    }

    /// Whether the pod must pull the image it found on the node to show it may use it.
    fn must_pull(&self, req: &Request<'_>, r: &Reference, found: &Image) -> bool {
        let Some(records) = &self.config.pull_records else {
            return false;
        };
        // The pod's credentials are hashed only when a record is to be matched.
        let secrets = || -> Vec<SecretRef> {
            (secret_attempts(req, r).into_iter())
                .filter_map(|a| a.secret)
                .collect()
        };
        let named = found.names.contains(&r.to_string());
        records.must_pull(req.image, (&found.id, named), secrets)
    }

    /// Pulls with each matching credential in turn (or none when none match) until one works;
    /// returns the image and the pod's Secret whose credentials it was pulled with, if any.
    async fn pull(
        &self,
        req: &Request<'_>,
        wanted: &str,
        r: &Reference,
    ) -> Result<(Image, Option<SecretRef>), Error> {
        let image = req.image;
        let waiting = format!(
            "a pull slot for image {image:?} (at most {} pulls at once, {} from registry {})",
            self.slots.size, self.slots.per_registry, r.domain
        );
        let step = req.diagnoses.begin(req.pod, waiting);
        let _slot = self.paced(&r.domain).await;
        drop(step);
        let pulling = format!("registry {} to serve image {image:?}", r.domain);
        let step = req.diagnoses.begin(req.pod, pulling);
        let attempts = self.credentials(req, r).await;
        self.events.normal(
            req.target.clone(),
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        let started = Instant::now();
        let mut progress = progress::Progress::new(crate::types::now_ns());
        let mut attempts = attempts.into_iter();
        let pull = |auth| {
            self.runtime
                .pull_image(wanted, auth, Some(req.sandbox.clone()))
        };
        let first = attempts.next().unwrap_or(Attempt {
            auth: None,
            secret: None,
        });
        let mut used = first.secret;
        let mut outcome = self
            .watched(req, &r.domain, &step, &mut progress, pull(first.auth))
            .await;
        for attempt in attempts {
            // Another credential may be let in; a registry that stalls stalls for all.
            if !matches!(outcome, Err(Watched::Failed(_))) {
                break;
            }
            used = attempt.secret;
            outcome = self
                .watched(req, &r.domain, &step, &mut progress, pull(attempt.auth))
                .await;
        }
        let image = self.pulled(req, r, outcome, started, &progress).await?;
        Ok((image, used))
    }

    /// The logins to try for the pull, in order: the pod's pull secrets, the node's keyring,
    /// then the credential providers'; one attempt without any when there are none.
    async fn credentials(&self, req: &Request<'_>, r: &Reference) -> Vec<Attempt> {
        let mut node = Keyring::load(&self.config.root_dir).lookup(&r.domain, &r.path);
        if let Some(providers) = &self.config.credential_providers {
            node.extend(providers.lookup(&r.domain, &r.path).await);
        }
        let mut attempts = secret_attempts(req, r);
        attempts.extend(node.iter().map(|c| Attempt {
            auth: Some(c.auth_config()),
            secret: None,
        }));
        tracing::debug!(image = %req.image, credentials = attempts.len(), "credentials found for the pull");
        if attempts.is_empty() {
            attempts.push(Attempt {
                auth: None,
                secret: None,
            });
        }
        attempts
    }

    /// The pull's end: the image pulled (with its Pulled event), or the error and its event.
    async fn pulled(
        &self,
        req: &Request<'_>,
        r: &Reference,
        outcome: Result<String, Watched>,
        started: Instant,
        progress: &progress::Progress,
    ) -> Result<Image, Error> {
        let image = req.image;
        match outcome {
            Ok(id) => {
                let found = self.present(&id).await?.unwrap_or(Image {
                    id,
                    uid: None,
                    username: String::new(),
                    size: 0,
                    names: Vec::new(),
                });
                self.events.normal(
                    req.target.clone(),
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s. Image size: {} bytes.",
                        started.elapsed().as_secs_f64(),
                        found.size
                    ),
                );
                Ok(found)
            }
            Err(Watched::Failed(source)) => {
                self.events.warning(
                    req.target.clone(),
                    "Failed",
                    format!("Failed to pull image {image:?}: {source}"),
                );
                Err(Error::Pull {
                    image: image.into(),
                    source,
                })
            }
            Err(Watched::Stalled(window)) => {
                let e = Error::Stalled {
                    image: image.into(),
                    why: format!(
                        "no progress from registry {} for {}s ({})",
                        r.domain,
                        window.as_secs(),
                        progress.describe(crate::types::now_ns())
                    ),
                };
                self.events
                    .warning(req.target.clone(), "Failed", e.to_string());
                Err(e)
            }
        }
    }

    /// Runs `pull` while watching the runtime's downloads: their progress goes to the pod's
    /// diagnosis at each look and to its events every [`PROGRESS_EVENTS`]; a pull whose
    /// downloads have not moved for the progress deadline is dropped, which cancels it.
    async fn watched(
        &self,
        req: &Request<'_>,
        registry: &str,
        step: &crate::status::StepGuard,
        progress: &mut progress::Progress,
        pull: impl std::future::Future<Output = runtime::Result<String>>,
    ) -> Result<String, Watched> {
        let mut pull = std::pin::pin!(pull);
        let mut look = tokio::time::interval(PROGRESS_SAMPLE);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut told = Instant::now();
        loop {
            tokio::select! {
                outcome = &mut pull => return outcome.map_err(Watched::Failed),
                _ = look.tick() => {}
            }
            // The pull's end is never held up by a listing that is slow to come.
            let listed = tokio::select! {
                outcome = &mut pull => return outcome.map_err(Watched::Failed),
                listed = self.runtime.downloads() => listed,
            };
            let downloads = match listed {
                Ok(Some(d)) => d,
                // A runtime that lists no downloads: nothing to judge the pull by.
                Ok(None) => return pull.await.map_err(Watched::Failed),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list the runtime's downloads");
                    continue;
                }
            };
            let now = crate::types::now_ns();
            progress.observe(&downloads, now);
            let said = progress.describe(now);
            step.progress(said.clone());
            if told.elapsed() >= PROGRESS_EVENTS {
                told = Instant::now();
                self.events.normal(
                    req.target.clone(),
                    "Pulling",
                    format!(
                        "Pulling image {:?} from registry {registry}: {said}",
                        req.image
                    ),
                );
            }
            if let Some(deadline) = self.config.progress_deadline
                && progress.idle(now) >= deadline
            {
                tracing::warn!(image = %req.image, %registry, "no pull progress for {}s; cancelling the pull", deadline.as_secs());
                return Err(Watched::Stalled(deadline));
            }
        }
    }

    /// Forgets the pull backoff of a pod that is gone.
    pub fn forget_pod(&self, uid: &PodUid) {
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_pod(&uid.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_registry_fills_the_pull_pool() {
        use futures_util::FutureExt as _;
        let slots = Slots::new(4);
        let a1 = slots.acquire("a.example").await.expect("a slot");
        let _a2 = slots.acquire("a.example").await.expect("a slot");
        let third = slots.acquire("a.example");
        tokio::pin!(third);
        assert!(
            third.as_mut().now_or_never().is_none(),
            "a registry holds half the pool at most"
        );
        let b1 = slots
            .acquire("b.example")
            .await
            .expect("another registry's slot");
        let _b2 = slots
            .acquire("b.example")
            .await
            .expect("another registry's slot");
        drop(a1);
        assert!(third.await.is_some(), "the waiter gets the freed place");
        drop(b1);

        let serialized = Slots::new(1);
        let only = serialized.acquire("a.example").await.expect("a slot");
        let other = serialized.acquire("b.example");
        tokio::pin!(other);
        assert!(other.as_mut().now_or_never().is_none(), "one at a time");
        drop(only);
        assert!(other.await.is_some());
    }

    #[test]
    fn reasons_are_the_kubelets() {
        let image = "x".to_string();
        assert_eq!(
            Error::BackOff {
                image: image.clone(),
                remaining: Duration::ZERO
            }
            .reason(),
            "ImagePullBackOff"
        );
        assert_eq!(
            Error::InvalidName {
                image: image.clone(),
                why: String::new()
            }
            .reason(),
            "InvalidImageName"
        );
        assert_eq!(Error::NeverPull { image }.reason(), "ErrImageNeverPull");
    }
}
