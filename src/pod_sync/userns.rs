//! User namespaces for `hostUsers: false` pods, as upstream's userns manager: each such pod gets
//! its own range of host IDs (`idsPerPod`, 65536 by default) mapped to 0 in the pod, from the
//! range of the `kubelet` entry of /etc/subuid and /etc/subgid, or from 65536 up to the top of
//! the ID space when there is none. A pod's range is kept in `<root>/pods/<uid>/userns` in
//! upstream's format, read back at start, and freed when the pod's directory goes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::runtime::cri;
use crate::types::PodUid;

/// IDs per pod are counted in units of this many (upstream).
pub const UNIT: u32 = 65536;
/// The per-pod file holding the pod's mappings.
const FILE: &str = "userns";
/// The user whose subordinate IDs the pods' ranges come from.
const USER: &str = "kubelet";

/// One pod's range: host IDs `first..first + length`, seen as `0..length` in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub first: u32,
    pub length: u32,
}

impl Range {
    /// The CRI user namespace of a pod with this range.
    pub fn namespace(self) -> cri::UserNamespace {
        let mapping = vec![self.mapping()];
        cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: mapping.clone(),
            gids: mapping,
        }
    }

    /// The CRI ID mapping of this range.
    pub fn mapping(self) -> cri::IdMapping {
        cri::IdMapping {
            host_id: self.first,
            container_id: 0,
            length: self.length,
        }
    }
}

/// The per-pod file, as upstream writes it.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(rename = "uidMappings")]
    uid_mappings: Vec<StoredMapping>,
    #[serde(rename = "gidMappings")]
    gid_mappings: Vec<StoredMapping>,
}

#[derive(Serialize, Deserialize, PartialEq, Clone, Copy)]
struct StoredMapping {
    #[serde(rename = "hostId")]
    host_id: u32,
    #[serde(rename = "containerId")]
    container_id: u32,
    length: u32,
}

/// Hands out and remembers the pods' ranges.
pub struct Manager {
    root_dir: PathBuf,
    ids_per_pod: u32,
    /// Slot `i` is the range starting at `(offset + i) * ids_per_pod`.
    offset: u32,
    slots: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    by_pod: HashMap<PodUid, u32>,
    taken: HashMap<u32, PodUid>,
    /// A xorshift state for the first slot tried (upstream starts at a random slot).
    seed: u64,
}

/// The first host ID and the length of the node's range: the `kubelet` entries of
/// /etc/subuid and /etc/subgid, which must agree, else `ids_per_pod` up to the top of the ID
/// space.
fn node_range(ids_per_pod: u32) -> Result<(u32, u32), String> {
    let read = |path: &str| match std::fs::read_to_string(path) {
        Ok(text) => Ok(subordinate_range(&text, USER)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{path}: {e}")),
    };
    match (read("/etc/subuid")?, read("/etc/subgid")?) {
        (None, None) => Ok((ids_per_pod, u32::MAX - ids_per_pod + 1)),
        (Some(uids), Some(gids)) if uids == gids => Ok(uids),
        _ => Err(format!(
            "mismatched subuids and subgids for user {USER:?} (/etc/subuid, /etc/subgid)"
        )),
    }
}

/// The first `user:first:count` line of a subordinate ID file for `user`.
fn subordinate_range(text: &str, user: &str) -> Option<(u32, u32)> {
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(':');
        (parts.next()? == user).then_some(())?;
        let first = parts.next()?.parse().ok()?;
        let count = parts.next()?.parse().ok()?;
        Some((first, count))
    })
}

impl Manager {
    /// A manager for pods under `root_dir` with `ids_per_pod` IDs each, that can serve
    /// `max_pods` pods; reads back the ranges of the pods already there.
    pub fn new(root_dir: &Path, ids_per_pod: u32, max_pods: u32) -> Result<Manager, String> {
        let (first, length) = node_range(ids_per_pod)?;
        Self::with_range(root_dir, ids_per_pod, max_pods, (first, length))
    }

