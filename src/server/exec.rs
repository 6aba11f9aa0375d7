//! Runs a command in a container through the runtime's streaming server, as a client of its
//! `v4.channel.k8s.io` websocket protocol: one byte of channel (0 stdin, 1 stdout, 2 stderr,
//! 3 the final status, 4 terminal size) before each message's data. The admin socket's exec
//! uses it; the HTTP API proxies clients to the streaming server instead.

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// The subprotocol spoken with the streaming server.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// What goes into the command.
#[derive(Debug)]
pub enum Input {
    Stdin(Vec<u8>),
    Resize { width: u16, height: u16 },
}

/// What comes out of it; `Exit` is last.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid streaming URL {url:?} from the runtime: {why}")]
    Url { url: String, why: String },
    #[error("cannot reach the runtime's streaming server at {url}")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the runtime's streaming server refused the session")]
    Handshake(#[source] Box<tokio_tungstenite::tungstenite::Error>),
}

/// The exit code in the status message of channel 3 (a metav1.Status as JSON): 0 on Success,
/// the ExitCode cause on NonZeroExitCode, and -1 with the message on stderr for other failures.
fn exit_code(status: &[u8]) -> (i32, Option<String>) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(status) else {
        return (-1, Some(String::from_utf8_lossy(status).into_owned()));
    };
    if v["status"] == "Success" {
        return (0, None);
    }
    let code = v["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["reason"] == "ExitCode")
        .and_then(|c| c["message"].as_str())
        .and_then(|m| m.parse::<i32>().ok());
    match code {
        Some(code) => (code, None),
        None => (-1, v["message"].as_str().map(str::to_string)),
    }
}

/// Opens the session at `url` (from CRI Exec) and relays `input` into it and its output out,
/// until the command ends or `output` is dropped.
pub async fn run(
    url: &str,
    mut input: mpsc::Receiver<Input>,
    output: mpsc::Sender<Output>,
) -> Result<(), Error> {
    let ws = connect(url).await?;
    let (mut sink, mut stream) = ws.split();
    let mut input_open = true;
    loop {
        tokio::select! {
            got = input.recv(), if input_open => {
                let Some(frame) = got.map(frame) else {
                    input_open = false;
                    continue;
                };
                if sink.send(Message::Binary(frame.into())).await.is_err() {
                    input_open = false;
                }
            }
            message = stream.next() => {
                let data = match message {
                    Some(Ok(Message::Binary(data))) => data.to_vec(),
                    Some(Ok(Message::Text(text))) => text.as_bytes().to_vec(),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                        // The session ended without a status: report what we know.
                        let _ = output.send(Output::Exit(-1)).await;
                        return Ok(());
                    }
                    Some(Ok(_)) => continue,
                };
                let Some((channel, data)) = data.split_first() else { continue };
                let out = match channel {
                    1 => Output::Stdout(data.to_vec()),
                    2 => Output::Stderr(data.to_vec()),
                    3 => {
                        let (code, message) = exit_code(data);
                        if let Some(m) = message {
                            let _ = output.send(Output::Stderr(format!("{m}\n").into_bytes())).await;
                        }
                        let _ = output.send(Output::Exit(code)).await;
                        let _ = sink.close().await;
                        return Ok(());
                    }
                    _ => continue,
                };
                if data.is_empty() {
                    continue;
                }
                if output.send(out).await.is_err() {
                    let _ = sink.close().await;
                    return Ok(());
                }
            }
        }
    }
}

/// Opens the runtime's streaming session at `url`, speaking the channel protocol.
async fn connect(
    url: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, Error> {
    // The runtime hands out http:// URLs; the same server speaks websocket on them.
    let ws_url = match url.strip_prefix("http://") {
        Some(rest) => format!("ws://{rest}"),
        None => url.to_string(),
    };
    let mut request = ws_url.into_client_request().map_err(|e| Error::Url {
        url: url.into(),
        why: e.to_string(),
    })?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(PROTOCOL));
    let uri = request.uri();
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let addr = format!("{host}:{}", uri.port_u16().unwrap_or(80));
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|source| Error::Connect {
            url: url.into(),
            source,
        })?;
    let (ws, _) = tokio_tungstenite::client_async(request, tcp)
        .await
        .map_err(|e| Error::Handshake(Box::new(e)))?;
    Ok(ws)
}

/// The frame that carries one input: stdin on channel 0, a terminal resize on channel 4.
fn frame(input: Input) -> Vec<u8> {
    match input {
        Input::Stdin(data) => [vec![0u8], data].concat(),
        Input::Resize { width, height } => {
            let size = serde_json::json!({"Width": width, "Height": height});
            [vec![4u8], size.to_string().into_bytes()].concat()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_channel_gives_the_exit_code() {
        assert_eq!(
            exit_code(br#"{"metadata":{},"status":"Success"}"#),
            (0, None)
        );
        let failed = br#"{"status":"Failure","reason":"NonZeroExitCode",
            "details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_code(failed), (3, None));
        let other = br#"{"status":"Failure","message":"executable file not found"}"#;
        assert_eq!(
            exit_code(other),
            (-1, Some("executable file not found".into()))
        );
    }
}
