//! The API data the API pods refer to: each referenced ConfigMap and Secret is watched on its
//! own (upstream's default change detection; the Node authorizer lets a node read exactly
//! these), and each projected service account token is requested through TokenRequest, bound to
//! its pod, and requested again before it expires.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::watch_object;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::objects::{Key, Kind, Object, token_requests};

/// A failed token request is tried again after this long.
const TOKEN_RETRY: Duration = Duration::from_secs(5);
/// A token is renewed once 80 % of its life has passed, or after a day, as upstream; never
/// sooner than a minute after it was issued.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
const TOKEN_MIN_AGE: Duration = Duration::from_secs(60);

/// An issued token, and when to ask for a new one.
struct Issued {
    token: String,
    refresh_at: Instant,
}

/// A token request of one pod: namespace, pod name, pod UID and the request.
type TokenKey = (String, String, String, crate::objects::TokenRequest);

/// What the API pods refer to, kept current.
pub struct Referenced {
    client: kube::Client,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// One watch per referenced ConfigMap or Secret, stopped when no pod refers to it any more.
    watches: HashMap<Key, CancellationToken>,
    /// The watched objects that exist, by key.
    values: Arc<Mutex<BTreeMap<Key, Object>>>,
    changed: Arc<Notify>,
    tokens: HashMap<TokenKey, Issued>,
    /// Token requests that failed, and when to try again.
    failed: HashMap<TokenKey, Instant>,
}

impl Referenced {
    pub fn new(client: kube::Client, tracker: TaskTracker, cancel: CancellationToken) -> Self {
        Referenced {
            client,
            tracker,
            cancel,
            watches: HashMap::new(),
            values: Arc::default(),
            changed: Arc::default(),
            tokens: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    /// Notified whenever a watched object changes.
    pub fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Watches the ConfigMaps and Secrets `pods` refer to, and stops watching what they no
    /// longer do (tokens are issued, not watched: see [`Referenced::issue_tokens`]).
    pub fn follow(&mut self, pods: &[Arc<Pod>]) {
        let wanted: HashSet<Key> = (pods.iter())
            .flat_map(|p| crate::objects::references(p))
            .collect();
        self.watches.retain(|key, stop| {
            let keep = wanted.contains(key);
            if !keep {
                stop.cancel();
            }
            keep
        });
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values.retain(|key, _| wanted.contains(key));
        drop(values);
        for key in wanted {
            if self.watches.contains_key(&key) {
                continue;
            }
            let stop = self.cancel.child_token();
            let (client, values, changed) = (
                self.client.clone(),
                self.values.clone(),
                self.changed.clone(),
            );
            let watch = stop.clone();
            match key.0 {
                Kind::ConfigMap => self.tracker.spawn(watch_one::<ConfigMap>(
                    Api::namespaced(client, &key.1),
                    key.clone(),
                    crate::objects::config_map,
                    values,
                    changed,
                    watch,
                )),
                Kind::Secret => self.tracker.spawn(watch_one::<Secret>(
                    Api::namespaced(client, &key.1),
                    key.clone(),
                    crate::objects::secret,
                    values,
                    changed,
                    watch,
                )),
                Kind::RuntimeClass => self.tracker.spawn(watch_one::<RuntimeClass>(
                    Api::all(client),
                    key.clone(),
                    crate::objects::runtime_class,
                    values,
                    changed,
                    watch,
                )),
                Kind::ServiceAccountToken => continue,
            };
            self.watches.insert(key, stop);
        }
    }

    /// Requests the tokens `pods` need that are missing or due for renewal, forgets those no
    /// pod needs, and says when the next renewal (or retry) is due.
    pub async fn issue_tokens(&mut self, pods: &[Arc<Pod>]) -> Option<Instant> {
        let wanted: HashSet<TokenKey> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .flat_map(|p| {
                let namespace = p.metadata.namespace.clone().unwrap_or_default();
                let name = p.metadata.name.clone().unwrap_or_default();
                let uid = p.metadata.uid.clone().unwrap_or_default();
                token_requests(p)
                    .into_iter()
                    .map(move |r| (namespace.clone(), name.clone(), uid.clone(), r))
            })
            .collect();
        self.tokens.retain(|k, _| wanted.contains(k));
        self.failed.retain(|k, _| wanted.contains(k));
        let now = Instant::now();
        for key in &wanted {
            let due = self.tokens.get(key).is_none_or(|t| t.refresh_at <= now);
            let waiting = self.failed.get(key).is_some_and(|at| *at > now);
            if !due || waiting {
                continue;
            }
            match self.request(key).await {
                Ok(issued) => {
                    self.failed.remove(key);
                    self.tokens.insert(key.clone(), issued);
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", key.0, key.1), account = %key.3.service_account, error = %crate::types::error_chain(&e), "cannot get a service account token; retrying");
                    self.failed.insert(key.clone(), now + TOKEN_RETRY);
                }
            }
        }
        // A failed renewal waits for its retry, not for the refresh time that already passed.
        self.tokens
            .iter()
            .filter(|(k, _)| !self.failed.contains_key(*k))
            .map(|(_, t)| t.refresh_at)
            .chain(self.failed.values().copied())
            .min()
    }

    async fn request(&self, (namespace, pod, uid, r): &TokenKey) -> kube::Result<Issued> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: (!r.audience.is_empty()).then(|| vec![r.audience.clone()]),
                expiration_seconds: Some(r.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.clone()),
                    uid: Some(uid.clone()),
                }),
            }),
            ..Default::default()
        };
        let issued = accounts
            .create_token_request(&r.service_account, &PostParams::default(), &request)
            .await?;
        let Some(token) = issued.status.and_then(|s| s.token) else {
            return Err(kube::Error::Service(
                "the API server's TokenRequest answer has no token".into(),
            ));
        };
        // From the life asked for, on this node's clock (as upstream), so a skewed clock never
        // makes it renew at once.
        let life = Duration::from_secs(r.expiration_seconds.max(0) as u64);
        let refresh = life.mul_f64(0.8).clamp(TOKEN_MIN_AGE, TOKEN_MAX_AGE);
        tracing::debug!(pod = %format!("{namespace}/{pod}"), account = %r.service_account, refresh_in = ?refresh, "issued a service account token");
        Ok(Issued {
            token,
            refresh_at: Instant::now() + refresh,
        })
    }

    /// Every watched object that exists, and every issued token.
    pub fn objects(&self) -> Vec<Object> {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Object> = values.values().cloned().collect();
        out.extend(
            self.tokens.iter().map(|((namespace, _, _, r), t)| {
                crate::objects::token(namespace, &r.name, &t.token)
            }),
        );
        out
    }
}

