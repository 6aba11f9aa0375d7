//! subPath mounts that a container cannot redirect. A container may swap any directory of its
//! volume for a symlink at any moment, so a subPath is never resolved by path: each component is
//! opened beneath the volume without following symlinks (and created the same way when
//! missing), and what was opened is bind-mounted through its descriptor onto a private path in
//! the pod's directory. The runtime gets that path, which nothing in a container can change.
//! The mounts go with the pod's directory ([`super::teardown`] unmounts everything in it).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// Where a container's subPath mounts live: `<pod dir>/volume-subpaths/<volume>/<container>/<n>`
/// for its n-th volumeMount, as upstream lays them out.
pub fn target(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir
        .join("volume-subpaths")
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// Bind-mounts `sub` of the volume at `base` onto `target` and returns `target`. Missing
/// directories on the way are created with the volume's own mode; a symlink anywhere in `sub`
/// is refused, wherever it points.
pub fn mount(base: &Path, sub: &str, target: &Path) -> Result<PathBuf, String> {
    let opened = open_beneath(base, sub, true)?;
    let stat = fstat(&opened).map_err(|e| format!("cannot inspect it: {e}"))?;
    let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
    prepare_target(target, is_dir)?;
    let source = CString::new(format!("/proc/self/fd/{}", opened.as_raw_fd()))
        .map_err(|_| "a descriptor path with a NUL".to_string())?;
    let dest = cstring(target)?;
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call; the other
    // arguments may be null for a bind mount.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            dest.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot bind-mount it onto {}: {}",
            target.display(),
            std::io::Error::last_os_error()
        ));
    }
    // What is mounted must be what was opened.
    let mounted = std::fs::metadata(target).map_err(|e| format!("{}: {e}", target.display()))?;
    use std::os::unix::fs::MetadataExt as _;
    if mounted.dev() != stat.st_dev || mounted.ino() != stat.st_ino {
        let _ = super::unmount(target);
        return Err(format!(
            "{} does not show what was opened",
            target.display()
        ));
    }
    Ok(target.to_path_buf())
}

/// An empty directory or file at `target`, its parents made, whatever was mounted there before
/// (a container's earlier start) unmounted: the container gets a fresh view of its subPath.
fn prepare_target(target: &Path, is_dir: bool) -> Result<(), String> {
    let shown = |e: std::io::Error| format!("{}: {e}", target.display());
    while super::is_mount_point(target) {
        super::unmount(target).map_err(shown)?;
    }
    let parent = target
        .parent()
        .ok_or_else(|| format!("{} has no parent", target.display()))?;
    std::fs::create_dir_all(parent).map_err(shown)?;
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir(target).map_err(shown)?,
        Ok(_) => std::fs::remove_file(target).map_err(shown)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(shown(e)),
    }
    if is_dir {
        std::fs::create_dir(target).map_err(shown)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(drop)
            .map_err(shown)
    }
}

/// Opens `sub` beneath `base` (an `O_PATH` descriptor), one component at a time, never
/// following a symlink; with `create`, missing components are made as directories with
/// `base`'s mode.
pub fn open_beneath(base: &Path, sub: &str, create: bool) -> Result<OwnedFd, String> {
    let flags = libc::O_PATH | libc::O_CLOEXEC;
    let mut dir = open_at(libc::AT_FDCWD, &cstring(base)?, flags | libc::O_DIRECTORY)
        .map_err(|e| format!("cannot open {}: {e}", base.display()))?;
    let mode = fstat(&dir)
        .map_err(|e| format!("cannot inspect {}: {e}", base.display()))?
        .st_mode
        & 0o7777;
    let mut walked = PathBuf::new();
    for component in Path::new(sub).components() {
        let name = match component {
            Component::Normal(name) => name,
            Component::CurDir => continue,
            _ => return Err("must be a relative path without '..'".into()),
        };
        walked.push(name);
        let name =
            CString::new(name.as_encoded_bytes()).map_err(|_| "holds a NUL byte".to_string())?;
        let next = match open_at(dir.as_raw_fd(), &name, flags | libc::O_NOFOLLOW) {
            Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
                make_dir(&dir, &name, mode)
                    .map_err(|e| format!("cannot create {}: {e}", walked.display()))?;
                open_at(dir.as_raw_fd(), &name, flags | libc::O_NOFOLLOW)
            }
            other => other,
        }
        .map_err(|e| format!("cannot open {}: {e}", walked.display()))?;
        let kind = fstat(&next)
            .map_err(|e| format!("cannot inspect {}: {e}", walked.display()))?
            .st_mode
            & libc::S_IFMT;
        if kind == libc::S_IFLNK {
            return Err(format!(
                "{} is a symlink, which is not followed here",
                walked.display()
            ));
        }
        dir = next;
    }
    Ok(dir)
}

/// `mkdirat`, then the mode set exactly (the umask would narrow it), through the new
/// directory's own descriptor.
fn make_dir(parent: &OwnedFd, name: &CString, mode: u32) -> std::io::Result<()> {
    // SAFETY: `parent` is an open descriptor and `name` a valid NUL-terminated string.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), mode) } != 0 {
        let e = std::io::Error::last_os_error();
        // Another start made it meanwhile: it is opened (without following) next.
        return if e.kind() == std::io::ErrorKind::AlreadyExists {
            Ok(())
        } else {
            Err(e)
        };
    }
    let made = open_at(
        parent.as_raw_fd(),
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )?;
    // SAFETY: `made` is an open descriptor.
    if unsafe { libc::fchmod(made.as_raw_fd(), mode) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn open_at(dir: libc::c_int, name: &CString, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; `dir` is AT_FDCWD or an open descriptor.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed `stat` is a valid value for fstat to fill in.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `stat` is a valid, writable struct.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat)
}

fn cstring(path: &Path) -> Result<CString, String> {
    super::cstr(path).map_err(|_| format!("{} holds a NUL byte", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_made_beneath_the_volume_and_symlinks_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("vol");
        std::fs::create_dir(&base).unwrap();
        let made = open_beneath(&base, "a/./b", true).unwrap();
        assert!(base.join("a/b").is_dir());
        let stat = fstat(&made).unwrap();
        assert_eq!(stat.st_mode & libc::S_IFMT, libc::S_IFDIR);

        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, base.join("link")).unwrap();
        let err = open_beneath(&base, "link/x", true).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        assert!(
            !outside.join("x").exists(),
            "nothing is made through a link"
        );
        let err = open_beneath(&base, "link", true).unwrap_err();
        assert!(err.contains("link is a symlink"), "{err}");
        assert!(open_beneath(&base, "../x", true).is_err());
        assert!(open_beneath(&base, "/etc", true).is_err());
    }
}
