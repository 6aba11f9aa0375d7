//! The registration service on the device plugin dir's `kubelet.sock`, and each registered
//! plugin's device list (ListAndWatch) followed until the plugin goes away or registers anew.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Channel;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use super::proto::device_plugin_client::DevicePluginClient;
use super::proto::registration_server::{Registration, RegistrationServer};
use super::proto::{Empty, RegisterRequest};
use super::{DeviceManager, VERSION, is_extended};

/// A registered plugin's client.
pub type Client = DevicePluginClient<Channel>;

/// The registration service.
struct Registrar {
    manager: Arc<DeviceManager>,
    registrations: AtomicU64,
    /// resource -> the token that ends the following of its current plugin.
    following: Mutex<HashMap<String, CancellationToken>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// Why a registration is refused, in the words the plugin logs.
fn refusal(r: &RegisterRequest) -> Option<String> {
    if r.version != VERSION {
        return Some(format!(
            "unsupported device plugin API version {:?}: nodelet speaks {VERSION}",
            r.version
        ));
    }
    if !is_extended(&r.resource_name) {
        return Some(format!(
            "invalid resource name {:?}: an extended resource name (a domain outside kubernetes.io, then a name) is needed",
            r.resource_name
        ));
    }
    let plain = !r.endpoint.is_empty()
        && !r.endpoint.contains('/')
        && r.endpoint != "."
        && r.endpoint != "..";
    if !plain {
        return Some(format!(
            "invalid endpoint {:?}: the name of a socket in the device plugin dir is needed",
            r.endpoint
        ));
    }
    None
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        if let Some(why) = refusal(&r) {
            tracing::warn!(resource = %r.resource_name, endpoint = %r.endpoint, "refused a device plugin: {why}");
            return Err(Status::invalid_argument(why));
        }
        let registration = self.registrations.fetch_add(1, Ordering::Relaxed) + 1;
        let socket = self.manager.dir().join(&r.endpoint);
        let client = DevicePluginClient::new(crate::runtime::unix_channel(&socket));
        let options = r.options.unwrap_or_default();
        let cancel = self.cancel.child_token();
        if let Some(old) = self
            .following
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(r.resource_name.clone(), cancel.clone())
        {
            old.cancel();
        }
        tracing::info!(resource = %r.resource_name, socket = %socket.display(), ?options, "a device plugin registered");
        self.manager
            .registered(&r.resource_name, registration, client.clone(), options);
        let manager = self.manager.clone();
        let resource = r.resource_name;
        self.tracker.spawn(async move {
            tokio::select! {
                () = follow(&manager, &resource, registration, client) => {}
                () = cancel.cancelled() => {}
            }
            manager.gone(&resource, registration);
        });
        Ok(Response::new(Empty {}))
    }
}

/// Follows a plugin's device lists until its stream ends.
async fn follow(manager: &DeviceManager, resource: &str, registration: u64, mut client: Client) {
    let mut stream = match client.list_and_watch(Empty {}).await {
        Ok(stream) => stream.into_inner(),
        Err(e) => {
            tracing::warn!(resource, error = %e, "a device plugin's device list cannot be had");
            return;
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(list)) => {
                tracing::debug!(
                    resource,
                    devices = list.devices.len(),
                    "a device plugin listed its devices"
                );
                manager.listed(resource, registration, list.devices);
            }
            Ok(None) => {
                tracing::warn!(resource, "a device plugin went away");
                return;
            }
            Err(e) => {
                tracing::warn!(resource, error = %e, "a device plugin went away");
                return;
            }
        }
    }
}

/// Serves the registration service on `incoming` (the accepted connections of the socket in
/// the manager's dir) until `cancel`, then removes the socket; the plugins are followed until
/// then too.
pub async fn serve<IO>(
    manager: Arc<DeviceManager>,
    incoming: impl Stream<Item = std::io::Result<IO>> + Send + 'static,
    tracker: TaskTracker,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let socket = manager.dir().join(super::SOCKET);
    let registrar = Registrar {
        manager,
        registrations: AtomicU64::new(0),
        following: Mutex::new(HashMap::new()),
        tracker,
        cancel: cancel.clone(),
    };
    let served = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registrar))
        .serve_with_incoming_shutdown(incoming, cancel.cancelled())
        .await;
    let _ = std::fs::remove_file(&socket);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_names_the_version_an_extended_resource_and_a_socket_in_the_dir() {
        let ok = RegisterRequest {
            version: VERSION.into(),
            endpoint: "dp.sock".into(),
            resource_name: "example.com/dev".into(),
            options: None,
        };
        assert_eq!(refusal(&ok), None);
        for bad in [
            RegisterRequest {
                version: "v1alpha".into(),
                ..ok.clone()
            },
            RegisterRequest {
                resource_name: "cpu".into(),
                ..ok.clone()
            },
            RegisterRequest {
                endpoint: "../../run/x.sock".into(),
                ..ok.clone()
            },
            RegisterRequest {
                endpoint: String::new(),
                ..ok.clone()
            },
        ] {
            assert!(refusal(&bad).is_some(), "{bad:?}");
        }
    }
}