/// Watches one object until `stop`, keeping its validated value in `values`.
async fn watch_one<K>(
    api: Api<K>,
    key: Key,
    validate: fn(K) -> Result<Object, Vec<String>>,
    values: Arc<Mutex<BTreeMap<Key, Object>>>,
    changed: Arc<Notify>,
    stop: CancellationToken,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let (kind, namespace, name) = key.clone();
    let mut stream = watch_object(api, &name)
        .backoff(super::watch_backoff::watch_backoff())
        .boxed();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            next = stream.next() => next,
        };
        let value = match next {
            None => return,
            Some(Err(e)) => {
                tracing::debug!(%kind, object = %format!("{namespace}/{name}"), error = %crate::types::error_chain(&e), "the watch of an object pods use failed; retrying");
                continue;
            }
            Some(Ok(None)) => None,
            Some(Ok(Some(object))) => match validate(object) {
                Ok(o) => Some(o),
                Err(problems) => {
                    tracing::warn!(%kind, object = %format!("{namespace}/{name}"), problems = %problems.join("; "), "an object pods use is not valid; treating it as missing");
                    None
                }
            },
        };
        let mut all = values.lock().unwrap_or_else(|e| e.into_inner());
        let before = all.get(&key).cloned();
        if before == value {
            continue;
        }
        match value {
            Some(v) => all.insert(key.clone(), v),
            None => all.remove(&key),
        };
        drop(all);
        changed.notify_one();
    }
}
