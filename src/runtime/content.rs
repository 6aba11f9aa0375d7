//! containerd's content service, beside the CRI on the same socket: the downloads in progress
//! (its ongoing ingests), which the CRI does not report. Only the messages nodelet reads are
//! declared (field numbers of containerd's services/content/v1/content.proto).

use prost::Message;
use tonic::Status;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

const LIST_STATUSES: &str = "/containerd.services.content.v1.Content/ListStatuses";

/// The containerd namespace the CRI plugin keeps its images in.
const NAMESPACE: &str = "k8s.io";

#[derive(Clone, PartialEq, Message)]
struct ListStatusesRequest {
    #[prost(string, repeated, tag = "1")]
    filters: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ListStatusesResponse {
    #[prost(message, repeated, tag = "1")]
    statuses: Vec<IngestStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct IngestStatus {
    #[prost(message, optional, tag = "1")]
    started_at: Option<Timestamp>,
    #[prost(message, optional, tag = "2")]
    updated_at: Option<Timestamp>,
    #[prost(string, tag = "3")]
    reference: String,
    #[prost(int64, tag = "4")]
    offset: i64,
    #[prost(int64, tag = "5")]
    total: i64,
}

/// google.protobuf.Timestamp.
#[derive(Clone, PartialEq, Message)]
struct Timestamp {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

fn unix_ns(t: Option<Timestamp>) -> i64 {
    t.map_or(0, |t| {
        t.seconds.saturating_mul(1_000_000_000) + i64::from(t.nanos)
    })
}

/// One download in progress: the runtime's name for it (`layer-sha256:...`), the bytes received
/// of its total (0 when unknown), and when it began and last grew (Unix nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Download {
    pub reference: String,
    pub offset: i64,
    pub total: i64,
    pub started_at: i64,
    pub updated_at: i64,
}

/// The downloads in progress.
pub async fn downloads(channel: Channel) -> Result<Vec<Download>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the runtime's channel: {e}")))?;
    let mut request = tonic::Request::new(ListStatusesRequest::default());
    request.metadata_mut().insert(
        "containerd-namespace",
        NAMESPACE
            .parse()
            .map_err(|_| Status::internal("namespace"))?,
    );
    let response: tonic::Response<ListStatusesResponse> = grpc
        .unary(
            request,
            PathAndQuery::from_static(LIST_STATUSES),
            tonic_prost::ProstCodec::default(),
        )
        .await?;
    Ok(response
        .into_inner()
        .statuses
        .into_iter()
        .map(|s| Download {
            reference: s.reference,
            offset: s.offset,
            total: s.total,
            started_at: unix_ns(s.started_at),
            updated_at: unix_ns(s.updated_at),
        })
        .collect())
}
