//! The last change of a sync: the dead containers and sandboxes the plan removes, and their
//! logs with them.

use k8s_openapi::api::core::v1::Pod;

use super::{Error, Syncer, actions, convert, ignore_not_found};
use crate::runtime::PodRuntime;
use crate::types::{PodUid, is_path_part};

impl Syncer {
    /// Removes the containers and sandboxes the plan collects.
    pub(super) async fn collect_garbage(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        plan: &actions::Plan,
    ) -> Result<(), Error> {
        for id in &plan.remove_containers {
            self.remove_container(pod, rt, id).await?;
        }
        for id in &plan.remove_sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(id).await)?;
        }
        Ok(())
    }

    /// Removes one container and its logs.
    pub(super) async fn remove_container(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        id: &str,
    ) -> Result<(), Error> {
        ignore_not_found(self.runtime.remove_container(id).await)?;
        let mut books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(book) = books.get_mut(&PodUid::of(pod)) {
            book.resized.remove(id);
        }
        drop(books);
        // Its logs go with it, as upstream: the log file, its rotated files and its
        // /var/log/containers link; only under names that stay inside the log directories.
        let named = |c: &&crate::runtime::Container| {
            c.id == id && is_path_part(&c.name) && is_path_part(&c.id)
        };
        if let Some(c) = rt.containers.iter().find(named) {
            let link = convert::container_log_link(&self.ctx, pod, &c.name, id);
            let _ = std::fs::remove_file(link);
            let log = convert::pod_log_dir(&self.ctx, pod)
                .join(convert::container_log_path(&c.name, c.attempt));
            crate::log_rotation::remove_logs(&log);
        }
        Ok(())
    }
}
