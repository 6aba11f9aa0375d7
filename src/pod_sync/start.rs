//! Starting the containers a sync starts: the restart backoff, the images pulled at once,
//! each container's CRI config with its files, CPUs, memory nodes and devices, its creation
//! and start in a start slot, its log link, and its postStart hook.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::pull::Pulled;
use super::{Error, Syncer, actions, convert, hooks, status};
use crate::events::Target;
use crate::pod::{grace_period_seconds, spec};
use crate::runtime::{ContainerState, PodRuntime, cri};
use crate::types::{PodUid, full_name};
use crate::{images, volumes};

/// How soon a pod whose pull just failed is synced again, to show ImagePullBackOff.
const IMAGE_RETRY_CHECK: Duration = Duration::from_secs(1);

/// How long a postStart hook may run (upstream has no bound; a hung hook must not hang the pod).
const POST_START_TIMEOUT: Duration = Duration::from_secs(120);

/// What a sync has made ready before it starts containers.
pub(super) struct Prepared<'a> {
    pub sandbox_id: &'a str,
    pub sandbox_config: &'a cri::PodSandboxConfig,
    pub volumes: &'a HashMap<String, volumes::Mounted>,
    pub objects: &'a crate::objects::View,
    pub pod_ip: &'a str,
}

/// The earlier of a wait already due and `wait`.
fn sooner(due: Option<Duration>, wait: Duration) -> Option<Duration> {
    Some(due.map_or(wait, |d| d.min(wait)))
}

