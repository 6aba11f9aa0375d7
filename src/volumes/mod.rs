//! Pod volumes on the host: emptyDir (disk, or tmpfs for medium Memory) under the pod's
//! directory, hostPath with the checks and creation rules of its `type`, and the API-data
//! volumes (configMap, secret, downwardAPI, projected) written atomically, secrets on tmpfs.

mod atomic;
mod manager;
mod projected;
pub mod subpath;

pub use manager::Manager;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, ResourceFieldSelector, Volume};

use crate::pod::{parse_quantity, spec};

/// Why a volume could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume {volume:?}: {message}")]
    Volume { volume: String, message: String },
    #[error("{action} {}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// Makes `path` (and any missing parent) a directory only root and its group may enter:
/// upstream's 0750. One that exists is only ever tightened to it, never opened up.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(path)?;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & 0o027 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & !0o027))?;
    }
    Ok(())
}

/// The root dir and its `pods/`, private (0750) before anything is made in them: pod
/// directories hold Secrets and the volumes of other pods. A root dir that exists keeps its
/// mode, as upstream leaves it (it may be a directory the operator shares); `pods/` is
/// nodelet's own and is tightened.
pub fn prepare_root(root_dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(root_dir)
        .map_err(io("cannot create", root_dir))?;
    let pods = root_dir.join("pods");
    private_dir(&pods).map_err(io("cannot create", &pods))
}

/// Makes the root dir a shared mount (bound onto itself first when it is no mount point), as
/// upstream's kubelet does at start: mounts a container makes in a volume with Bidirectional
/// propagation then reach the host, and HostToContainer volumes see mounts made after the
/// container started.
pub fn share_root(root_dir: &Path) -> std::io::Result<()> {
    let root = root_dir.canonicalize()?;
    let info = std::fs::read("/proc/self/mountinfo")?;
    let info = String::from_utf8_lossy(&info);
    // The last entry for the path is the one on top.
    let entry = info
        .lines()
        .rfind(|l| l.split(' ').nth(4).map(unescape_mount_path).as_deref() == Some(&root));
    let shared = |line: &str| {
        line.split(' ')
            .skip(6)
            .take_while(|f| *f != "-")
            .any(|f| f.starts_with("shared:"))
    };
    let target = cstr(&root)?;
    let call = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    match entry {
        Some(line) if shared(line) => return Ok(()),
        Some(_) => {}
        // SAFETY: `target` is a valid NUL-terminated path that outlives the call.
        None => call(unsafe {
            libc::mount(
                target.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            )
        })?,
    }
    // SAFETY: as above; no source, type or data.
    call(unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED | libc::MS_REC,
            std::ptr::null(),
        )
    })
}

/// `<root-dir>/pods/<uid>`: the pod's own directory.
pub fn pod_dir(root_dir: &Path, uid: &str) -> PathBuf {
    root_dir.join("pods").join(uid)
}

/// Where nodelet keeps a volume it makes itself, for the volume stats of `/stats/summary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeDir {
    pub path: PathBuf,
    /// Whether it lives on tmpfs (secret, downwardAPI, projected, emptyDir of medium Memory).
    /// The others are on the node's disk and count as the pod's local ephemeral storage.
    pub tmpfs: bool,
}

/// The plugin of a volume nodelet makes itself under the pod's directory, upstream's name, and
/// whether it lives on tmpfs.
fn made_plugin(v: &Volume) -> Option<(&'static str, bool)> {
    if let Some(ed) = &v.empty_dir {
        Some((EMPTY_DIR, ed.medium.as_deref() == Some("Memory")))
    } else if v.config_map.is_some() {
        Some((CONFIG_MAP, false))
    } else if v.secret.is_some() {
        Some((SECRET, true))
    } else if v.downward_api.is_some() {
        Some((DOWNWARD_API, true))
    } else if v.projected.is_some() {
        Some((PROJECTED, true))
    } else {
        None
    }
}

