//! DRA device health (ResourceHealthStatus): a driver whose plugin names the DRAResourceHealth
//! service in its registration streams the health of its devices (NodeWatchResources); what
//! it last said of each device, until that report times out, is what the container statuses of
//! the pods holding the device show.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

/// The generated messages of the DRA device health API, v1alpha1.
pub mod proto {
    tonic::include_proto!("v1alpha1");
}

/// The health service, as plugins name it among the versions they serve.
pub const SERVICE: &str = "v1alpha1.DRAResourceHealth";
/// How long a report holds when it names no timeout of its own (upstream's default).
const TIMEOUT: Duration = Duration::from_secs(30);
/// The delay before a stream that ended is opened again (upstream's).
pub const RETRY: Duration = Duration::from_secs(5);
/// The longest message a status carries (the API's limit); longer ones are cut, marked `...`.
const MESSAGE_MAX: usize = 1024;

/// What a driver last said of one device.
#[derive(Clone, Debug)]
struct Report {
    health: &'static str,
    message: String,
    timeout: Duration,
    at: Instant,
}

impl Report {
    /// Whether it says something other than `other`, its time aside.
    fn differs(&self, other: &Report) -> bool {
        (self.health, &self.message, self.timeout) != (other.health, &other.message, other.timeout)
    }
}

/// A device of a driver: its pool and name.
pub type DeviceKey = (String, String);

/// The drivers' latest reports, by driver and device.
#[derive(Debug, Default)]
pub struct Reports(HashMap<String, HashMap<DeviceKey, Report>>);

/// `message` within [`MESSAGE_MAX`] bytes, cut at a character boundary.
fn bounded(message: String) -> String {
    if message.len() <= MESSAGE_MAX {
        return message;
    }
    let mut end = MESSAGE_MAX - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

impl Reports {
    /// Takes `driver`'s report of `devices` at `now`; returns the devices whose health it
    /// changed, with those not in it whose last report timed out (now unknown), as upstream.
    pub fn report(
        &mut self,
        driver: &str,
        devices: Vec<proto::DeviceHealth>,
        now: Instant,
    ) -> Vec<DeviceKey> {
        let known = self.0.entry(driver.to_string()).or_default();
        let mut changed = Vec::new();
        let mut reported = HashSet::new();
        for d in devices {
            let Some(id) = d.device else {
                continue;
            };
            let health = match proto::HealthStatus::try_from(d.health) {
                Ok(proto::HealthStatus::Healthy) => "Healthy",
                Ok(proto::HealthStatus::Unhealthy) => "Unhealthy",
                _ => "Unknown",
            };
            let timeout = u64::try_from(d.health_check_timeout_seconds)
                .ok()
                .filter(|s| *s > 0)
                .map_or(TIMEOUT, Duration::from_secs);
            let new = Report {
                health,
                message: bounded(d.message),
                timeout,
                at: now,
            };
            let key = (id.pool_name, id.device_name);
            if known.get(&key).is_none_or(|old| old.differs(&new)) {
                changed.push(key.clone());
            }
            reported.insert(key.clone());
            known.insert(key, new);
        }
        for (key, old) in known.iter_mut() {
            if !reported.contains(key)
                && old.health != "Unknown"
                && now.duration_since(old.at) > old.timeout
            {
                *old = Report {
                    health: "Unknown",
                    message: String::new(),
                    timeout: old.timeout,
                    at: now,
                };
                changed.push(key.clone());
            }
        }
        changed
    }

    /// Forgets what `driver` said (its stream ended).
    pub fn clear(&mut self, driver: &str) {
        self.0.remove(driver);
    }

    /// The health of `driver`'s device and the message with it: unknown without a report, or
    /// once the last one timed out.
    pub fn get(&self, driver: &str, device: &DeviceKey, now: Instant) -> (&'static str, String) {
        match self.0.get(driver).and_then(|d| d.get(device)) {
            Some(r) if now.duration_since(r.at) <= r.timeout => (r.health, r.message.clone()),
            _ => ("Unknown", String::new()),
        }
    }
}

/// Follows the health stream of the plugin on `channel`, handing each report to `reported`,
/// until it ends; returns why it did.
pub async fn follow(
    channel: Channel,
    mut reported: impl FnMut(Vec<proto::DeviceHealth>) -> bool,
) -> String {
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Err(e) = grpc.ready().await {
        return e.to_string();
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    );
    let request = tonic::Request::new(proto::NodeWatchResourcesRequest {});
    let codec = tonic_prost::ProstCodec::default();
    let mut stream = match grpc.server_streaming(request, path, codec).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status.message().to_string(),
    };
    loop {
        match stream.message().await {
            Ok(Some(report)) => {
                let report: proto::NodeWatchResourcesResponse = report;
                if !reported(report.devices) {
                    return "nodelet stopped".into();
                }
            }
            Ok(None) => return "the plugin ended it".into(),
            Err(status) => return status.message().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, health: proto::HealthStatus, timeout: i64) -> proto::DeviceHealth {
        proto::DeviceHealth {
            device: Some(proto::DeviceIdentifier {
                pool_name: "pool".into(),
                device_name: name.into(),
            }),
            health: health.into(),
            last_updated_time: 0,
            health_check_timeout_seconds: timeout,
            message: format!("{name} says so"),
        }
    }

    fn key(name: &str) -> DeviceKey {
        ("pool".into(), name.into())
    }

    #[test]
    fn reports_hold_until_they_time_out_and_changes_are_told() {
        let mut reports = Reports::default();
        let t0 = Instant::now();
        let first = vec![
            device("a", proto::HealthStatus::Healthy, 0),
            device("b", proto::HealthStatus::Unhealthy, 60),
        ];
        assert_eq!(reports.report("d", first.clone(), t0), [key("a"), key("b")]);
        assert_eq!(
            reports.get("d", &key("a"), t0),
            ("Healthy", "a says so".into())
        );
        assert_eq!(reports.get("d", &key("c"), t0).0, "Unknown");
        assert_eq!(reports.get("other", &key("a"), t0).0, "Unknown");
        assert!(reports.report("d", first, t0).is_empty(), "the same again");
        // a is not reported again: past its 30 s it is unknown, and told; b holds for 60 s.
        let t1 = t0 + Duration::from_secs(31);
        let later = vec![device("b", proto::HealthStatus::Unhealthy, 60)];
        assert_eq!(reports.report("d", later, t1), [key("a")]);
        assert_eq!(reports.get("d", &key("a"), t1), ("Unknown", String::new()));
        let t2 = t1 + Duration::from_secs(61);
        assert_eq!(reports.get("d", &key("b"), t2).0, "Unknown");
        reports.clear("d");
        assert_eq!(reports.get("d", &key("b"), t1).0, "Unknown");
    }

    #[test]
    fn long_messages_are_cut_at_the_apis_limit() {
        assert_eq!(bounded("short".into()), "short");
        let cut = bounded("é".repeat(600));
        assert!(
            cut.len() <= MESSAGE_MAX && cut.ends_with("..."),
            "{}",
            cut.len()
        );
    }
}
