//! The volume manager: sets up and tears down pods' volumes, and keeps what upstream's keeps
//! of them: the volumes each pod wants and those on the host (its desired and actual states
//! of the world), the latter taken back from the disk at start, with the metrics of the
//! operations between the two under upstream's names and labels.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::{
    CONFIG_MAP, DOWNWARD_API, Inputs, MADE, Mounted, PROJECTED, Result, SECRET, make_pod_dir,
    mount, plugin, plugin_dir, pod_dir, remove_pod_dir,
};
use crate::pod::spec;

/// The plugins whose volumes are set up again at each sync of their pod (upstream's
/// `RequiresRemount`): the API-data volumes, which follow their sources.
const REMOUNTED: [&str; 4] = [CONFIG_MAP, SECRET, DOWNWARD_API, PROJECTED];

/// The volumes of the pods under one root dir.
pub struct Manager {
    root_dir: PathBuf,
    pods: Mutex<HashMap<String, PodVolumes>>,
}

/// What the manager knows of one pod's volumes.
#[derive(Default)]
struct PodVolumes {
    /// When the pod first wanted its volumes: a volume's first mount is timed from here.
    since: Option<Instant>,
    /// The plugin of each volume the pod wants.
    wanted: Vec<&'static str>,
    /// The volumes checked to need no attaching (each is, once), by name.
    verified: HashSet<String>,
    /// The volumes on the host, by name, with their plugin.
    mounted: HashMap<String, &'static str>,
    /// Volumes found on the disk at start under plugins nodelet does not make: they go with
    /// the pod's directory.
    unknown: usize,
}

