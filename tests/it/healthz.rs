//! The healthz endpoint of a running agent.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bed::{Node, eventually};

async fn get(port: u16, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

#[tokio::test]
async fn healthz_answers_ok_on_its_port() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let port_text = port.to_string();
    let node = Node::start("healthz", &["--healthz-port", &port_text]).await;
    let reply = eventually("healthz to answer", Duration::from_secs(30), || {
        get(port, "/healthz")
    })
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("ok"), "{reply}");
    node.finish().await;
}
