//! The local admin API (proto/admin.proto) on the unix socket `<root-dir>/nodelet.sock`, for
//! root and the socket's group only: pods, events, logs, exec and attach for the nodelet CLI,
//! and `nodelet debug`'s ephemeral containers, which go to the sync loop.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::{exec, logs};
use crate::runtime::{RuntimeClient, cri};
use crate::{events, status};

/// The generated messages, server and client.
pub mod proto {
    tonic::include_proto!("nodelet.admin.v1");
}

use proto::admin_server::{Admin, AdminServer};
use proto::{exec_input, exec_output};

/// The socket's file name under the root dir.
pub const SOCKET: &str = "nodelet.sock";

/// The socket of the agent using `root_dir`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(SOCKET)
}

/// What the admin API reads, and where `nodelet debug` sends its containers.
#[derive(Clone)]
pub struct Handles {
    pub node_name: String,
    pub statuses: status::Reader,
    pub events: events::Recorder,
    pub diagnoses: status::Diagnoses,
    pub cleanups: status::Cleanups,
    pub runtime: RuntimeClient,
    pub debugger: mpsc::Sender<crate::sync_loop::Debug>,
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn log_status(e: logs::Error) -> Status {
    let message = crate::types::error_chain(&e);
    match e.http_status() {
        404 => Status::not_found(message),
        400 => Status::invalid_argument(message),
        429 => Status::resource_exhausted(message),
        _ => Status::internal(message),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl Handles {
    /// Where the runtime streams the exec (or, without a command, the attach) `start` asks for.
    async fn stream_url(&self, start: &proto::ExecStart) -> Result<String, Status> {
        let found = logs::locate(
            &self.runtime,
            &self.statuses,
            &start.namespace,
            &start.pod,
            Some(&start.container),
            false,
        )
        .await
        .map_err(log_status)?;
        if start.command.is_empty() {
            self.runtime
                .attach(cri::AttachRequest {
                    container_id: found.container_id.clone(),
                    stdin: start.stdin,
                    tty: start.tty,
                    stdout: true,
                    stderr: !start.tty,
                })
                .await
        } else {
            self.runtime
                .exec(cri::ExecRequest {
                    container_id: found.container_id.clone(),
                    cmd: start.command.clone(),
                    tty: start.tty,
                    stdin: start.stdin,
                    stdout: true,
                    stderr: !start.tty,
                })
                .await
        }
        .map_err(|e| {
            Status::failed_precondition(format!(
                "cannot exec in or attach to container {:?} of pod {}: {e}",
                found.container, found.pod
            ))
        })
    }
}

#[tonic::async_trait]
impl Admin for Handles {
    async fn list_pods(
        &self,
        _: Request<proto::ListPodsRequest>,
    ) -> Result<Response<proto::ListPodsResponse>, Status> {
        let mut pods: Vec<_> = self.statuses.list().into_iter().map(|e| e.pod).collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(Response::new(proto::ListPodsResponse {
            pods: pods.iter().map(|p| to_json(&**p)).collect(),
        }))
    }

    async fn get_pod(
        &self,
        req: Request<proto::GetPodRequest>,
    ) -> Result<Response<proto::GetPodResponse>, Status> {
        let req = req.into_inner();
        let entry = self
            .statuses
            .by_name(&req.namespace, &req.name)
            .ok_or_else(|| {
                Status::not_found(format!("pod {}/{} not found", req.namespace, req.name))
            })?;
        let events = self
            .events
            .list(Some((&req.namespace, &req.name)))
            .iter()
            .map(|e| to_json(&e.to_api(&self.node_name)))
            .collect();
        let diagnosis = self.diagnoses.get(&crate::types::PodUid::of(&entry.pod));
        Ok(Response::new(proto::GetPodResponse {
            pod: to_json(&*entry.pod),
            events,
            diagnosis: to_json(&diagnosis),
        }))
    }

    async fn list_events(
        &self,
        req: Request<proto::ListEventsRequest>,
    ) -> Result<Response<proto::ListEventsResponse>, Status> {
        let namespace = req.into_inner().namespace;
        let events = self
            .events
            .list(None)
            .iter()
            .filter(|e| namespace.is_empty() || e.target.namespace == namespace)
            .map(|e| to_json(&e.to_api(&self.node_name)))
            .collect();
        Ok(Response::new(proto::ListEventsResponse { events }))
    }

    async fn list_cleanups(
        &self,
        _: Request<proto::ListCleanupsRequest>,
    ) -> Result<Response<proto::ListCleanupsResponse>, Status> {
        let cleanups = self.cleanups.list().iter().map(to_json).collect();
        Ok(Response::new(proto::ListCleanupsResponse { cleanups }))
    }

    type LogsStream = BoxStream<proto::LogsChunk>;

    async fn logs(
        &self,
        req: Request<proto::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let req = req.into_inner();
        let found = logs::locate(
            &self.runtime,
            &self.statuses,
            &req.namespace,
            &req.pod,
            Some(&req.container),
            req.previous,
        )
        .await
        .map_err(log_status)?;
        // The request's own conventions: zero since and limit, and negative tail, are unset.
        let options = logs::Query {
            follow: req.follow,
            previous: req.previous,
            timestamps: req.timestamps,
            since_seconds: (req.since_seconds != 0).then_some(req.since_seconds),
            since_time: None,
            tail_lines: (req.tail_lines >= 0).then_some(req.tail_lines),
            limit_bytes: (req.limit_bytes != 0).then_some(req.limit_bytes),
        }
        .options()
        .map_err(Status::invalid_argument)?;
        let chunks = logs::open(&self.runtime, &found, options)
            .await
            .map_err(log_status)?;
        let stream = ReceiverStream::new(chunks).map(|data| Ok(proto::LogsChunk { data }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn debug(
        &self,
        req: Request<proto::DebugRequest>,
    ) -> Result<Response<proto::DebugResponse>, Status> {
        let req = req.into_inner();
        let container: k8s_openapi::api::core::v1::EphemeralContainer =
            serde_json::from_str(&req.container)
                .map_err(|e| Status::invalid_argument(format!("not an EphemeralContainer: {e}")))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = crate::sync_loop::Debug {
            namespace: req.namespace,
            pod: req.pod,
            container,
            reply,
        };
        let gone = || Status::unavailable("the agent is shutting down");
        self.debugger.send(request).await.map_err(|_| gone())?;
        match answer.await.map_err(|_| gone())? {
            Ok(()) => Ok(Response::new(proto::DebugResponse {})),
            Err(why) if why.ends_with("not found") => Err(Status::not_found(why)),
            Err(why) => Err(Status::failed_precondition(why)),
        }
    }

    type ExecStream = BoxStream<proto::ExecOutput>;

    async fn exec(
        &self,
        req: Request<Streaming<proto::ExecInput>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let mut inputs = req.into_inner();
        let Some(exec_input::Input::Start(start)) = inputs.message().await?.and_then(|m| m.input)
        else {
            return Err(Status::invalid_argument(
                "the first message of an exec must say what to run",
            ));
        };
        let url = self.stream_url(&start).await?;
        let (in_tx, in_rx) = mpsc::channel(16);
        let (out_tx, mut out_rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(m)) = inputs.message().await {
                let input = match m.input {
                    Some(exec_input::Input::Stdin(data)) => exec::Input::Stdin(data),
                    Some(exec_input::Input::Resize(size)) => exec::Input::Resize {
                        width: u16::try_from(size.width).unwrap_or(u16::MAX),
                        height: u16::try_from(size.height).unwrap_or(u16::MAX),
                    },
                    _ => continue,
                };
                if in_tx.send(input).await.is_err() {
                    break;
                }
            }
        });
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let relay = async {
                while let Some(out) = out_rx.recv().await {
                    let output = match out {
                        exec::Output::Stdout(d) => exec_output::Output::Stdout(d),
                        exec::Output::Stderr(d) => exec_output::Output::Stderr(d),
                        exec::Output::Exit(code) => exec_output::Output::ExitCode(code),
                    };
                    let message = proto::ExecOutput {
                        output: Some(output),
                    };
                    if tx.send(Ok(message)).await.is_err() {
                        break;
                    }
                }
                tx
            };
            let (session, tx) = tokio::join!(exec::run(&url, in_rx, out_tx), relay);
            if let Err(e) = session {
                let _ = tx
                    .send(Err(Status::unavailable(crate::types::error_chain(&e))))
                    .await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Why the socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "another agent already serves {}; stop it, or use another --root-dir",
        .0.display()
    )]
    InUse(PathBuf),
    #[error("cannot serve the socket {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Binds a unix socket of the agent's (replacing a stale one left by a dead agent), mode 0660.
/// It is bound in a directory only root may enter and moved into place once its mode is set:
/// no one else can connect in between (no process-wide umask is changed).
pub async fn bind(path: &Path) -> Result<UnixListener, Error> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt};
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(Error::InUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(io)?;
    let name = path
        .file_name()
        .map_or_else(|| SOCKET.into(), |n| n.to_string_lossy().into_owned());
    let staging = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(io)?;
    let bound = staging.join(&name);
    let listener = UnixListener::bind(&bound)
        .and_then(|l| {
            std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o660))?;
            std::fs::rename(&bound, path)?;
            Ok(l)
        })
        .map_err(io);
    let _ = std::fs::remove_dir_all(&staging);
    listener
}

/// Whether the peer may use the socket: root, or a process whose group is the socket's (an
/// operator may `chgrp` it to let a group in). Read from the kernel (SO_PEERCRED), not from
/// anything the peer says.
fn admitted(stream: &tokio::net::UnixStream, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(peer) = stream.peer_cred() else {
        return false;
    };
    peer.uid() == 0 || std::fs::metadata(path).is_ok_and(|m| m.gid() == peer.gid())
}

/// The connections to `what`, the socket at `path`, of root and of the socket's group, which
/// Go's gRPC clients may use too (see [`super::unix_authority`]); others are refused with a
/// warning.
pub fn admitted_connections(
    listener: UnixListener,
    path: PathBuf,
    what: &'static str,
) -> impl Stream<Item = std::io::Result<super::unix_authority::LocalAuthority>> {
    let admitted = UnixListenerStream::new(listener).filter(move |accepted| {
        let pass = match accepted {
            Ok(stream) if !admitted(stream, &path) => {
                let peer = stream.peer_cred().ok();
                tracing::warn!(uid = ?peer.map(|p| p.uid()), gid = ?peer.map(|p| p.gid()), socket = %path.display(), "refused a connection to {what}: neither root nor the socket's group");
                false
            }
            _ => true,
        };
        std::future::ready(pass)
    });
    admitted.map(|accepted| accepted.map(super::unix_authority::LocalAuthority::new))
}

/// Serves the admin API on `listener` until `cancel`, then removes the socket file.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    handles: Handles,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let incoming = admitted_connections(listener, path.clone(), "the admin socket");
    let served = tonic::transport::Server::builder()
        .add_service(AdminServer::new(handles))
        .serve_with_incoming_shutdown(incoming, cancel.cancelled())
        .await;
    let _ = std::fs::remove_file(&path);
    served
}
