//! The plugin registry, upstream's plugin watcher: a plugin puts a socket in the root dir's
//! `plugins_registry` (or a directory below it) serving the Registration service; nodelet asks
//! it what it is (GetInfo), takes DRA drivers' plugins (type `DRAPlugin`, API `v1.DRAPlugin` or
//! `v1beta1.DRAPlugin`)
//! and tells each plugin whether it was taken (NotifyRegistrationStatus). A socket that goes
//! away takes its plugin with it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;

use super::DraManager;
use proto::registration_client::RegistrationClient;

/// The generated messages and client of the plugin registration API, v1.
pub mod proto {
    tonic::include_proto!("pluginregistration");
}

/// The directory plugins register in, under the root dir.
pub const DIR: &str = "plugins_registry";
/// The plugin type of DRA drivers.
const DRA_PLUGIN: &str = "DRAPlugin";
/// The DRA plugin API versions nodelet speaks, as plugins name them, newest first.
const DRA_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// How often the directory is read again besides its change events (a plugin that did not
/// answer is asked again then).
const RESCAN: Duration = Duration::from_secs(5);
const INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// How deep below the registry directory sockets are looked for.
const MAX_DEPTH: usize = 4;

/// A socket file, told apart from a new one at the same path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    ctime: i64,
}

/// The sockets under `dir`, by path (names starting with a dot are skipped, as upstream).
fn sockets(dir: &Path, depth: usize, out: &mut BTreeMap<PathBuf, Identity>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.file_type().is_socket() {
            let id = Identity {
                dev: meta.dev(),
                ino: meta.ino(),
                ctime: meta.ctime(),
            };
            out.insert(entry.path(), id);
        } else if meta.is_dir() && depth < MAX_DEPTH {
            sockets(&entry.path(), depth + 1, out);
        }
    }
}

/// A plugin nodelet takes: its driver, the API version called, whether it streams its
/// devices' health, and its endpoint.
#[derive(Debug, PartialEq, Eq)]
struct Accepted {
    driver: String,
    version: &'static str,
    health: bool,
    endpoint: PathBuf,
}

/// Why a plugin's information is refused, in upstream's words; what is taken otherwise: of
/// the API versions the plugin lists, the first nodelet speaks, as upstream.
fn accept(info: &proto::PluginInfo, socket: &Path) -> Result<Accepted, String> {
    if info.r#type != DRA_PLUGIN {
        return Err(format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
            info.r#type,
            socket.display()
        ));
    }
    let invalid = |why: String| {
        format!(
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: {why}",
            info.name, info.endpoint
        )
    };
    if info.supported_versions.is_empty() {
        return Err(invalid(
            "empty list of supported gRPC services (aka supported versions)".into(),
        ));
    }
    let version = (info.supported_versions.iter())
        .find_map(|v| DRA_VERSIONS.into_iter().find(|&known| known == v));
    let Some(version) = version else {
        return Err(invalid(format!(
            "none of services supported by the plugin ({}) are supported by the kubelet ({})",
            quoted(info.supported_versions.iter().map(String::as_str)),
            quoted(DRA_VERSIONS)
        )));
    };
    if info.name.is_empty() {
        return Err("RegisterPlugin error -- plugin validation failed with err: the DRA driver plugin has no name".into());
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    Ok(Accepted {
        driver: info.name.clone(),
        version,
        health: info
            .supported_versions
            .iter()
            .any(|v| v == super::health::SERVICE),
        endpoint,
    })
}

/// A list as Go prints a `[]string` with `%q`.
fn quoted<'a>(list: impl IntoIterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = list.into_iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Registers the plugin behind `socket`: its driver's name, or why not.
async fn register(dra: &Arc<DraManager>, socket: &Path) -> Result<String, String> {
    let mut client = RegistrationClient::new(crate::runtime::unix_channel(socket));
    let info = tokio::time::timeout(INFO_TIMEOUT, client.get_info(proto::InfoRequest {}))
        .await
        .map_err(|_| format!("GetInfo gave no answer within {INFO_TIMEOUT:?}"))?
        .map_err(|s| format!("GetInfo failed: {}", s.message()))?
        .into_inner();
    let (accepted, error) = match accept(&info, socket) {
        Ok(taken) => {
            let (version, health) = (taken.version, taken.health);
            dra.register(&taken.driver, version, health, &taken.endpoint, socket);
            (Some(taken.driver), String::new())
        }
        Err(why) => (None, why),
    };
    let status = proto::RegistrationStatus {
        plugin_registered: accepted.is_some(),
        error: error.clone(),
    };
    let told = tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status))
        .await
        .map_err(|_| format!("NotifyRegistrationStatus gave no answer within {NOTIFY_TIMEOUT:?}"))
        .and_then(|r| r.map_err(|s| format!("NotifyRegistrationStatus failed: {}", s.message())));
    match (accepted, told) {
        (Some(driver), Ok(_)) => Ok(driver),
        (Some(_), Err(why)) => {
            dra.deregister(socket);
            Err(why)
        }
        (None, _) => Err(error),
    }
}

/// The registry directory followed: its sockets and the plugins registered through them.
pub struct Registry {
    dir: PathBuf,
    woken: tokio::sync::mpsc::Receiver<()>,
    /// Kept for its events.
    _watcher: Option<notify::RecommendedWatcher>,
    /// socket -> its identity and the driver it registered (None: refused, and not asked
    /// again until the socket changes).
    known: HashMap<PathBuf, (Identity, Option<String>)>,
    /// socket -> why it last failed (said once).
    failed: HashMap<PathBuf, String>,
}

