//! The first step of a sync: the pod's state in the runtime, as the PLEG last read it or as
//! listed now, and what its probes say.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::{Syncer, actions, watched};
use crate::events::Target;
use crate::pod::spec;
use crate::probe;
use crate::runtime::{self, ContainerState, PodRuntime};
use crate::types::PodUid;

/// How long a sync waits for a relist that shows its pod as it is (two relist periods) before
/// it lists the pod itself: past that, the PLEG is late, and the pod's sync does not wait on it.
const RELIST_WAIT: Duration = Duration::from_secs(2);

impl Syncer {
    /// The pod's runtime state for a sync, with the resources of containers resized in place.
    pub(super) async fn current(&self, pod: &Pod) -> runtime::Result<PodRuntime> {
        let uid = PodUid::of(pod);
        // A sync right after one that changed the pod waits for the next relist rather than
        // listing the runtime itself (as upstream): during a burst of starts, the pods' own
        // listings were a third of the agent's runtime calls. The wait delays only what the
        // sync reads (the status of what the last one started), never a start of its own.
        let listed = self.cache.newer(&uid, RELIST_WAIT).await;
        let mut rt = self.details(listed, pod).await?;
        let books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(book) = books.get(&uid) {
            for c in &mut rt.containers {
                if let Some(digest) = book.resized.get(&c.id) {
                    c.resources.clone_from(digest);
                }
            }
        }
        drop(books);
        Ok(rt)
    }

    /// The pod's runtime state: the PLEG's latest reading when it is current, else listed.
    pub(super) async fn read(&self, pod: &Pod) -> runtime::Result<PodRuntime> {
        self.details(self.cache.get(&PodUid::of(pod)), pod).await
    }

    /// The pod's runtime state from `listed` (the PLEG's reading) with the containers'
    /// status details, or listed now.
    async fn details(&self, listed: Option<PodRuntime>, pod: &Pod) -> runtime::Result<PodRuntime> {
        let uid = PodUid::of(pod);
        let read = async {
            match listed {
                Some(listed) => self.runtime.with_details(listed).await,
                None => self.runtime.pod_runtime(&uid).await,
            }
        };
        let what = "the reading of its containers";
        let reporting = (&self.events, &self.diagnoses);
        watched(reporting, &Target::pod(pod), what, Duration::ZERO, read).await
    }

    /// What the probes say about the pod's running containers: which failed (with the kill
    /// reason) and which have not passed their startup probe yet.
    pub(super) fn probe_view(&self, pod: &Pod, rt: &PodRuntime) -> actions::ProbeView {
        let results = self.probes.results();
        let mut view = actions::ProbeView::default();
        for c in rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            let Some(want) = crate::pod::all_containers(spec(pod)).find(|w| w.name == c.name)
            else {
                continue;
            };
            if !results.state(&c.id, want).1 {
                view.unstarted.insert(c.id.clone());
            }
            let Some(kind) = results.unhealthy(&c.id) else {
                continue;
            };
            let (which, probe) = match kind {
                probe::Kind::Startup => ("startup", want.startup_probe.as_ref()),
                _ => ("liveness", want.liveness_probe.as_ref()),
            };
            view.unhealthy.insert(
                c.id.clone(),
                actions::Unhealthy {
                    reason: format!(
                        "Container {} failed {which} probe, will be restarted",
                        c.name
                    ),
                    grace: probe.and_then(|p| p.termination_grace_period_seconds),
                },
            );
        }
        view
    }
}