impl Syncer {
    /// Starts the containers the plan starts. One still in CrashLoopBackOff waits; the images
    /// of the others are pulled at once, then they start in their order. Each failure becomes
    /// its container's waiting reason. Returns when to sync again (the first backoff or pull
    /// retry to end), or the first failure that is not an image's.
    pub(super) async fn start_all(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        starts: &[actions::Start],
        prepared: &Prepared<'_>,
    ) -> Result<Option<Duration>, Error> {
        let uid = PodUid::of(pod);
        let mut again: Option<Duration> = None;
        let mut due = Vec::new();
        for start in starts {
            match self.restart_backoff(pod, rt, start) {
                Some(wait) => {
                    self.backing_off(pod, &start.name, wait);
                    again = sooner(again, wait);
                }
                None => due.push(start),
            }
        }
        let pulls = due
            .iter()
            .map(|start| self.pull_images(pod, start, prepared));
        let pulled = futures_util::future::join_all(pulls).await;
        let mut first_error = None;
        for (start, pulled) in due.into_iter().zip(pulled) {
            let started = match pulled {
                Ok(pulled) => self.start_container(pod, start, prepared, pulled).await,
                Err(e) => Err(e),
            };
            match started.map_err(|e| self.start_failed(pod, &start.name, e)) {
                Ok(()) => self.record_waiting(&uid, &start.name, None),
                Err(Ok(retry)) => again = sooner(again, retry),
                Err(Err(e)) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(again), Err)
    }

    /// For a restart of a container that exited: how long it must still wait (CrashLoopBackOff),
    /// or `None` after recording the restart in the backoff.
    fn restart_backoff(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        start: &actions::Start,
    ) -> Option<Duration> {
        let previous = rt
            .latest_container(&start.name)
            .filter(|c| c.state == ContainerState::Exited)?;
        let key = format!("{}_{}_{}", PodUid::of(pod), start.name, previous.digest);
        let finished = UNIX_EPOCH + Duration::from_nanos(previous.finished_at.max(0) as u64);
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        // After a nodelet restart the delay goes on from the restart count, not from zero.
        let started = UNIX_EPOCH + Duration::from_nanos(previous.started_at.max(0) as u64);
        backoff.resume(&key, previous.attempt, started, finished);
        let remaining = backoff.remaining(&key, finished, SystemTime::now());
        if remaining.is_none() {
            backoff.next(&key, finished);
        }
        remaining
    }

    /// A container that waits out its restart backoff: a BackOff warning, and CrashLoopBackOff
    /// as its waiting reason.
    fn backing_off(&self, pod: &Pod, container: &str, wait: Duration) {
        let name = full_name(pod);
        let message = format!(
            "back-off {}s restarting failed container={container} pod={name}",
            wait.as_secs().max(1),
        );
        self.events.warning(
            Target::container(pod, container),
            "BackOff",
            format!("Back-off restarting failed container {container} in pod {name}"),
        );
        let reason = "CrashLoopBackOff".to_string();
        let waiting = status::Waiting { reason, message };
        self.record_waiting(&PodUid::of(pod), container, Some(waiting));
    }

    /// A container start that failed: its waiting reason, and a Failed warning unless an image
    /// was at fault (the puller reports those). A failed pull is retried when its backoff ends;
    /// the sync after the failure (a second later) shows ImagePullBackOff until then: that wait
    /// is returned; any other failure is given back.
    fn start_failed(&self, pod: &Pod, container: &str, e: Error) -> Result<Duration, Error> {
        let message = crate::types::error_chain(&e);
        let reason = e.waiting_reason();
        let retry = match &e {
            Error::Image {
                source: images::Error::BackOff { remaining, .. },
                ..
            } => Some(*remaining),
            Error::Image {
                source: images::Error::Pull { .. },
                ..
            } => Some(IMAGE_RETRY_CHECK),
            Error::Image { .. } => None,
            _ => {
                self.events.warning(
                    Target::container(pod, container),
                    "Failed",
                    format!("Error: {message}"),
                );
                None
            }
        };
        let waiting = status::Waiting { reason, message };
        self.record_waiting(&PodUid::of(pod), container, Some(waiting));
        retry.ok_or(e)
    }

    /// Records why the container's last start failed, or with `None` that it started.
    fn record_waiting(&self, uid: &PodUid, container: &str, failure: Option<status::Waiting>) {
        self.book(uid, |book| match failure {
            Some(w) => {
                book.waiting.insert(container.into(), w);
            }
            None => {
                book.waiting.remove(container);
            }
        });
    }

    /// Creates and starts one container, then runs its postStart hook.
    async fn start_container(
        &self,
        pod: &Pod,
        start: &actions::Start,
        prepared: &Prepared<'_>,
        pulled: Pulled,
    ) -> Result<(), Error> {
        let Some(container) = crate::pod::find_container(spec(pod), &start.name) else {
            return Ok(());
        };
        let Some(image) = &pulled.image else {
            return Ok(());
        };
        verify_non_root(pod, &container, image).map_err(|message| Error::Config {
            container: start.name.clone(),
            message,
        })?;
        let mut config = self.container_config(pod, start, &container, prepared, &pulled)?;
        self.place(pod, &container, &mut config).await?;
        let id = self
            .run_container(pod, start, &container, prepared, config)
            .await?;
        self.post_start(pod, &container, &id, prepared.pod_ip).await
    }

    /// The container's CRI config, with the files it mounts made: its /etc/hosts, its
    /// termination log and its subPaths.
    fn container_config(
        &self,
        pod: &Pod,
        start: &actions::Start,
        container: &Container,
        prepared: &Prepared<'_>,
        pulled: &Pulled,
    ) -> Result<cri::ContainerConfig, Error> {
        let etc_hosts = self.write_etc_hosts(pod, prepared.pod_ip)?;
        let termination_log = volumes::pod_dir(&self.ctx.root_dir, &PodUid::of(pod).0)
            .join("containers")
            .join(&start.name)
            .join(format!("{}.termination-log", start.restart_count));
        create_world_writable(&termination_log).map_err(|source| Error::Io {
            path: termination_log.clone(),
            source,
        })?;
        let no_sub_paths = HashMap::new();
        let mut input = convert::ContainerInput {
            pod,
            container,
            init: start.init,
            restart_count: start.restart_count,
            image_ref: pulled.image.as_ref().map_or("", |i| i.id.as_str()),
            volumes: prepared.volumes,
            objects: prepared.objects,
            pod_ip: prepared.pod_ip,
            host_ip: &self.ctx.host_ip,
            node: &self.ctx.node,
            cfs: self.ctx.cfs,
            termination_log: Some(&termination_log),
            etc_hosts: Some(&etc_hosts),
            sub_paths: &no_sub_paths,
            pid_target: start.pid_target.as_deref(),
            rro_supported: self.rro_supported(pod, || self.objects.view(pod)),
            userns: prepared
                .sandbox_config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.as_ref())
                .and_then(|n| n.userns_options.as_ref()),
            image_volumes: &pulled.volumes,
        };
        let sub_paths = self.mount_sub_paths(&input)?;
        input.sub_paths = &sub_paths;
        convert::container_config(&input).map_err(|message| Error::Config {
            container: start.name.clone(),
            message,
        })
    }

