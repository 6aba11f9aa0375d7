//! Upstream's admit handlers' checks that keep no state: a pod for another OS, a pod asking
//! for AppArmor on a host without it, forbidden sysctls, and the resource fit against what is
//! left of the node's allocatable. The sync loop keeps what admitted pods hold and asks these in turn.

use k8s_openapi::api::core::v1::Pod;

/// The annotation prefix of a container's AppArmor profile (before the field existed).
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Does the pod ask for an AppArmor profile other than unconfined (by field or annotation)?
pub fn needs_apparmor(pod: &Pod) -> bool {
    let s = crate::pod::spec(pod);
    let confined = |p: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| {
        p.is_some_and(|p| p.type_ != "Unconfined")
    };
    let by_field = confined(
        s.security_context
            .as_ref()
            .and_then(|c| c.app_armor_profile.as_ref()),
    ) || crate::pod::all_containers(s).any(|c| {
        confined(
            c.security_context
                .as_ref()
                .and_then(|c| c.app_armor_profile.as_ref()),
        )
    });
    let by_annotation = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(APPARMOR_ANNOTATION) && v != "unconfined");
    by_field || by_annotation
}

/// Is AppArmor enabled in this kernel (read once)?
pub fn host_has_apparmor() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.starts_with('Y'))
    })
}

/// Upstream's OS checks: a pod for another OS, by its `kubernetes.io/os` node selector or its
/// `spec.os.name`, is refused on this Linux node.
pub fn os_refusal(pod: &Pod) -> Option<(&'static str, String)> {
    let spec = crate::pod::spec(pod);
    let selected = spec
        .node_selector
        .as_ref()
        .and_then(|s| s.get("kubernetes.io/os"));
    if selected.is_some_and(|os| os != "linux") {
        return Some((
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        ));
    }
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        return Some((
            "PodOSNotSupported",
            "Failed to admit pod as the OS field doesn't match node OS".into(),
        ));
    }
    None
}

/// Upstream's refusal when `requested` on top of `used` exceeds `capacity` (cpu is shown in
/// millicores).
pub fn exceeds(
    reason: &'static str,
    resource: &str,
    requested: f64,
    used: f64,
    capacity: f64,
    millicores: bool,
) -> Option<(&'static str, String)> {
    if used + requested <= capacity + 1e-9 {
        return None;
    }
    // Whole millicores for cpu, bytes for memory, as upstream prints them.
    let show = |v: f64| {
        if millicores {
            ((v * 1000.0).round() as i64).to_string()
        } else {
            (v as i64).to_string()
        }
    };
    Some((
        reason,
        format!(
            "Node didn't have enough resource: {resource}, requested: {}, used: {}, capacity: {}",
            show(requested),
            show(used),
            show(capacity)
        ),
    ))
}

/// Sysctls any pod may set (upstream's safe set).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

fn allowed_by(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Upstream's sysctl admit handler: a pod asking for an unsafe sysctl that
/// `--allowed-unsafe-sysctls` does not allow, or a namespaced sysctl of a namespace it shares
/// with the host, is refused (SysctlForbidden).
pub fn sysctl_refusal(pod: &Pod, allowed_unsafe: &[String]) -> Option<(&'static str, String)> {
    let s = crate::pod::spec(pod);
    let sysctls = s
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref())?;
    let mut problems = Vec::new();
    for sysctl in sysctls {
        let name = sysctl.name.replace('/', ".");
        let safe = SAFE_SYSCTLS.contains(&name.as_str());
        if !safe && !allowed_unsafe.iter().any(|p| allowed_by(p, &name)) {
            problems.push(format!(
                "{name} is unsafe and not allowed by --allowed-unsafe-sysctls"
            ));
        } else if name.starts_with("net.") && s.host_network.unwrap_or(false) {
            problems.push(format!("{name} is not allowed on the host network"));
        } else if name.starts_with("kernel.")
            && s.host_ipc.unwrap_or(false)
            && !name.starts_with("kernel.shm_rmid")
        {
            problems.push(format!("{name} is not allowed with host IPC"));
        }
    }
    (!problems.is_empty()).then(|| {
        let message = format!("forbidden sysctl: {}", problems.join("; "));
        ("SysctlForbidden", message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c", "image": "i"}]);
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn sysctls_are_safe_allowed_or_forbidden() {
        let p = |name: &str, host_network: bool| {
            pod(
                serde_json::json!({"hostNetwork": host_network, "securityContext": {"sysctls": [{"name": name, "value": "1"}]}}),
            )
        };
        assert_eq!(
            sysctl_refusal(&p("net.ipv4.tcp_syncookies", false), &[]),
            None
        );
        assert!(
            sysctl_refusal(&p("net.core.somaxconn", false), &[])
                .is_some_and(|(reason, message)| reason == "SysctlForbidden"
                    && message.contains("net.core.somaxconn"))
        );
        assert_eq!(
            sysctl_refusal(&p("net.core.somaxconn", false), &["net.core.*".into()]),
            None
        );
        assert!(sysctl_refusal(&p("net.ipv4.tcp_syncookies", true), &[]).is_some());
    }
}