const EMPTY_DIR: &str = "kubernetes.io/empty-dir";
const CONFIG_MAP: &str = "kubernetes.io/configmap";
const SECRET: &str = "kubernetes.io/secret";
const DOWNWARD_API: &str = "kubernetes.io/downward-api";
const PROJECTED: &str = "kubernetes.io/projected";

/// The plugins whose volumes nodelet makes under the pod's directory.
const MADE: [&str; 5] = [EMPTY_DIR, CONFIG_MAP, SECRET, DOWNWARD_API, PROJECTED];

/// A volume's plugin as upstream names it (`kubernetes.io/empty-dir`...); `None` for the
/// kinds nodelet does not support.
fn plugin(v: &Volume) -> Option<&'static str> {
    if v.host_path.is_some() {
        Some("kubernetes.io/host-path")
    } else if v.image.is_some() {
        Some("kubernetes.io/image")
    } else {
        made_plugin(v).map(|(plugin, _)| plugin)
    }
}

/// The directory of a plugin's volumes under the pod's `volumes/` (`kubernetes.io~empty-dir`).
fn plugin_dir(plugin: &str) -> String {
    plugin.replacen('/', "~", 1)
}

/// `<pod dir>/volumes/kubernetes.io~<plugin>/<name>` for the volumes nodelet makes itself
/// (emptyDir, configMap, secret, downwardAPI, projected); `None` for hostPath and the rest.
pub fn volume_dir(pod_dir: &Path, v: &Volume) -> Option<VolumeDir> {
    let (plugin, tmpfs) = made_plugin(v)?;
    Some(VolumeDir {
        path: pod_dir
            .join("volumes")
            .join(plugin_dir(plugin))
            .join(&v.name),
        tmpfs,
    })
}

/// What API-data volumes read besides the pod: its objects and its containers' resources.
pub struct Inputs<'a> {
    pub objects: &'a crate::objects::View,
    /// The value of a downwardAPI resourceFieldRef.
    pub resource_field: &'a (dyn Fn(&ResourceFieldSelector) -> Result<String, String> + Sync),
}

/// A volume ready on the host.
#[derive(Clone, Debug)]
pub struct Mounted {
    pub path: PathBuf,
    /// API-data volumes are always mounted read-only, as upstream.
    pub read_only: bool,
    /// An image volume's reference: the runtime mounts the image itself (no host path).
    pub image: Option<String>,
}

/// The pod's own directory and its `volumes`, `plugins` and `containers`, private.
fn make_pod_dir(dir: &Path) -> Result<()> {
    private_dir(dir).map_err(io("cannot create", dir))?;
    for sub in ["volumes", "plugins", "containers"] {
        private_dir(&dir.join(sub)).map_err(io("cannot create", &dir.join(sub)))?;
    }
    Ok(())
}

/// One volume set up: where it is, and whether the pod's fsGroup was applied to its files
/// this time.
struct Made {
    mounted: Mounted,
    group_applied: bool,
}

/// Makes one volume of the pod (whose directory is `dir`) available on the host. Idempotent:
/// it runs on every sync, which is also how API-data volumes follow changes.
fn mount(pod: &Pod, v: &Volume, dir: &Path, inputs: &Inputs<'_>) -> Result<Made> {
    let fs_group = spec(pod).security_context.as_ref().and_then(|s| s.fs_group);
    let (path, read_only, group_applied) = if let Some(image) = &v.image {
        let mounted = Mounted {
            path: PathBuf::new(),
            read_only: true,
            image: Some(image.reference.clone().unwrap_or_default()),
        };
        return Ok(Made {
            mounted,
            group_applied: false,
        });
    } else if v.empty_dir.is_some() {
        (empty_dir(v, dir, fs_group)?, false, fs_group.is_some())
    } else if let Some(hp) = &v.host_path {
        host_path(
            &v.name,
            Path::new(&hp.path),
            hp.type_.as_deref().unwrap_or(""),
        )?;
        (PathBuf::from(&hp.path), false, false)
    } else if let Some(files) = projected::payload(pod, v, inputs) {
        let files = files.map_err(|message| Error::Volume {
            volume: v.name.clone(),
            message,
        })?;
        let (path, written) = api_data(v, dir, &files, fs_group)?;
        (path, true, written && fs_group.is_some())
    } else {
        return Err(Error::Volume {
            volume: v.name.clone(),
            message: "volume type is not supported".into(),
        });
    };
    let mounted = Mounted {
        path,
        read_only,
        image: None,
    };
    Ok(Made {
        mounted,
        group_applied,
    })
}

