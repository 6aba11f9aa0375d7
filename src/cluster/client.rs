//! The API server client: a kube-rs client from `--kubeconfig`, its requests paced by a token
//! bucket of `--kube-api-qps` per second with bursts of `--kube-api-burst`, as client-go paces
//! the kubelet's. The agent's clients share one connection stack (TLS, credentials, connection
//! pool) and differ only in their pacing.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::backoff::TokenBucket;

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kubeconfig {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the kubeconfig {path} is not a kubeconfig")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("the kubeconfig {path} does not give a usable cluster and user")]
    Config {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build an API client from the kubeconfig {path}")]
    Build {
        path: String,
        #[source]
        source: kube::Error,
    },
}

/// A client for the API server the kubeconfig names, not paced (as upstream's heartbeat
/// client); [`paced`] makes paced clients over the same connections.
pub async fn from_kubeconfig(path: &Path) -> Result<Client, Error> {
    let shown = path.display().to_string();
    let kubeconfig = read(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Config {
            path: shown.clone(),
            source,
        })?;
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|source| Error::Build {
        path: shown,
        source,
    })?;
    Ok(builder.build())
}

/// The kubeconfig at `path`, its relative file names made relative to its directory, as
/// client-go resolves them. It is one document, as client-go reads it, parsed by the YAML
/// reader the manifests use.
fn read(path: &Path) -> Result<Kubeconfig, Error> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: shown(),
        source,
    })?;
    let mut config: Kubeconfig = if text.trim().is_empty() {
        Kubeconfig::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|source| Error::Parse {
            path: shown(),
            source,
        })?
    };
    if let Some(dir) = path.parent() {
        resolve_paths(&mut config, dir);
    }
    Ok(config)
}

/// Makes the file names in `config` that are relative absolute under `dir`: the CA, the
/// client certificate and key, the token file, and an exec command that names a path (a bare
/// command is looked up in PATH).
fn resolve_paths(config: &mut Kubeconfig, dir: &Path) {
    let resolve = |name: &mut Option<String>| {
        if let Some(relative) = name.as_deref().filter(|n| Path::new(n).is_relative())
            && let Some(absolute) = dir.join(relative).to_str()
        {
            *name = Some(absolute.to_owned());
        }
    };
    for cluster in config
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        resolve(&mut cluster.certificate_authority);
    }
    for user in config
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        resolve(&mut user.client_certificate);
        resolve(&mut user.client_key);
        resolve(&mut user.token_file);
        if let Some(exec) = user.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains('/'))
        {
            resolve(&mut exec.command);
        }
    }
}

/// A client whose requests go through `client`'s connections, paced at `qps` with bursts of
/// `burst`.
pub fn paced(client: &Client, qps: f64, burst: u32) -> Client {
    let shared = client.clone();
    let send = tower::service_fn(move |request| {
        let shared = shared.clone();
        async move { shared.send(request).await }
    });
    Client::new(
        PaceLayer::new(qps, burst).layer(send),
        client.default_namespace(),
    )
}

/// Paces the requests of the service it wraps.
#[derive(Clone, Debug)]
struct PaceLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl PaceLayer {
    fn new(qps: f64, burst: u32) -> PaceLayer {
        PaceLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(
                qps,
                burst,
                Instant::now().into_std(),
            ))),
        }
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = Paced<S>;

    fn layer(&self, inner: S) -> Paced<S> {
        Paced {
            inner,
            bucket: self.bucket.clone(),
            wait: None,
            permit: false,
        }
    }
}

/// A service whose readiness waits for a token. The client's buffer drives it from one task,
/// so a token is taken once per request.
struct Paced<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    wait: Option<Pin<Box<Sleep>>>,
    permit: bool,
}

impl<S, R> Service<R> for Paced<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permit {
            if let Some(wait) = self.wait.as_mut() {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(Instant::now().into_std());
            match taken {
                Ok(()) => self.permit = true,
                Err(delay) => self.wait = Some(Box::pin(tokio::time::sleep(delay))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.permit = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_kubeconfig_names_files_relative_to_its_directory() {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let path = dir.path().join("kubelet.conf");
        let text = r#"apiVersion: v1
kind: Config
current-context: node
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.crt
users:
- name: node
  user:
    client-certificate: /etc/kubernetes/pki/node.crt
    client-key: node.key
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: helper
contexts:
- name: node
  context:
    cluster: local
    user: node
"#;
        std::fs::write(&path, text).expect("the kubeconfig written");
        let config = read(&path).expect("a kubeconfig");
        let cluster = config.clusters[0].cluster.as_ref().expect("a cluster");
        let ca = dir.path().join("pki/ca.crt");
        assert_eq!(cluster.certificate_authority.as_deref(), ca.to_str());
        let user = config.auth_infos[0].auth_info.as_ref().expect("a user");
        let key = dir.path().join("node.key");
        assert_eq!(user.client_key.as_deref(), key.to_str());
        assert_eq!(
            user.client_certificate.as_deref(),
            Some("/etc/kubernetes/pki/node.crt")
        );
        let exec = user.exec.as_ref().expect("an exec plugin");
        assert_eq!(exec.command.as_deref(), Some("helper"));
        assert_eq!(config.current_context.as_deref(), Some("node"));

        std::fs::write(&path, "clusters: {").expect("the kubeconfig written");
        let error = read(&path).expect_err("not YAML");
        assert!(error.to_string().contains("kubelet.conf"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn paced_requests_wait_for_their_token() {
        let service =
            tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) });
        let mut paced = PaceLayer::new(10.0, 1).layer(service);
        let start = Instant::now();
        for n in 0..4 {
            let ready = std::future::poll_fn(|cx| paced.poll_ready(cx)).await;
            assert!(ready.is_ok());
            assert_eq!(paced.call(n).await, Ok(n));
        }
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }
}
