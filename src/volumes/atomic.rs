//! The upstream atomic writer: a volume's files live in a timestamped directory, `..data` is a
//! symlink to it swapped by rename, and each top-level name is a symlink through `..data`. A
//! reader inside the container sees the old set of files or the new one, never a mix.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::Path;

use crate::pod::is_valid_file_path;

/// One file of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub bytes: Vec<u8>,
    pub mode: u32,
}

/// A volume's files by relative path.
pub type Payload = BTreeMap<String, File>;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// The file mode a payload file gets on disk: with an fsGroup its group may read it too.
fn disk_mode(mode: u32, gid: Option<u32>) -> u32 {
    if gid.is_some() {
        (mode | 0o440) & 0o777
    } else {
        mode & 0o777
    }
}

/// Writes `payload` into `dir` (which must exist). Returns false when the files already are
/// exactly the payload, so an unchanged volume is never rewritten.
pub fn write(dir: &Path, payload: &Payload, gid: Option<u32>) -> std::io::Result<bool> {
    if let Some(bad) = payload.keys().find(|p| !is_valid_file_path(p)) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid file path {bad:?} in the volume"),
        ));
    }
    if holds(&dir.join(DATA), payload, gid) {
        return Ok(false);
    }
    let generation = new_generation_dir(dir)?;
    for (path, file) in payload {
        let target = generation.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Made private, and only opened up to its mode once its group is the right one.
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)?;
        out.write_all(&file.bytes)?;
        if let Some(gid) = gid {
            std::os::unix::fs::fchown(&out, None, Some(gid))?;
        }
        out.set_permissions(std::fs::Permissions::from_mode(disk_mode(file.mode, gid)))?;
    }
    let name = generation
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    let top: BTreeSet<String> = payload
        .keys()
        .filter_map(|p| p.split('/').next())
        .map(str::to_string)
        .collect();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(entry_name) = entry.file_name().into_string() else {
            continue;
        };
        let path = entry.path();
        if entry_name.starts_with("..") {
            if entry_name != DATA && entry.file_name() != name {
                std::fs::remove_dir_all(&path)?;
            }
        } else if !top.contains(&entry_name) {
            std::fs::remove_file(&path)?;
        }
    }
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(name), &link)?;
        }
    }
    Ok(true)
}

/// A fresh `..YYYY_MM_DD_HH_MM_SS.<n>` directory inside `dir`.
fn new_generation_dir(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let now = crate::types::now();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S").to_string();
    let mut n = now.subsec_nanosecond();
    loop {
        let path = dir.join(format!("..{stamp}.{n:09}"));
        match std::fs::create_dir(&path) {
            Ok(()) => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Does the directory at `data` hold exactly `payload` (paths, bytes and modes)?
fn holds(data: &Path, payload: &Payload, gid: Option<u32>) -> bool {
    let mut found = BTreeSet::new();
    if !collect(data, "", &mut found) || found.len() != payload.len() {
        return false;
    }
    payload.iter().all(|(path, file)| {
        let on_disk = data.join(path);
        found.contains(path)
            && std::fs::metadata(&on_disk)
                .is_ok_and(|m| m.permissions().mode() & 0o777 == disk_mode(file.mode, gid))
            && std::fs::read(&on_disk).is_ok_and(|b| b == file.bytes)
    })
}

/// The relative paths of the files under `dir`; false when it cannot be read.
fn collect(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        let Ok(name) = entry.file_name().into_string() else {
            return false;
        };
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                if !collect(&entry.path(), &rel, out) {
                    return false;
                }
            }
            Ok(_) => {
                out.insert(rel);
            }
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(pairs: &[(&str, &str)]) -> Payload {
        pairs
            .iter()
            .map(|(p, v)| {
                (
                    p.to_string(),
                    File {
                        bytes: v.as_bytes().to_vec(),
                        mode: 0o644,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn files_appear_through_data_and_are_replaced_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(write(dir, &payload(&[("a", "1"), ("sub/b", "2")]), None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert_eq!(
            std::fs::read_link(dir.join("a")).unwrap(),
            Path::new("..data/a")
        );
        assert!(!write(dir, &payload(&[("a", "1"), ("sub/b", "2")]), None).unwrap());
        assert!(write(dir, &payload(&[("a", "3")]), None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(
            std::fs::symlink_metadata(dir.join("sub")).is_err(),
            "gone keys go"
        );
        let generations = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.starts_with("..") && name != DATA
            })
            .count();
        assert_eq!(generations, 1, "old generations are removed");
    }

    #[test]
    fn modes_are_applied_and_a_mode_change_rewrites() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = payload(&[("k", "v")]);
        write(tmp.path(), &p, None).unwrap();
        p.get_mut("k").unwrap().mode = 0o400;
        assert!(write(tmp.path(), &p, None).unwrap());
        let mode = std::fs::metadata(tmp.path().join("k"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }

    #[test]
    fn paths_that_leave_the_volume_are_refused() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "..data", "..x"] {
            assert!(!is_valid_file_path(bad), "{bad}");
        }
        for good in ["a", "a/b", "a.b", ".hidden"] {
            assert!(is_valid_file_path(good), "{good}");
        }
        let tmp = tempfile::tempdir().unwrap();
        assert!(write(tmp.path(), &payload(&[("../x", "v")]), None).is_err());
    }
}
