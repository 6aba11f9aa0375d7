//! The cluster's Services, for the containers' service links: one watch of every Service (the
//! Node authorizer lets a node read them all), kept in the service links' store. Until the first
//! list completes the store stays empty-handed, so API pods wait rather than start without
//! `KUBERNETES_SERVICE_HOST`.

use std::collections::BTreeMap;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio_util::sync::CancellationToken;

use crate::service_links::{self, Store};

type Key = (String, String);

fn key(s: &Service) -> Key {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

/// Watches the Services until cancelled, publishing them to `store` after the first list and
/// after every change.
pub async fn run(client: kube::Client, store: Store, cancel: CancellationToken) {
    let api: Api<Service> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(super::watch_backoff::watch_backoff())
        .boxed();
    let mut current: BTreeMap<Key, service_links::Service> = BTreeMap::new();
    let mut relisting: BTreeMap<Key, service_links::Service> = BTreeMap::new();
    let mut listed = false;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            event = stream.next() => match event {
                Some(event) => event,
                None => return,
            },
        };
        let changed = match event {
            Ok(watcher::Event::Init) => {
                relisting.clear();
                false
            }
            Ok(watcher::Event::InitApply(s)) => {
                if let Some(link) = service_links::Service::from_api(&s) {
                    relisting.insert(key(&s), link);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                current = std::mem::take(&mut relisting);
                listed = true;
                true
            }
            Ok(watcher::Event::Apply(s)) => {
                match service_links::Service::from_api(&s) {
                    Some(link) => current.insert(key(&s), link),
                    None => current.remove(&key(&s)),
                };
                true
            }
            Ok(watcher::Event::Delete(s)) => current.remove(&key(&s)).is_some(),
            Err(e) => {
                tracing::warn!(error = %crate::types::error_chain(&e), "the watch of Services failed; retrying");
                false
            }
        };
        if changed && listed {
            store.set(current.values().cloned().collect());
        }
    }
}
