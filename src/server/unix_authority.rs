//! Lets Go's gRPC clients talk to the node's unix socket servers. grpc-go dialling a plain
//! socket path sends that path as the HTTP/2 `:authority` (device plugins registering, the
//! pod-resources API's clients), which the HTTP/2 server under tonic refuses as malformed.
//! The upstream kubelet's Go server takes it, so nodelet must too: each connection's incoming
//! header blocks get `:authority: localhost`, the name gRPC gives unix sockets, before the
//! server reads them. An authority names nothing on a unix socket, so nothing is lost.
//!
//! Only literal `:authority` fields are rewritten; a later reference to one through the HPACK
//! dynamic table finds the rewritten value, and the table's entries only shrink, so the server's
//! table never evicts an entry the client still refers to.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

/// The client connection preface's length ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").
const PREFACE: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `:authority`'s index in HPACK's static table.
const AUTHORITY: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

/// A unix socket connection whose incoming HTTP/2 requests name `localhost` as their authority.
pub struct LocalAuthority {
    inner: UnixStream,
    /// Bytes read from the socket and not yet whole frames.
    pending: Vec<u8>,
    /// Bytes ready for the server.
    ready: Vec<u8>,
    preface_done: bool,
    eof: bool,
}

impl LocalAuthority {
    pub fn new(inner: UnixStream) -> LocalAuthority {
        LocalAuthority {
            inner,
            pending: Vec::new(),
            ready: Vec::new(),
            preface_done: false,
            eof: false,
        }
    }

    /// Moves every whole frame (the preface first) from `pending` to `ready`, rewritten.
    fn process(&mut self) {
        if !self.preface_done {
            if self.pending.len() < PREFACE {
                return;
            }
            self.ready.extend(self.pending.drain(..PREFACE));
            self.preface_done = true;
        }
        loop {
            let Some(header) = self.pending.get(..FRAME_HEADER) else {
                return;
            };
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            if self.pending.len() < FRAME_HEADER + len {
                return;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
            let rewritten = (kind == HEADERS && flags & END_HEADERS != 0 && flags & PADDED == 0)
                .then(|| {
                    let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                    let payload = &frame[FRAME_HEADER..];
                    let block = rewrite_block(payload.get(skip..)?)?;
                    let mut out = payload[..skip].to_vec();
                    out.extend(block);
                    Some(out)
                })
                .flatten();
            match rewritten {
                Some(payload) if payload.len() < 1 << 24 => {
                    let len = payload.len();
                    self.ready
                        .extend([(len >> 16) as u8, (len >> 8) as u8, len as u8]);
                    self.ready.extend(&frame[3..FRAME_HEADER]);
                    self.ready.extend(payload);
                }
                _ => self.ready.extend(frame),
            }
        }
    }
}

/// Reads an HPACK integer with an `prefix`-bit prefix at the start of `bytes`: its value and
/// how many bytes it took.
fn integer(bytes: &[u8], prefix: u32) -> Option<(u64, usize)> {
    let mask = (1u64 << prefix) - 1;
    let mut value = u64::from(*bytes.first()?) & mask;
    if value < mask {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (i, b) in bytes.iter().enumerate().skip(1) {
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
    None
}

/// The length of the HPACK string at the start of `bytes`, its length prefix included.
fn string(bytes: &[u8]) -> Option<usize> {
    let (len, used) = integer(bytes, 7)?;
    let end = used.checked_add(usize::try_from(len).ok()?)?;
    (end <= bytes.len()).then_some(end)
}

/// The header block with each literal `:authority` value replaced by `localhost`; `None` when
/// it holds none, or cannot be read (it is then passed on as it is, for the server to judge).
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut changed = false;
    let mut pos = 0;
    while pos < block.len() {
        let rest = &block[pos..];
        let first = rest[0];
        let prefix = if first & 0x80 != 0 {
            let (_, used) = integer(rest, 7)?;
            out.extend(&rest[..used]);
            pos += used;
            continue;
        } else if first & 0xc0 == 0x40 {
            6
        } else if first & 0xe0 == 0x20 {
            let (_, used) = integer(rest, 5)?;
            out.extend(&rest[..used]);
            pos += used;
            continue;
        } else {
            4
        };
        let (name, mut used) = integer(rest, prefix)?;
        if name == 0 {
            used += string(rest.get(used..)?)?;
        }
        let value = string(rest.get(used..)?)?;
        out.extend(&rest[..used]);
        if name == AUTHORITY {
            out.push(LOCALHOST.len() as u8);
            out.extend(LOCALHOST);
            changed = true;
        } else {
            out.extend(&rest[used..used + value]);
        }
        pos += used + value;
    }
    changed.then_some(out)
}

impl AsyncRead for LocalAuthority {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever was left is passed on as it is; the server judges it.
                this.ready = std::mem::take(&mut this.pending);
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.pending.extend_from_slice(read.filled());
                        this.process();
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for LocalAuthority {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for LocalAuthority {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_authority_becomes_localhost_and_the_rest_stays() {
        // :method GET (indexed 2), :authority "/run/x.sock" with incremental indexing (name
        // index 1), :path "/v1" without indexing (name index 4), a new literal name.
        let mut block = vec![0x82, 0x41, 11];
        block.extend(b"/run/x.sock");
        block.extend([0x04, 3]);
        block.extend(b"/v1");
        block.extend([0x00, 1, b'k', 1, b'v']);
        let out = rewrite_block(&block).expect("rewritten");
        let mut expected = vec![0x82, 0x41, 9];
        expected.extend(b"localhost");
        expected.extend([0x04, 3]);
        expected.extend(b"/v1");
        expected.extend([0x00, 1, b'k', 1, b'v']);
        assert_eq!(out, expected);
        assert_eq!(rewrite_block(&[0x82, 0x84]), None);
        assert_eq!(rewrite_block(&[0x41, 30, b'x']), None, "a truncated block");
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 5), Some((1337, 3)));
    }

    #[tokio::test]
    async fn frames_pass_whole_with_the_headers_length_fixed() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut client, server) = UnixStream::pair().expect("a socket pair");
        let mut server = LocalAuthority::new(server);
        let mut headers = vec![0x82, 0x41, 11];
        headers.extend(b"/run/x.sock");
        let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        sent.extend([0, 0, headers.len() as u8, HEADERS, END_HEADERS, 0, 0, 0, 1]);
        sent.extend(&headers);
        sent.extend([0, 0, 2, 0, 0, 0, 0, 0, 1, b'h', b'i']);
        client.write_all(&sent).await.expect("written");
        drop(client);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("read");
        let mut expected = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        expected.extend([0, 0, 12, HEADERS, END_HEADERS, 0, 0, 0, 1, 0x82, 0x41, 9]);
        expected.extend(LOCALHOST);
        expected.extend([0, 0, 2, 0, 0, 0, 0, 0, 1, b'h', b'i']);
        assert_eq!(got, expected);
    }
}