    /// Gives the container the CPUs and memory nodes its pod was admitted with, and its devices.
    async fn place(
        &self,
        pod: &Pod,
        container: &Container,
        config: &mut cri::ContainerConfig,
    ) -> Result<(), Error> {
        if let Some(resources) = config.linux.as_mut().and_then(|l| l.resources.as_mut()) {
            let uid = PodUid::of(pod);
            if let Some(cpus) = self.resources.cpus.cpuset(&uid.0, &container.name) {
                resources.cpuset_cpus = cpus;
            }
            if let Some(mems) = self.resources.memory.mems(&uid.0, &container.name) {
                resources.cpuset_mems = mems;
            }
        }
        let devices = self.resources.devices.container_start(pod, container).await;
        let devices = devices.map_err(|source| Error::Devices {
            container: container.name.clone(),
            source,
        })?;
        if let Some(devices) = devices {
            convert::with_devices(config, devices);
        }
        let cdi = self.resources.dra.cdi_devices(pod, container);
        config
            .cdi_devices
            .extend(cdi.into_iter().map(|name| cri::CdiDevice { name }));
        Ok(())
    }

    /// Has the runtime create and start the container (in a container start slot), with its
    /// log directory and link; returns its ID.
    async fn run_container(
        &self,
        pod: &Pod,
        start: &actions::Start,
        container: &Container,
        prepared: &Prepared<'_>,
        config: cri::ContainerConfig,
    ) -> Result<String, Error> {
        let log_dir = convert::pod_log_dir(&self.ctx, pod).join(&start.name);
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            path: log_dir.clone(),
            source,
        })?;
        let log_file = convert::pod_log_dir(&self.ctx, pod).join(&config.log_path);
        let stop_signal = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.stop_signal.as_deref())
            .and_then(crate::pod::cri_signal);
        let uid = PodUid::of(pod);
        let step = self.diagnoses.begin(&uid, "a container start slot".into());
        let slot = self.container_starts.acquire().await;
        drop(step);
        let step = format!("the runtime to create and start container {}", start.name);
        let step = self.diagnoses.begin(&uid, step);
        let sandbox = prepared.sandbox_config.clone();
        let image_volumes = image_volume_mounts(pod, container);
        let made = self
            .runtime
            .create_container(prepared.sandbox_id, config, sandbox, stop_signal)
            .await;
        if let Some((volumes, mounts)) = image_volumes {
            let failed = made
                .as_ref()
                .is_err_and(|e| e.status_message().starts_with("ImageVolumeMountFailed"));
            crate::metrics::get().image_volumes(volumes, mounts, failed);
        }
        let id = made?;
        let target = Target::container(pod, &start.name);
        let created = format!("Created container: {}", start.name);
        self.events.normal(target.clone(), "Created", created);
        self.link_log(pod, &start.name, &id, &log_file);
        self.runtime.start_container(&id).await?;
        drop((slot, step));
        tracing::debug!(pod = %full_name(pod), container = %start.name, id = %id, restart_count = start.restart_count, "started container");
        let started = format!("Started container {}", start.name);
        self.events.normal(target, "Started", started);
        crate::metrics::get().container_started(start.init);
        Ok(id)
    }

    /// Runs the container's postStart hook, if it has one; a hook that fails stops the
    /// container (FailedPostStartHook).
    async fn post_start(
        &self,
        pod: &Pod,
        container: &Container,
        id: &str,
        pod_ip: &str,
    ) -> Result<(), Error> {
        let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return Ok(());
        };
        let host = if pod_ip.is_empty() {
            self.ctx.host_ip.as_str()
        } else {
            pod_ip
        };
        let name = &container.name;
        // Boxed: most containers have no hook, and their starts should not carry its state.
        let hook = Box::pin(hooks::run(
            &self.runtime,
            handler,
            container,
            id,
            host,
            POST_START_TIMEOUT,
        ));
        let step = format!("the postStart hook of container {name}");
        let step = self.diagnoses.begin(&PodUid::of(pod), step);
        let ran = hook.await;
        drop(step);
        let Err(why) = ran else {
            return Ok(());
        };
        self.events.warning(
            Target::container(pod, name),
            "FailedPostStartHook",
            format!("PostStartHook failed: {why}"),
        );
        let grace = Duration::from_secs(grace_period_seconds(pod).max(0) as u64);
        let stop = format!("Stopping container {name}: its postStart hook failed");
        self.stop(pod, id, name, host, grace.into(), stop).await?;
        Err(Error::PostStart {
            container: name.clone(),
            message: why,
        })
    }

    /// Mounts the container's subPaths (`subPath`, or `subPathExpr` expanded) where nothing in
    /// a container can redirect them, by volumeMount index.
    fn mount_sub_paths(
        &self,
        input: &convert::ContainerInput<'_>,
    ) -> Result<HashMap<usize, PathBuf>, Error> {
        let container = input.container;
        let config_error = |message| Error::Config {
            container: container.name.clone(),
            message,
        };
        let pod_dir = volumes::pod_dir(&self.ctx.root_dir, &PodUid::of(input.pod).0);
        let mounts: Vec<_> = container.volume_mounts.iter().flatten().collect();
        let mut mounted = HashMap::new();
        for (i, sub) in convert::sub_paths(input).map_err(config_error)? {
            let name = &mounts[i].name;
            // (an image volume's subPath is refused by the container config)
            let Some(volume) = input.volumes.get(name).filter(|v| v.image.is_none()) else {
                continue;
            };
            let target = volumes::subpath::target(&pod_dir, name, &container.name, i);
            let path = volumes::subpath::mount(&volume.path, &sub, &target)
                .map_err(|e| config_error(format!("volumeMount {name}: subPath {sub:?}: {e}")))?;
            mounted.insert(i, path);
        }
        Ok(mounted)
    }

    /// The `/var/log/containers` style symlink; a failure only costs log shippers, so it is logged.
    fn link_log(&self, pod: &Pod, container: &str, id: &str, target: &std::path::Path) {
        let link = convert::container_log_link(&self.ctx, pod, container, id);
        let made = std::fs::create_dir_all(&self.ctx.container_logs_dir)
            .and_then(|()| match std::fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .and_then(|()| std::os::unix::fs::symlink(target, &link));
        if let Err(e) = made {
            tracing::warn!(link = %link.display(), error = %e, "cannot create container log symlink");
        }
    }
}