    fn with_range(
        root_dir: &Path,
        ids_per_pod: u32,
        max_pods: u32,
        (first, length): (u32, u32),
    ) -> Result<Manager, String> {
        if ids_per_pod == 0 || !ids_per_pod.is_multiple_of(UNIT) {
            return Err(format!(
                "userNamespaces.idsPerPod: {ids_per_pod} is not a multiple of {UNIT}"
            ));
        }
        if !first.is_multiple_of(ids_per_pod) {
            return Err(format!(
                "the {USER} user's first subordinate ID {first} is not a multiple of {ids_per_pod}"
            ));
        }
        if first < ids_per_pod {
            return Err(format!(
                "the {USER} user's first subordinate ID {first} must be at least {ids_per_pod}"
            ));
        }
        if !length.is_multiple_of(ids_per_pod) {
            return Err(format!(
                "the {USER} user's subordinate ID count {length} is not a multiple of {ids_per_pod}"
            ));
        }
        if length / ids_per_pod < max_pods {
            return Err(format!(
                "the {USER} user's {length} subordinate IDs are not enough for {max_pods} pods of {ids_per_pod} IDs"
            ));
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        let manager = Manager {
            root_dir: root_dir.to_path_buf(),
            ids_per_pod,
            offset: first / ids_per_pod,
            slots: length / ids_per_pod,
            state: Mutex::new(State {
                seed,
                ..State::default()
            }),
        };
        let pods = match std::fs::read_dir(root_dir.join("pods")) {
            Ok(entries) => entries.flatten().collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("{}: {e}", root_dir.join("pods").display())),
        };
        for entry in pods {
            let uid = PodUid(entry.file_name().to_string_lossy().into_owned());
            let path = entry.path().join(FILE);
            let text = match std::fs::read(&path) {
                Ok(text) if !text.is_empty() => text,
                _ => continue,
            };
            manager
                .record(&uid, &text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(manager)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn file(&self, uid: &PodUid) -> PathBuf {
        crate::volumes::pod_dir(&self.root_dir, &uid.0).join(FILE)
    }

    /// Takes the range a pod's file names, checking it as upstream does.
    fn record(&self, uid: &PodUid, text: &[u8]) -> Result<Range, String> {
        let stored: Stored = serde_json::from_slice(text)
            .map_err(|e| format!("invalid user namespace mappings file: {e}"))?;
        let [uids] = stored.uid_mappings.as_slice() else {
            return Err("invalid user namespace configuration: exactly one mapping allowed".into());
        };
        if stored.gid_mappings.as_slice() != [*uids] {
            return Err(
                "invalid user namespace configuration: GID and UID mappings should be identical"
                    .into(),
            );
        }
        if uids.container_id != 0 {
            return Err("invalid user namespace configuration: UID 0 must be mapped".into());
        }
        if uids.length != self.ids_per_pod {
            return Err(format!("wrong user namespace length {}", uids.length));
        }
        if !uids.host_id.is_multiple_of(self.ids_per_pod) {
            return Err(format!(
                "wrong user namespace offset specified {}",
                uids.host_id
            ));
        }
        let slot = (uids.host_id / self.ids_per_pod)
            .checked_sub(self.offset)
            .filter(|s| *s < self.slots)
            .ok_or_else(|| format!("id {} is out of range", uids.host_id))?;
        let mut state = self.state();
        match (state.by_pod.get(uid), state.taken.get(&slot)) {
            (Some(have), _) if *have != slot => {
                return Err(format!(
                    "different user namespace range already used by pod {uid}"
                ));
            }
            (_, Some(owner)) if owner != uid => {
                return Err(format!("range picked for pod {uid} already taken"));
            }
            _ => {}
        }
        state.by_pod.insert(uid.clone(), slot);
        state.taken.insert(slot, uid.clone());
        Ok(self.range(slot))
    }

    fn range(&self, slot: u32) -> Range {
        Range {
            first: (self.offset + slot) * self.ids_per_pod,
            length: self.ids_per_pod,
        }
    }

    /// The pod's range: the one it holds, else the one its file names, else a free one,
    /// written to its file first.
    pub fn range_of(&self, uid: &PodUid) -> Result<Range, String> {
        if let Some(slot) = self.state().by_pod.get(uid) {
            return Ok(self.range(*slot));
        }
        let path = self.file(uid);
        match std::fs::read(&path) {
            Ok(text) if !text.is_empty() => {
                return self
                    .record(uid, &text)
                    .map_err(|e| format!("{}: {e}", path.display()));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        let slot = self.allocate(uid)?;
        let range = self.range(slot);
        let mapping = StoredMapping {
            host_id: range.first,
            container_id: 0,
            length: range.length,
        };
        let stored = Stored {
            uid_mappings: vec![mapping],
            gid_mappings: vec![mapping],
        };
        let written = serde_json::to_vec(&stored)
            .map_err(|e| e.to_string())
            .and_then(|bytes| write_durably(&path, &bytes).map_err(|e| e.to_string()));
        if let Err(e) = written {
            self.forget(uid);
            return Err(format!("{}: {e}", path.display()));
        }
        Ok(range)
    }

    /// A free slot for `uid`, from a random start as upstream.
    fn allocate(&self, uid: &PodUid) -> Result<u32, String> {
        let mut state = self.state();
        if let Some(slot) = state.by_pod.get(uid) {
            return Ok(*slot);
        }
        let mut x = state.seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.seed = x;
        let start = (x % u64::from(self.slots)) as u32;
        let slot = (0..self.slots)
            .map(|i| (start + i) % self.slots)
            .find(|s| !state.taken.contains_key(s))
            .ok_or("could not find an empty slot to allocate a user namespace")?;
        state.by_pod.insert(uid.clone(), slot);
        state.taken.insert(slot, uid.clone());
        Ok(slot)
    }

    fn forget(&self, uid: &PodUid) {
        let mut state = self.state();
        if let Some(slot) = state.by_pod.remove(uid) {
            state.taken.remove(&slot);
        }
    }

    /// Frees the pod's range (its directory, with the file, is going).
    pub fn release(&self, uid: &PodUid) {
        let _ = std::fs::remove_file(self.file(uid));
        self.forget(uid);
    }

    /// Frees the ranges of pods whose directory is gone.
    pub fn release_orphans(&self) {
        let pods: Vec<PodUid> = self.state().by_pod.keys().cloned().collect();
        for uid in pods {
            if !crate::volumes::pod_dir(&self.root_dir, &uid.0).exists() {
                self.forget(&uid);
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, synced with its directory.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(dir: &Path, range: (u32, u32)) -> Manager {
        Manager::with_range(dir, UNIT, 110, range).expect("manager")
    }

    #[test]
    fn pods_get_distinct_ranges_that_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = manager(dir.path(), (UNIT, u32::MAX - UNIT + 1));
        let (a, b) = (PodUid("a".into()), PodUid("b".into()));
        let ra = m.range_of(&a).expect("a");
        let rb = m.range_of(&b).expect("b");
        assert_ne!(ra, rb);
        for r in [ra, rb] {
            assert_eq!(r.length, UNIT);
            assert!(r.first >= UNIT && r.first.is_multiple_of(UNIT), "{r:?}");
        }
        assert_eq!(m.range_of(&a).expect("a again"), ra);
        let text = std::fs::read_to_string(dir.path().join("pods/a/userns")).expect("file");
        assert_eq!(
            text,
            format!(
                r#"{{"uidMappings":[{{"hostId":{0},"containerId":0,"length":65536}}],"gidMappings":[{{"hostId":{0},"containerId":0,"length":65536}}]}}"#,
                ra.first
            )
        );
        let again = manager(dir.path(), (UNIT, u32::MAX - UNIT + 1));
        assert_eq!(again.range_of(&a).expect("a after restart"), ra);
        assert_eq!(again.range_of(&b).expect("b after restart"), rb);
        again.release(&a);
        assert!(!dir.path().join("pods/a/userns").exists());
    }

    #[test]
    fn a_full_range_refuses_and_a_freed_slot_is_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Manager::with_range(dir.path(), UNIT, 2, (UNIT, 2 * UNIT)).expect("manager");
        let pods: Vec<PodUid> = ["a", "b", "c"].map(|u| PodUid(u.into())).into();
        m.range_of(&pods[0]).expect("a");
        m.range_of(&pods[1]).expect("b");
        let err = m.range_of(&pods[2]).expect_err("no slot left");
        assert!(err.contains("empty slot"), "{err}");
        m.release(&pods[0]);
        assert!(m.range_of(&pods[2]).is_ok());
    }

    #[test]
    fn bad_settings_and_files_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Manager::with_range(dir.path(), 1000, 1, (UNIT, UNIT)).err();
        assert!(err.is_some_and(|e| e.contains("multiple of 65536")));
        let err = Manager::with_range(dir.path(), UNIT, 1, (0, 4 * UNIT)).err();
        assert!(err.is_some_and(|e| e.contains("at least 65536")));
        let err = Manager::with_range(dir.path(), UNIT, 5, (UNIT, 4 * UNIT)).err();
        assert!(err.is_some_and(|e| e.contains("not enough for 5 pods")));
        std::fs::create_dir_all(dir.path().join("pods/x")).expect("mkdir");
        std::fs::write(
            dir.path().join("pods/x/userns"),
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}"#,
        )
        .expect("write");
        let err = Manager::with_range(dir.path(), UNIT, 1, (UNIT, 4 * UNIT)).err();
        assert!(
            err.is_some_and(|e| e.contains("pods/x/userns") && e.contains("identical")),
            "the file and the problem are named"
        );
    }

    #[test]
    fn the_kubelet_users_subordinate_ids_are_read() {
        let text = "root:100000:65536\nkubelet:65536:7208960\n";
        assert_eq!(subordinate_range(text, "kubelet"), Some((65536, 7208960)));
        assert_eq!(subordinate_range(text, "nobody"), None);
    }
}
