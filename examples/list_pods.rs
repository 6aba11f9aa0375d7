//! Lists the pod sandboxes and containers of a CRI runtime, the way `crictl pods` and
//! `crictl ps -a` would: `cargo run --example list_pods -- unix:///path/to/containerd.sock`.

use std::path::PathBuf;
use std::time::Duration;

use nodelet::runtime::RuntimeClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into());
    let path = PathBuf::from(endpoint.trim_start_matches("unix://"));
    let rt = RuntimeClient::new(&path, &path, Duration::from_secs(10));
    let version = rt.version().await?;
    println!("{} {}", version.runtime_name, version.runtime_version);
    for sandbox in rt.list_sandboxes(None).await? {
        println!(
            "pod {}/{} uid={} attempt={} {:?} id={}",
            sandbox.namespace,
            sandbox.name,
            sandbox.uid,
            sandbox.attempt,
            sandbox.state,
            &sandbox.id[..13.min(sandbox.id.len())]
        );
        for c in rt
            .list_containers(None)
            .await?
            .iter()
            .filter(|c| c.sandbox_id == sandbox.id)
        {
            println!(
                "  container {} attempt={} {:?} id={}",
                c.name,
                c.attempt,
                c.state,
                &c.id[..13.min(c.id.len())]
            );
        }
    }
    Ok(())
}