/// With runAsNonRoot, refuses a container whose effective user is root or cannot be told.
fn verify_non_root(
    pod: &Pod,
    c: &k8s_openapi::api::core::v1::Container,
    image: &images::Image,
) -> Result<(), String> {
    let pod_sc = spec(pod).security_context.as_ref();
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if !non_root {
        return Ok(());
    }
    let uid = sc
        .and_then(|s| s.run_as_user)
        .or(pod_sc.and_then(|s| s.run_as_user))
        .or(image.uid);
    match uid {
        Some(0) => Err("container has runAsNonRoot and its user is root (uid 0)".into()),
        Some(_) => Ok(()),
        None if !image.username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root",
            image.username
        )),
        None => Err("container has runAsNonRoot and image will run as root".into()),
    }
}

/// An empty file any container user may write (its termination message).
fn create_world_writable(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// How many of the pod's image volumes the container mounts, and in how many mounts; `None`
/// when it mounts none.
fn image_volume_mounts(pod: &Pod, container: &Container) -> Option<(usize, usize)> {
    let spec = pod.spec.as_ref()?;
    let images: std::collections::HashSet<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.image.is_some())
        .map(|v| v.name.as_str())
        .collect();
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .filter(|name| images.contains(name))
        .collect();
    let volumes: std::collections::HashSet<&&str> = mounts.iter().collect();
    (!mounts.is_empty()).then_some((volumes.len(), mounts.len()))
}
