//! The device manager's checkpoint, `kubelet_internal_checkpoint` in the device plugin dir, in
//! upstream's layout: each container's devices with the plugin's Allocate answer (protobuf,
//! base64 in JSON), and the devices each resource had. The checksum is nodelet's own (FNV-1a
//! over the data's JSON): upstream's hashes a Go dump of its structs, and a kubelet reading
//! nodelet's file (or nodelet reading a kubelet's) warns and starts without it, as both do with
//! a damaged checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use prost::Message as _;
use serde::{Deserialize, Serialize};

use super::{Held, proto};

/// The file's name, as upstream names it.
pub const FILE: &str = "kubelet_internal_checkpoint";

/// Upstream's key for devices without NUMA affinity.
const NO_NUMA: &str = "-1";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the device checkpoint {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("the device checkpoint {0} is damaged: {1}")]
    Damaged(PathBuf, String),
    #[error("cannot write the device checkpoint {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: BTreeMap<String, Vec<String>>,
    #[serde(rename = "AllocResp")]
    response: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct Data {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Vec<Entry>,
    #[serde(rename = "RegisteredDevices", default)]
    registered: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

fn checksum(data: &Data) -> u64 {
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    u64::from(hash)
}

/// pod UID -> container -> resource -> devices.
pub type Pods = BTreeMap<String, BTreeMap<String, BTreeMap<String, Held>>>;

/// The allocations and the resources the checkpoint in `dir` names; `None` without one.
pub fn read(dir: &Path) -> Result<Option<(Pods, Vec<String>)>, Error> {
    let path = dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Read(path, e)),
    };
    let damaged = |why: String| Error::Damaged(path.clone(), why);
    let file: File = serde_json::from_slice(&text).map_err(|e| damaged(e.to_string()))?;
    if file.checksum != checksum(&file.data) {
        return Err(damaged("its checksum does not match".into()));
    }
    let mut pods = Pods::new();
    for e in file.data.entries {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&e.response)
            .map_err(|err| damaged(format!("pod {}: {err}", e.pod_uid)))?;
        let response = proto::ContainerAllocateResponse::decode(bytes.as_slice())
            .map_err(|err| damaged(format!("pod {}: {err}", e.pod_uid)))?;
        let mut ids: Vec<String> = e.device_ids.into_values().flatten().collect();
        ids.sort();
        ids.dedup();
        pods.entry(e.pod_uid)
            .or_default()
            .entry(e.container)
            .or_default()
            .insert(e.resource, Held { ids, response });
    }
    Ok(Some((pods, file.data.registered.into_keys().collect())))
}

/// Writes the checkpoint (a temporary file renamed over the old one).
pub fn write<'a>(
    dir: &Path,
    pods: impl Iterator<Item = (&'a str, &'a BTreeMap<String, BTreeMap<String, Held>>)>,
    registered: impl Iterator<Item = (&'a str, Vec<&'a str>)>,
) -> Result<(), Error> {
    let mut data = Data::default();
    for (uid, containers) in pods {
        for (container, resources) in containers {
            for (resource, held) in resources {
                data.entries.push(Entry {
                    pod_uid: uid.to_string(),
                    container: container.clone(),
                    resource: resource.clone(),
                    device_ids: BTreeMap::from([(NO_NUMA.to_string(), held.ids.clone())]),
                    response: base64::engine::general_purpose::STANDARD
                        .encode(held.response.encode_to_vec()),
                });
            }
        }
    }
    data.registered = registered
        .map(|(name, ids)| {
            (
                name.to_string(),
                ids.into_iter().map(String::from).collect(),
            )
        })
        .collect();
    let file = File {
        checksum: checksum(&data),
        data,
    };
    let path = dir.join(FILE);
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, serde_json::to_vec(&file).unwrap_or_default()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|e| Error::Write(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_come_back_as_they_were_written() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let response = proto::ContainerAllocateResponse {
            envs: [("A".to_string(), "1".to_string())].into(),
            mounts: vec![proto::Mount {
                container_path: "/dev-lib".into(),
                host_path: "/opt/lib".into(),
                read_only: true,
            }],
            ..Default::default()
        };
        let held = Held {
            ids: vec!["d1".into(), "d2".into()],
            response,
        };
        let containers = BTreeMap::from([(
            "c".to_string(),
            BTreeMap::from([("example.com/dev".to_string(), held.clone())]),
        )]);
        write(
            dir.path(),
            [("uid-1", &containers)].into_iter(),
            [("example.com/dev", vec!["d1", "d2", "d3"])].into_iter(),
        )
        .expect("written");
        let (pods, registered) = read(dir.path()).expect("read").expect("a checkpoint");
        assert_eq!(pods["uid-1"]["c"]["example.com/dev"], held);
        assert_eq!(registered, ["example.com/dev"]);
        let text = std::fs::read_to_string(dir.path().join(FILE)).expect("the file");
        assert!(text.contains(r#""DeviceIDs":{"-1":["d1","d2"]}"#), "{text}");
        std::fs::write(dir.path().join(FILE), text.replace("d2", "d9")).expect("tampered");
        assert!(matches!(read(dir.path()), Err(Error::Damaged(..))));
    }
}
