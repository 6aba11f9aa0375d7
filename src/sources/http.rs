//! The manifest URL source: GET --manifest-url every --http-check-frequency with the configured
//! headers; the body is a Pod or a PodList (JSON or YAML). Failures change nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

use super::SourceSnapshot;
use super::{MAX_MANIFEST_BYTES, Manifest, manifest};
use crate::pod::StaticOrigin;
use crate::types::Source;

/// Time allowed for one GET, body included (upstream: 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Identical failures are logged this many times, then kept quiet until something changes.
const LOG_REPEATS: u32 = 3;

/// Settings of the URL source (no `Debug`: the headers may be credentials).
#[derive(Clone)]
pub struct Config {
    pub url: String,
    pub headers: BTreeMap<String, Vec<String>>,
    pub check_frequency: Duration,
    pub node_name: String,
    pub api_references: super::ApiReferences,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A client for http and https URLs; https trusts the system's certificate store.
fn client() -> HttpsClient {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_native_roots() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "cannot load the system trust store; https manifest URLs will fail");
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                // The ring provider supports the default protocol versions by construction.
                .expect("ring supports TLS 1.2 and 1.3")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// GETs the URL: the body of a 200 answer, or why there is none.
async fn fetch(client: &HttpsClient, config: &Config) -> Result<Bytes, String> {
    let mut request = hyper::Request::get(config.url.as_str());
    for (name, values) in &config.headers {
        for value in values {
            request = request.header(name.as_str(), value.as_str());
        }
    }
    let request = request
        .body(Empty::new())
        .map_err(|e| format!("invalid request: {e}"))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg = format!("{msg}: {s}");
                source = s.source();
            }
            msg
        })?;
        let status = response.status();
        if status != hyper::StatusCode::OK {
            return Err(format!("status {status}"));
        }
        let limited = Limited::new(response.into_body(), MAX_MANIFEST_BYTES as usize);
        limited
            .collect()
            .await
            .map(|body| body.to_bytes())
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!(
                        "body is larger than the {MAX_MANIFEST_BYTES} bytes a manifest may have"
                    )
                } else {
                    format!("reading the body: {e}")
                }
            })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no complete answer within {}s", REQUEST_TIMEOUT.as_secs()))?
}

/// Logs a failure, quietly after it repeated a few times.
#[derive(Default)]
struct FailureLog {
    last: Option<String>,
    repeats: u32,
}

impl FailureLog {
    fn failed(&mut self, url: &str, reason: String) {
        let url = crate::types::redacted_url(url);
        if self.last.as_ref() == Some(&reason) {
            self.repeats += 1;
        } else {
            self.last = Some(reason.clone());
            self.repeats = 1;
        }
        if self.repeats <= LOG_REPEATS {
            let quiet = if self.repeats == LOG_REPEATS {
                " (further repeats are not logged)"
            } else {
                ""
            };
            tracing::warn!(%url, %reason, "manifest URL gave no usable answer; its pods are left as they are{quiet}");
        }
    }

    fn succeeded(&mut self, url: &str) {
        if self.last.take().is_some() {
            let url = crate::types::redacted_url(url);
            tracing::info!(%url, "manifest URL answers again");
        }
        self.repeats = 0;
    }
}

/// Polls the URL and sends a snapshot whenever the body changes, until `cancel`.
pub async fn run(config: Config, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
    let client = client();
    let mut last_body: Option<Bytes> = None;
    let mut failures = FailureLog::default();
    let mut ticker = tokio::time::interval(config.check_frequency);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let Some(snapshot) = poll(&client, &config, &mut last_body, &mut failures).await else {
            continue;
        };
        if tx.send(snapshot).await.is_err() {
            return;
        }
    }
}

/// One poll: a new snapshot when the body changed and decodes, else `None`.
async fn poll(
    client: &HttpsClient,
    config: &Config,
    last_body: &mut Option<Bytes>,
    failures: &mut FailureLog,
) -> Option<SourceSnapshot> {
    let body = match fetch(client, config).await {
        Ok(body) => body,
        Err(reason) => {
            failures.failed(&config.url, reason);
            return None;
        }
    };
    if last_body.as_ref() == Some(&body) {
        failures.succeeded(&config.url);
        return None;
    }
    let seen = crate::types::now().to_string();
    let found = if body.iter().all(|b| b.is_ascii_whitespace()) {
        Manifest::default()
    } else {
        match manifest(
            &body,
            &config.node_name,
            (StaticOrigin::Url(&config.url), config.api_references),
            &seen,
        ) {
            Ok(found) => found,
            Err(problems) => {
                failures.failed(
                    &config.url,
                    format!("invalid manifest: {}", problems.join("; ")),
                );
                return None;
            }
        }
    };
    failures.succeeded(&config.url);
    *last_body = Some(body);
    Some(SourceSnapshot {
        source: Source::Http,
        pods: found.pods,
        objects: found.objects,
    })
}

/// Fetches the URL once, for run-once mode: the first usable snapshot, retrying until `deadline`.
pub async fn first_snapshot(
    config: &Config,
    deadline: tokio::time::Instant,
) -> Result<SourceSnapshot, String> {
    let client = client();
    let mut failures = FailureLog::default();
    loop {
        if let Some(snapshot) = poll(&client, config, &mut None, &mut failures).await {
            return Ok(snapshot);
        }
        if tokio::time::Instant::now() + config.check_frequency.min(Duration::from_secs(1))
            > deadline
        {
            return Err(failures.last.unwrap_or_else(|| "no answer".into()));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