impl Registry {
    /// The registry directory under `root_dir`, made (0750) and watched.
    pub fn open(root_dir: &Path) -> std::io::Result<Registry> {
        let dir = root_dir.join(DIR);
        crate::volumes::private_dir(&dir)?;
        let (wake, woken) = tokio::sync::mpsc::channel::<()>(1);
        // Reading the directory is an access event itself: only changes wake the scan.
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
                let _ = wake.try_send(());
            }
        })
        .and_then(|mut w| w.watch(&dir, notify::RecursiveMode::Recursive).map(|()| w));
        let watcher = watcher
            .inspect_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the plugin registry directory; it is read every {RESCAN:?}"))
            .ok();
        Ok(Registry {
            dir,
            woken,
            _watcher: watcher,
            known: HashMap::new(),
            failed: HashMap::new(),
        })
    }

    /// Registers the plugins of new sockets and deregisters those of sockets gone; returns
    /// the drivers that went away.
    pub async fn scan(&mut self, dra: &Arc<DraManager>) -> Vec<String> {
        let mut present = BTreeMap::new();
        sockets(&self.dir, 0, &mut present);
        let mut gone = Vec::new();
        self.known.retain(|path, (id, driver)| {
            let same = present.get(path) == Some(id);
            if !same && driver.is_some() {
                gone.extend(dra.deregister(path));
            }
            same
        });
        self.failed.retain(|path, _| present.contains_key(path));
        for (path, id) in present {
            if self.known.contains_key(&path) {
                continue;
            }
            match register(dra, &path).await {
                Ok(driver) => {
                    self.failed.remove(&path);
                    self.known.insert(path, (id, Some(driver)));
                }
                Err(why) => {
                    if self.failed.get(&path) != Some(&why) {
                        tracing::warn!(socket = %path.display(), error = %why, "plugin not registered");
                    }
                    // A plugin that answered and was refused is not asked again until its
                    // socket changes; one that did not answer is.
                    if why.starts_with("RegisterPlugin error") {
                        self.known.insert(path.clone(), (id, None));
                    }
                    self.failed.insert(path, why);
                }
            }
        }
        gone
    }

    /// Waits for a change in the directory, or [`RESCAN`].
    pub async fn wait(&mut self) {
        tokio::select! {
            // None: no watcher (its sender is gone), so only the rescan.
            Some(()) = self.woken.recv() => {}
            () = tokio::time::sleep(RESCAN) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dra_plugins_are_taken_with_a_version_nodelet_speaks() {
        let socket = Path::new("/r/plugins_registry/d-reg.sock");
        let info = proto::PluginInfo {
            r#type: DRA_PLUGIN.into(),
            name: "d.example.com".into(),
            endpoint: "/r/plugins/d.example.com/dra.sock".into(),
            supported_versions: vec![
                "v1.DRAPlugin".into(),
                "v1beta1.DRAPlugin".into(),
                "v1alpha1.DRAResourceHealth".into(),
            ],
        };
        assert_eq!(
            accept(&info, socket),
            Ok(Accepted {
                driver: "d.example.com".into(),
                version: "v1.DRAPlugin",
                health: true,
                endpoint: PathBuf::from("/r/plugins/d.example.com/dra.sock")
            })
        );
        let own_socket = proto::PluginInfo {
            endpoint: String::new(),
            ..info.clone()
        };
        assert_eq!(accept(&own_socket, socket).unwrap().endpoint, socket);
        let beta = proto::PluginInfo {
            supported_versions: vec!["v1beta1.DRAPlugin".into()],
            ..info.clone()
        };
        let taken = accept(&beta, socket).unwrap();
        assert_eq!((taken.version, taken.health), ("v1beta1.DRAPlugin", false));
        let csi = proto::PluginInfo {
            r#type: "CSIPlugin".into(),
            ..info.clone()
        };
        assert!(accept(&csi, socket).unwrap_err().contains("no handler"));
        let old = proto::PluginInfo {
            supported_versions: vec!["v1alpha4.Node".into()],
            ..info
        };
        assert!(accept(&old, socket).unwrap_err().ends_with(
            "none of services supported by the plugin ([\"v1alpha4.Node\"]) are supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"
        ));
    }

    #[tokio::test]
    async fn a_new_socket_wakes_the_registry_and_its_own_reading_does_not() {
        let root = tempfile::tempdir().unwrap();
        let mut registry = Registry::open(root.path()).unwrap();
        let mut found = BTreeMap::new();
        sockets(&registry.dir, 0, &mut found);
        let quiet = tokio::time::timeout(Duration::from_millis(300), registry.wait()).await;
        assert!(quiet.is_err(), "woken by its own reading of the directory");
        let _plugin =
            std::os::unix::net::UnixListener::bind(registry.dir.join("p-reg.sock")).unwrap();
        let woken = tokio::time::timeout(RESCAN / 2, registry.wait()).await;
        assert!(woken.is_ok(), "not woken by a new socket");
    }

    #[test]
    fn sockets_are_found_below_the_directory_and_dot_files_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let _a = std::os::unix::net::UnixListener::bind(dir.path().join("a.sock")).unwrap();
        let _b = std::os::unix::net::UnixListener::bind(dir.path().join("sub/b.sock")).unwrap();
        let _h = std::os::unix::net::UnixListener::bind(dir.path().join(".h.sock")).unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let mut found = BTreeMap::new();
        sockets(dir.path(), 0, &mut found);
        let names: Vec<_> = found
            .keys()
            .map(|p| p.strip_prefix(dir.path()).unwrap())
            .collect();
        assert_eq!(names, [Path::new("a.sock"), Path::new("sub/b.sock")]);
    }
}
