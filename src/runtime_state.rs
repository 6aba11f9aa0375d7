//! The runtime's own readiness, as upstream's runtime state: every 5 s the CRI Status call's
//! RuntimeReady and NetworkReady conditions. While either is false (or the runtime does not
//! answer), the node is not ready, with upstream's wording.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::runtime::{RuntimeClient, cri};

/// How often the runtime's status is read (upstream: 5 s).
pub const PERIOD: Duration = Duration::from_secs(5);

/// Why the runtime is not ready for pods, as upstream words it; empty when it is. Clone freely.
#[derive(Clone)]
pub struct RuntimeState(watch::Receiver<Vec<String>>);

impl RuntimeState {
    /// The reasons the runtime is not ready, runtime first, then network.
    pub fn errors(&self) -> Vec<String> {
        self.0.borrow().clone()
    }

    /// A state with the given reasons, for tests of its readers.
    #[cfg(test)]
    pub fn fixed(errors: Vec<String>) -> RuntimeState {
        RuntimeState(watch::channel(errors).1)
    }
}

/// A condition as upstream prints it: `Type=bool reason:R message:M`, or `<nil>` when missing.
fn describe(condition: Option<&cri::RuntimeCondition>) -> String {
    condition.map_or_else(
        || "<nil>".into(),
        |c| {
            format!(
                "{}={} reason:{} message:{}",
                c.r#type, c.status, c.reason, c.message
            )
        },
    )
}

/// The not-ready reasons `conditions` give.
pub fn errors(conditions: &[cri::RuntimeCondition]) -> Vec<String> {
    let find = |kind: &str| conditions.iter().find(|c| c.r#type == kind);
    let mut errors = Vec::new();
    let runtime = find("RuntimeReady");
    if !runtime.is_some_and(|c| c.status) {
        errors.push(format!(
            "container runtime not ready: {}",
            describe(runtime)
        ));
    }
    let network = find("NetworkReady");
    if !network.is_some_and(|c| c.status) {
        errors.push(format!(
            "container runtime network not ready: {}",
            describe(network)
        ));
    }
    errors
}

/// Reads the runtime's status every [`PERIOD`] until `cancel`; the state starts as upstream's
/// "not completed yet".
pub fn watch(
    runtime: RuntimeClient,
    cancel: CancellationToken,
) -> (RuntimeState, impl Future<Output = ()>) {
    let (tx, rx) = watch::channel(vec![
        "container runtime status check may not have completed yet".to_string(),
    ]);
    let task = async move {
        loop {
            let now = match runtime.conditions().await {
                Ok(conditions) => errors(&conditions),
                Err(e) => {
                    tracing::debug!(error = %crate::types::error_chain(&e), "cannot read the runtime's status");
                    vec!["container runtime is down".to_string()]
                }
            };
            if now != *tx.borrow() {
                match now.first() {
                    Some(why) => {
                        tracing::warn!(reason = %why, "the container runtime is not ready")
                    }
                    None => tracing::info!("the container runtime is ready"),
                }
                tx.send_replace(now);
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    };
    (RuntimeState(rx), task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, status: bool, reason: &str, message: &str) -> cri::RuntimeCondition {
        cri::RuntimeCondition {
            r#type: kind.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn false_or_missing_conditions_are_reasons_in_upstreams_words() {
        let ready = [
            condition("RuntimeReady", true, "", ""),
            condition("NetworkReady", true, "", ""),
            condition("ContainerdHasNoDeprecationWarnings", false, "", ""),
        ];
        assert!(errors(&ready).is_empty(), "other conditions do not count");
        let no_network = [
            condition("RuntimeReady", true, "", ""),
            condition(
                "NetworkReady",
                false,
                "NetworkPluginNotReady",
                "Network plugin returns error: cni plugin not initialized",
            ),
        ];
        assert_eq!(
            errors(&no_network),
            [
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
            ]
        );
        assert_eq!(
            errors(&[]),
            [
                "container runtime not ready: <nil>",
                "container runtime network not ready: <nil>"
            ]
        );
    }
}