/// [`volume_dir`] for a volume [`mount`] has already sorted as one nodelet makes itself.
fn made_dir(pod_dir: &Path, v: &Volume) -> Result<VolumeDir> {
    volume_dir(pod_dir, v).ok_or_else(|| Error::Volume {
        volume: v.name.clone(),
        message: "volume type is not supported".into(),
    })
}

/// Writes an API-data volume under `<pod>/volumes/kubernetes.io~<kind>/<name>`; says whether
/// its files changed. All but configMap volumes live on tmpfs, so secrets never touch the disk.
fn api_data(
    v: &Volume,
    pod_dir: &Path,
    files: &atomic::Payload,
    fs_group: Option<i64>,
) -> Result<(PathBuf, bool)> {
    let VolumeDir { path, tmpfs } = made_dir(pod_dir, v)?;
    make_volume_dir(&path)?;
    if tmpfs && !is_mount_point(&path) {
        mount_tmpfs(&path, "mode=0755").map_err(|e| Error::Volume {
            volume: v.name.clone(),
            message: format!("cannot mount tmpfs on {}: {e}", path.display()),
        })?;
    }
    let gid = fs_group.map(|g| g as u32);
    let written =
        atomic::write(&path, files, gid).map_err(io("cannot write the files of", &path))?;
    if written {
        tracing::debug!(volume = %v.name, dir = %path.display(), files = files.len(), "volume files updated");
    }
    Ok((path, written))
}

/// A volume's own directory under a private `kubernetes.io~<kind>` one: the containers that
/// mount it need to enter it, no one else on the host gets that far.
fn make_volume_dir(path: &Path) -> Result<()> {
    if let Some(kind) = path.parent() {
        private_dir(kind).map_err(io("cannot create", kind))?;
    }
    std::fs::create_dir_all(path).map_err(io("cannot create", path))
}

fn empty_dir(v: &Volume, pod_dir: &Path, fs_group: Option<i64>) -> Result<PathBuf> {
    let VolumeDir { path, tmpfs } = made_dir(pod_dir, v)?;
    make_volume_dir(&path)?;
    let ed = v.empty_dir.as_ref();
    if tmpfs && !is_mount_point(&path) {
        let size = ed
            .and_then(|e| e.size_limit.as_ref())
            .and_then(|q| parse_quantity(&q.0))
            .map(|bytes| format!(",size={}", bytes as u64))
            .unwrap_or_default();
        mount_tmpfs(&path, &format!("mode=0777{size}")).map_err(|e| Error::Volume {
            volume: v.name.clone(),
            message: format!("cannot mount tmpfs on {}: {e}", path.display()),
        })?;
    }
    // Containers running as any user may write an emptyDir, as upstream; a tmpfs one keeps
    // tmpfs's sticky bit, as upstream leaves it. With an fsGroup the directory belongs to that
    // group, and files made in it inherit the group (setgid).
    let mut mode = if tmpfs { 0o1777 } else { 0o777 };
    if let Some(gid) = fs_group {
        std::os::unix::fs::chown(&path, None, Some(gid as u32))
            .map_err(io("cannot chown", &path))?;
        mode |= 0o2000;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(io("cannot chmod", &path))?;
    Ok(path)
}

fn host_path(volume: &str, path: &Path, kind: &str) -> Result<()> {
    let err = |message: String| Error::Volume {
        volume: volume.into(),
        message,
    };
    let meta = std::fs::metadata(path);
    let shown = path.display();
    match (kind, &meta) {
        ("", _) => Ok(()),
        ("DirectoryOrCreate", Err(_)) => std::fs::create_dir_all(path)
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| err(format!("cannot create directory {shown}: {e}"))),
        ("FileOrCreate", Err(_)) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
            .map_err(|e| {
                err(format!(
                    "cannot create file {shown} (its directory must exist): {e}"
                ))
            }),
        (_, Err(e)) => Err(err(format!(
            "hostPath {shown} of type {kind} does not exist: {e}"
        ))),
        ("Directory" | "DirectoryOrCreate", Ok(m)) if !m.is_dir() => {
            Err(err(format!("hostPath {shown} is not a directory")))
        }
        ("File" | "FileOrCreate", Ok(m)) if !m.is_file() => {
            Err(err(format!("hostPath {shown} is not a file")))
        }
        ("Socket", Ok(m)) if !m.file_type().is_socket() => {
            Err(err(format!("hostPath {shown} is not a socket")))
        }
        ("CharDevice", Ok(m)) if !m.file_type().is_char_device() => {
            Err(err(format!("hostPath {shown} is not a character device")))
        }
        ("BlockDevice", Ok(m)) if !m.file_type().is_block_device() => {
            Err(err(format!("hostPath {shown} is not a block device")))
        }
        _ => Ok(()),
    }
}

