//! The DRA manager's checkpoint, `dra_manager_state` in the root dir, in upstream's format: the
//! claims the node has prepared, with the pods using each and each driver's devices, as JSON in
//! a `Data` string with its CRC-32 (IEEE) as `Checksum`. A kubelet and nodelet read each
//! other's file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the root dir, as upstream names it.
pub const FILE: &str = "dra_manager_state";

const KIND: &str = "DRACheckpoint";
const API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the DRA checkpoint {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("the DRA checkpoint {0} is damaged: {1}")]
    Damaged(PathBuf, String),
    #[error("cannot write the DRA checkpoint {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// One prepared (or being prepared) claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct ClaimState {
    #[serde(rename = "ClaimUID")]
    pub uid: String,
    #[serde(rename = "ClaimName")]
    pub name: String,
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// The pods using the claim (a JSON object of empty objects, as upstream's set).
    #[serde(rename = "PodUIDs", with = "set")]
    pub pods: BTreeSet<String>,
    /// Every driver with results in the claim's allocation, and the devices it prepared.
    #[serde(rename = "DriverState")]
    pub drivers: BTreeMap<String, DriverState>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct DriverState {
    #[serde(rename = "Devices", default, deserialize_with = "null_as_empty")]
    pub devices: Vec<Device>,
}

/// A device a driver prepared, and the CDI IDs that give it to a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Device {
    #[serde(rename = "PoolName")]
    pub pool: String,
    #[serde(rename = "DeviceName")]
    pub device: String,
    #[serde(rename = "ShareID")]
    pub share_id: Option<String>,
    /// The requests the device was allocated for (none: every request of the claim).
    #[serde(rename = "RequestNames", default, deserialize_with = "null_as_empty")]
    pub requests: Vec<String>,
    #[serde(rename = "CDIDeviceIDs", default, deserialize_with = "null_as_empty")]
    pub cdi_ids: Vec<String>,
}

#[derive(Deserialize, Serialize)]
struct Data {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    #[serde(
        rename = "ClaimInfoStateList",
        default,
        deserialize_with = "null_as_empty"
    )]
    claims: Vec<ClaimState>,
}

#[derive(Deserialize, Serialize)]
struct File {
    #[serde(rename = "Data")]
    data: String,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

/// Go writes an empty list as `null`.
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A set of strings as Go's `sets.Set[string]` marshals it: `{"a":{},"b":{}}`.
mod set {
    use std::collections::{BTreeMap, BTreeSet};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize, Serialize)]
    struct Empty {}

    pub fn serialize<S: Serializer>(set: &BTreeSet<String>, s: S) -> Result<S::Ok, S::Error> {
        let map: BTreeMap<&str, Empty> = set.iter().map(|k| (k.as_str(), Empty {})).collect();
        map.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<String>, D::Error> {
        let map = Option::<BTreeMap<String, serde::de::IgnoredAny>>::deserialize(d)?;
        Ok(map.unwrap_or_default().into_keys().collect())
    }
}

/// CRC-32 with the IEEE polynomial (Go's `crc32.ChecksumIEEE`).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The claims in the checkpoint in `root_dir`; none when there is no file.
pub fn read(root_dir: &Path) -> Result<Vec<ClaimState>, Error> {
    let path = root_dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Read(path, e)),
    };
    let damaged = |why: String| Error::Damaged(path.clone(), why);
    let file: File = serde_json::from_slice(&text).map_err(|e| damaged(e.to_string()))?;
    if crc32(file.data.as_bytes()) != file.checksum {
        return Err(damaged("its checksum does not match its data".into()));
    }
    let data: Data = serde_json::from_str(&file.data).map_err(|e| damaged(e.to_string()))?;
    if data.kind != KIND || data.api_version != API_VERSION {
        return Err(damaged(format!(
            "it is a {} of {}, not a {KIND} of {API_VERSION}",
            data.kind, data.api_version
        )));
    }
    Ok(data.claims)
}

/// Writes `claims` to the checkpoint in `root_dir` (a new file renamed over it).
pub fn write(root_dir: &Path, claims: Vec<ClaimState>) -> Result<(), Error> {
    let path = root_dir.join(FILE);
    let data = Data {
        kind: KIND.into(),
        api_version: API_VERSION.into(),
        claims,
    };
    let data = serde_json::to_string(&data).map_err(|e| Error::Write(path.clone(), e.into()))?;
    let file = File {
        checksum: crc32(data.as_bytes()),
        data,
    };
    crate::types::replace_json(&path, &file).map_err(|e| Error::Write(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32_ieee() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_kubelet_checkpoint_is_read_and_written_back_the_same() {
        let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","ClaimInfoStateList":[{"ClaimUID":"067798be","ClaimName":"example","Namespace":"default","PodUIDs":{"139cdb46":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":[{"PoolName":"worker-1","DeviceName":"dev-0","ShareID":null,"RequestNames":["req-0"],"CDIDeviceIDs":["example.com/example=cdi-example"]}]}}}]}"#;
        let file = serde_json::json!({"Data": data, "Checksum": crc32(data.as_bytes())});
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), file.to_string()).unwrap();
        let claims = read(dir.path()).unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].pods, BTreeSet::from(["139cdb46".to_string()]));
        let devices = &claims[0].drivers["test-driver.cdi.k8s.io"].devices;
        assert_eq!(devices[0].cdi_ids, ["example.com/example=cdi-example"]);
        write(dir.path(), claims).unwrap();
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(FILE)).unwrap()).unwrap();
        assert_eq!(written, file);
    }

    #[test]
    fn a_damaged_checkpoint_is_an_error_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), Vec::new());
        std::fs::write(dir.path().join(FILE), r#"{"Data":"{}","Checksum":1}"#).unwrap();
        assert!(matches!(read(dir.path()), Err(Error::Damaged(..))));
    }
}
