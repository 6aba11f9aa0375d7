//! The API server client: a kube-rs client from `--kubeconfig`, its requests paced by a token
//! bucket of `--kube-api-qps` per second with bursts of `--kube-api-burst`, as client-go paces
//! the kubelet's. The agent's clients share one connection stack (TLS, credentials, connection
//! pool) and differ only in their pacing.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kubeconfig {path}")]
    Read {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
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
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Read {
        path: shown.clone(),
        source,
    })?;
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

/// The longest a request waits for a token, whatever the pacing says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// A token bucket: `burst` tokens at most, refilled at `qps` per second.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            qps,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else if self.qps <= 0.0 {
            Err(Duration::from_secs(1))
        } else {
            let wait = (1.0 - self.tokens) / self.qps;
            Err(Duration::try_from_secs_f64(wait).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
        }
    }
}

/// Paces the requests of the service it wraps.
#[derive(Clone, Debug)]
struct PaceLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl PaceLayer {
    fn new(qps: f64, burst: u32) -> PaceLayer {
        PaceLayer {
            bucket: Arc::new(Mutex::new(Bucket::new(qps, burst))),
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
    bucket: Arc<Mutex<Bucket>>,
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
                .take(Instant::now());
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

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_then_paces_at_qps() {
        let mut b = Bucket::new(2.0, 3);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(b.take(now), Ok(()));
        }
        assert_eq!(b.take(now), Err(Duration::from_millis(500)));
        assert_eq!(b.take(now + Duration::from_millis(500)), Ok(()));
        assert!(b.take(now + Duration::from_millis(600)).is_err());
        // A long pause refills no more than the burst.
        let later = now + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
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