/// Removes the pod's directory and everything in it, unmounting its tmpfs volumes first.
fn remove_pod_dir(root_dir: &Path, uid: &str) -> Result<()> {
    if !crate::types::is_path_part(uid) {
        return Err(Error::Io {
            action: "refusing to remove the directory of a pod whose UID is no path part under",
            path: root_dir.join("pods"),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    // The mount table names real paths: a root dir given through a symlink must match them
    // (the pod's own directory is not resolved: a symlink there is removed, not followed).
    let pods = root_dir.join("pods");
    let dir = match pods.canonicalize() {
        Ok(pods) => pods.join(uid),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("cannot resolve", &pods)(e)),
    };
    // Everything mounted below is unmounted before anything is removed, so the removal never
    // reaches into a volume's source; a mount table that cannot be read stops it.
    let mut mounts = mount_points_under(&dir)?;
    // Deepest first.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        unmount(&m).map_err(io("cannot unmount", &m))?;
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("cannot remove", &dir)(e)),
        _ => Ok(()),
    }
}

fn mount_points_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let table = Path::new("/proc/self/mountinfo");
    // Read as bytes: one mount point that is not UTF-8 must not hide all the others.
    let info = std::fs::read(table).map_err(io("cannot read the mount table", table))?;
    let info = String::from_utf8_lossy(&info);
    Ok(info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect())
}

fn unescape_mount_path(field: &str) -> PathBuf {
    // mountinfo escapes space, tab, newline and backslash as octal.
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

fn is_mount_point(path: &Path) -> bool {
    mount_points_under(path).is_ok_and(|mounts| mounts.iter().any(|m| m == path))
}

fn cstr(path: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn mount_tmpfs(path: &Path, options: &str) -> std::io::Result<()> {
    let target = cstr(path)?;
    let opts = std::ffi::CString::new(options)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn unmount(path: &Path) -> std::io::Result<()> {
    let target = cstr(path)?;
    // SAFETY: `target` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_path_types_are_checked_and_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("made/deep");
        host_path("v", &dir, "DirectoryOrCreate").unwrap();
        assert!(dir.is_dir());
        host_path("v", &dir, "Directory").unwrap();
        let file = tmp.path().join("f");
        host_path("v", &file, "FileOrCreate").unwrap();
        assert!(file.is_file());
        host_path("v", &file, "File").unwrap();
        let err = host_path("v", &file, "Directory").unwrap_err().to_string();
        assert!(
            err.contains("volume \"v\"") && err.contains("not a directory"),
            "{err}"
        );
        assert!(host_path("v", &tmp.path().join("missing"), "File").is_err());
        assert!(host_path("v", &tmp.path().join("no/parent"), "FileOrCreate").is_err());
        assert!(host_path("v", &file, "Socket").is_err());
        host_path("v", &tmp.path().join("anything"), "").unwrap();
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
    }
}
