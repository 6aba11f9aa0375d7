//! CRI fields newer than the CRI bindings nodelet builds on: the container's own stop signal
//! (`ContainerConfig.stop_signal`, field 18, CRI v1.33). Protobuf merges an embedded message
//! field that appears twice, so a CreateContainer request is sent as the bindings encode it,
//! followed by a `config` that holds only the newer field. A runtime that predates the field
//! ignores it as an unknown field.

use k8s_cri::v1 as cri;
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

const CREATE_CONTAINER: &str = "/runtime.v1.RuntimeService/CreateContainer";

/// The part of a CreateContainerRequest that carries only the newer fields.
#[derive(Clone, PartialEq, Message)]
struct CreateContainerAddition {
    #[prost(message, optional, tag = "2")]
    config: Option<ContainerConfigAddition>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerConfigAddition {
    /// The CRI's `Signal` enum value.
    #[prost(int32, tag = "18")]
    stop_signal: i32,
}

/// A request and the stop signal to add to its container config.
struct WithStopSignal(cri::CreateContainerRequest, i32);

struct AdditionCodec;

struct AdditionEncoder;

impl Encoder for AdditionEncoder {
    type Item = WithStopSignal;
    type Error = Status;

    fn encode(&mut self, item: WithStopSignal, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let addition = CreateContainerAddition {
            config: Some(ContainerConfigAddition {
                stop_signal: item.1,
            }),
        };
        item.0
            .encode(dst)
            .and_then(|()| addition.encode(dst))
            .map_err(|e| Status::internal(format!("encode CreateContainer: {e}")))
    }
}

struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = cri::CreateContainerResponse;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<cri::CreateContainerResponse>, Status> {
        cri::CreateContainerResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decode CreateContainer response: {e}")))
    }
}

impl Codec for AdditionCodec {
    type Encode = WithStopSignal;
    type Decode = cri::CreateContainerResponse;
    type Encoder = AdditionEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> AdditionEncoder {
        AdditionEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

/// CreateContainer with the container's stop signal (a CRI `Signal` value).
pub async fn create_container(
    channel: Channel,
    req: cri::CreateContainerRequest,
    stop_signal: i32,
) -> Result<tonic::Response<cri::CreateContainerResponse>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the runtime's channel: {e}")))?;
    grpc.unary(
        tonic::Request::new(WithStopSignal(req, stop_signal)),
        PathAndQuery::from_static(CREATE_CONTAINER),
        AdditionCodec,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a runtime with the newer bindings decodes: the whole config, stop signal included.
    #[derive(Clone, PartialEq, Message)]
    struct NewerRequest {
        #[prost(string, tag = "1")]
        pod_sandbox_id: String,
        #[prost(message, optional, tag = "2")]
        config: Option<NewerConfig>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct NewerConfig {
        #[prost(message, optional, tag = "1")]
        metadata: Option<cri::ContainerMetadata>,
        #[prost(string, tag = "11")]
        log_path: String,
        #[prost(int32, tag = "18")]
        stop_signal: i32,
    }

    #[test]
    fn the_stop_signal_merges_into_the_container_config() {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "c".into(),
                    attempt: 2,
                }),
                log_path: "c/2.log".into(),
                ..Default::default()
            }),
            sandbox_config: None,
        };
        let mut bytes = req.encode_to_vec();
        CreateContainerAddition {
            config: Some(ContainerConfigAddition { stop_signal: 29 }),
        }
        .encode(&mut bytes)
        .expect("encode");
        let seen = NewerRequest::decode(bytes.as_slice()).expect("decode");
        let config = seen.config.expect("config");
        assert_eq!(seen.pod_sandbox_id, "sb");
        assert_eq!(
            config.metadata.map(|m| (m.name, m.attempt)),
            Some(("c".into(), 2))
        );
        assert_eq!(config.log_path, "c/2.log");
        assert_eq!(config.stop_signal, 29, "SIGUSR1");
        let old = cri::CreateContainerRequest::decode(bytes.as_slice()).expect("old bindings");
        assert_eq!(
            old, req,
            "a runtime without the field sees the request unchanged"
        );
    }
}
