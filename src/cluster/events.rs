//! The event sink: every event the recorder keeps goes to the API server, created once and then
//! patched with its new count and last time when it repeats (upstream's correlation), paced by
//! a client of its own (`--event-qps`, `--event-burst`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Event as ApiEvent;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::events::Recorder;

/// How soon events that could not be sent are tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How long the sink sleeps when everything was sent and nothing new comes.
const IDLE: Duration = Duration::from_secs(3600);

/// Runs until `cancel`.
pub async fn run(
    client: kube::Client,
    recorder: Recorder,
    node: String,
    cancel: CancellationToken,
) {
    recorder.attach_sink();
    let mut recorded = recorder.subscribe();
    loop {
        let mut failed = false;
        // Each event the API server does not have at its latest count.
        let unsent: Vec<_> = recorder
            .list(None)
            .into_iter()
            .filter(|e| e.sent < e.count)
            .collect();
        for recorded in &unsent {
            let event = &recorded.to_api(&node);
            let (namespace, name) = recorded.key();
            let count = event.count.unwrap_or(1);
            let api: Api<ApiEvent> = Api::namespaced(client.clone(), &namespace);
            let result = if recorded.sent > 0 {
                let patch = serde_json::json!({
                    "count": count,
                    "lastTimestamp": event.last_timestamp,
                    "message": event.message,
                });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    // Expired on the API server (events live an hour): sent again whole.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        api.create(&PostParams::default(), event).await.map(|_| ())
                    }
                    other => other.map(|_| ()),
                }
            } else {
                match api.create(&PostParams::default(), event).await {
                    // Sent by an earlier run of this agent: bring its count up to date.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        let patch = serde_json::json!({"count": count, "lastTimestamp": event.last_timestamp});
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                            .map(|_| ())
                    }
                    other => other.map(|_| ()),
                }
            };
            let count = u32::try_from(count).unwrap_or(0);
            match result {
                Ok(()) => recorder.sent(recorded, count),
                // The namespace is gone, or the event is refused: it is not tried again.
                Err(kube::Error::Api(e)) if matches!(e.code, 403 | 404 | 422) => {
                    tracing::debug!(event = %name, reason = %e.message, "the API server refused an event");
                    crate::metrics::get().event_dropped("refused");
                    recorder.sent(recorded, count);
                }
                Err(e) => {
                    failed = true;
                    tracing::debug!(event = %name, error = %crate::types::error_chain(&e), "cannot send an event; trying again")
                }
            }
        }
        let retry = if failed { RETRY } else { IDLE };
        tokio::select! {
            _ = cancel.cancelled() => return,
            Ok(()) = recorded.changed() => {}
            _ = tokio::time::sleep(retry) => {}
        }
    }
}