impl Manager {
    /// The manager of the pods under `root_dir`, with the volumes found there (left by an
    /// earlier run) taken back as on the host.
    pub fn new(root_dir: &Path) -> Manager {
        let pods = reconstruct(root_dir);
        let (found, failed) = pods.values().fold((0, 0), |(found, failed), p| {
            (found + p.mounted.len() + p.unknown, failed + p.unknown)
        });
        if found > 0 {
            tracing::info!(
                volumes = found,
                unknown = failed,
                "found the volumes of pods from an earlier run"
            );
        }
        crate::metrics::get().volumes_reconstructed(found, failed);
        let manager = Manager {
            root_dir: root_dir.to_path_buf(),
            pods: Mutex::new(pods),
        };
        manager.publish(&manager.lock());
        manager
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodVolumes>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every volume of the pod available on the host and returns each by name; stops at
    /// the first that fails. Runs on every sync of the pod.
    pub fn setup(&self, pod: &Pod, inputs: &Inputs<'_>) -> Result<HashMap<String, Mounted>> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let dir = pod_dir(&self.root_dir, uid);
        make_pod_dir(&dir)?;
        let volumes: Vec<&Volume> = spec(pod).volumes.iter().flatten().collect();
        // The gauge is set again only when what the pod wants or has changed, not at every
        // sync.
        let mut changed = {
            let mut pods = self.lock();
            let entry = pods.entry(uid.to_string()).or_default();
            entry.since.get_or_insert_with(Instant::now);
            let wanted: Vec<&'static str> = volumes.iter().filter_map(|v| plugin(v)).collect();
            let changed = entry.wanted != wanted;
            entry.wanted = wanted;
            changed
        };
        let mut mounted = HashMap::new();
        let result = volumes.iter().try_for_each(|v| {
            let started = Instant::now();
            let made = mount(pod, v, &dir, inputs);
            if let Some(plugin) = plugin(v) {
                let took = started.elapsed();
                let mut pods = self.lock();
                let entry = pods.entry(uid.to_string()).or_default();
                changed |= entry.record(
                    &v.name,
                    plugin,
                    took,
                    made.as_ref().map(|m| m.group_applied),
                );
            }
            mounted.insert(v.name.clone(), made?.mounted);
            Ok(())
        });
        if changed {
            self.publish(&self.lock());
        }
        result.map(|()| mounted)
    }

    /// Removes the pod's directory and every volume in it (unmounting those on tmpfs first),
    /// and forgets the pod's volumes. Its mounted volumes stay known when that fails.
    pub fn teardown(&self, uid: &str) -> Result<()> {
        let started = Instant::now();
        let result = remove_pod_dir(&self.root_dir, uid);
        let took = started.elapsed();
        let metrics = crate::metrics::get();
        let mut pods = self.lock();
        if let Some(mut entry) = pods.remove(uid) {
            for plugin in entry.mounted.values() {
                metrics.storage_operation(plugin, "volume_unmount", took, result.is_err());
            }
            if entry.unknown > 0 {
                let failed = if result.is_err() { entry.unknown } else { 0 };
                metrics.volumes_force_cleaned(entry.unknown, failed);
            }
            if result.is_err() {
                let left = PodVolumes {
                    mounted: std::mem::take(&mut entry.mounted),
                    unknown: entry.unknown,
                    ..PodVolumes::default()
                };
                pods.insert(uid.to_string(), left);
            }
        }
        self.publish(&pods);
        result
    }

    /// Sets upstream's gauge of the volumes wanted and on the host, by plugin.
    fn publish(&self, pods: &HashMap<String, PodVolumes>) {
        let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for p in pods.values() {
            for plugin in &p.wanted {
                *counts
                    .entry((plugin, "desired_state_of_world"))
                    .or_default() += 1;
            }
            for plugin in p.mounted.values() {
                *counts.entry((plugin, "actual_state_of_world")).or_default() += 1;
            }
        }
        crate::metrics::get().set_volumes(&counts);
    }
}

impl PodVolumes {
    /// Records the setup of volume `name` of `plugin`, which took `took` and applied the pod's
    /// fsGroup (`Ok(true)`) or not, or failed, as upstream's operation executor records it: a
    /// volume is checked to need no attaching once, then mounted; once mounted, only the
    /// volumes that follow their sources are mounted again. Says whether it is newly mounted.
    fn record(
        &mut self,
        name: &str,
        plugin: &'static str,
        took: Duration,
        outcome: std::result::Result<bool, &super::Error>,
    ) -> bool {
        let metrics = crate::metrics::get();
        let first = !self.mounted.contains_key(name);
        if first && self.verified.insert(name.to_string()) {
            metrics.storage_operation(
                plugin,
                "verify_controller_attached_volume",
                Duration::ZERO,
                false,
            );
        }
        if !first && !REMOUNTED.contains(&plugin) {
            return false;
        }
        metrics.storage_operation(plugin, "volume_mount", took, outcome.is_err());
        let Ok(group_applied) = outcome else {
            return false;
        };
        if group_applied {
            metrics.storage_operation(plugin, "volume_apply_access_control", took, false);
        }
        if first {
            if let Some(since) = self.since {
                metrics.volume_mounted(plugin, since.elapsed());
            }
            self.mounted.insert(name.to_string(), plugin);
        }
        first
    }
}

/// The volumes under `<root_dir>/pods/<uid>/volumes/<plugin dir>/<name>`, by pod: those of
/// plugins nodelet makes as mounted, the others counted as unknown.
fn reconstruct(root_dir: &Path) -> HashMap<String, PodVolumes> {
    let entries = |dir: &Path| {
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        entries.filter_map(|e| e.file_name().into_string().ok())
    };
    let mut pods = HashMap::new();
    for uid in entries(&root_dir.join("pods")) {
        let volumes = pod_dir(root_dir, &uid).join("volumes");
        let mut found = PodVolumes::default();
        for dir in entries(&volumes) {
            let known = MADE.iter().find(|p| plugin_dir(p) == dir);
            for name in entries(&volumes.join(&dir)) {
                match known {
                    Some(plugin) => {
                        found.mounted.insert(name, plugin);
                    }
                    None => found.unknown += 1,
                }
            }
        }
        if !found.mounted.is_empty() || found.unknown > 0 {
            pods.insert(uid, found);
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_left_on_the_disk_are_taken_back_by_plugin() {
        let tmp = tempfile::tempdir().unwrap();
        let volumes = tmp.path().join("pods/u1/volumes");
        for dir in [
            "kubernetes.io~empty-dir/scratch",
            "kubernetes.io~secret/token",
            "kubernetes.io~csi/data",
        ] {
            std::fs::create_dir_all(volumes.join(dir)).unwrap();
        }
        std::fs::create_dir_all(tmp.path().join("pods/u2")).unwrap();
        let pods = reconstruct(tmp.path());
        assert_eq!(pods.len(), 1, "a pod without volumes is not kept");
        let u1 = &pods["u1"];
        let mounted: BTreeMap<_, _> = u1.mounted.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            mounted,
            BTreeMap::from([
                ("scratch", "kubernetes.io/empty-dir"),
                ("token", "kubernetes.io/secret")
            ])
        );
        assert_eq!(u1.unknown, 1);
    }

    #[test]
    fn a_volume_is_verified_once_and_mounted_again_only_if_it_follows_its_source() {
        let mut pod = PodVolumes::default();
        pod.record(
            "scratch",
            "kubernetes.io/empty-dir",
            Duration::ZERO,
            Ok(false),
        );
        pod.record(
            "scratch",
            "kubernetes.io/empty-dir",
            Duration::ZERO,
            Ok(false),
        );
        pod.record("config", CONFIG_MAP, Duration::ZERO, Ok(false));
        assert_eq!(pod.verified.len(), 2);
        assert_eq!(pod.mounted.len(), 2);
        let err = super::super::Error::Volume {
            volume: "x".into(),
            message: "no".into(),
        };
        pod.record("broken", SECRET, Duration::ZERO, Err(&err));
        pod.record("broken", SECRET, Duration::ZERO, Err(&err));
        assert!(pod.verified.contains("broken"));
        assert!(!pod.mounted.contains_key("broken"));
    }
}
