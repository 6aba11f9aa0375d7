//! kubectl's ways of showing pods and events: its tables (columns three spaces apart), its
//! STATUS column rules, its ages, and `describe`'s layout.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, Event, Pod, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Rows as kubectl's tabwriter lays them out.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<w$}   ", w = widths[i]);
            }
        }
        out.push('\n');
    }
    out
}

/// kubectl's short human durations: 45s, 3m20s, 5h, 2d4h...
pub fn age(since: Option<Timestamp>) -> String {
    let Some(since) = since else {
        return "<unknown>".into();
    };
    let secs = (crate::types::now().as_second() - since.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 && s % 60 == 0 => format!("{m}m"),
        s if s < 600 => format!("{m}m{}s", s % 60),
        s if s < 3 * 3600 => format!("{m}m"),
        s if s < 8 * 3600 && m % 60 == 0 => format!("{h}h"),
        s if s < 8 * 3600 => format!("{h}h{}m", m % 60),
        s if s < 48 * 3600 => format!("{h}h"),
        s if s < 8 * 86400 && h % 24 == 0 => format!("{d}d"),
        s if s < 8 * 86400 => format!("{d}d{}h", h % 24),
        s if s < 365 * 2 * 86400 => format!("{d}d"),
        _ => format!("{}y", d / 365),
    }
}

fn time(t: &Option<Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

fn pod_age(pod: &Pod) -> String {
    age(time(&pod.metadata.creation_timestamp)
        .or_else(|| pod.status.as_ref().and_then(|s| time(&s.start_time))))
}

fn statuses(pod: &Pod, init: bool) -> Vec<ContainerStatus> {
    let s = pod.status.clone().unwrap_or_default();
    if init {
        s.init_container_statuses.unwrap_or_default()
    } else {
        s.container_statuses.unwrap_or_default()
    }
}

/// The STATUS column, by kubectl's rules: the pod's reason or phase, overridden by an init
/// container still at work or failed, then by a container's waiting or terminated reason.
pub fn pod_status(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let mut reason = status
        .reason
        .clone()
        .or(status.phase.clone())
        .unwrap_or_else(|| "Unknown".into());
    let inits = statuses(pod, true);
    let mut initializing = false;
    for (i, c) in inits.iter().enumerate() {
        let state = c.state.clone().unwrap_or_default();
        if let Some(t) = &state.terminated
            && t.exit_code == 0
        {
            continue;
        }
        if state.running.is_some() && c.started == Some(true) {
            // A running sidecar counts as done initializing.
            continue;
        }
        initializing = true;
        reason = match (&state.terminated, &state.waiting) {
            (Some(t), _) => match &t.reason {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => format!("Init:ExitCode:{}", t.exit_code),
            },
            (_, Some(w)) if w.reason.as_deref().is_some_and(|r| r != "PodInitializing") => {
                format!("Init:{}", w.reason.clone().unwrap_or_default())
            }
            _ => format!("Init:{i}/{}", inits.len()),
        };
        break;
    }
    if initializing {
        return reason;
    }
    let mut has_running = false;
    for c in statuses(pod, false).iter().rev() {
        let state = c.state.clone().unwrap_or_default();
        if let Some(w) = &state.waiting
            && let Some(r) = w.reason.as_ref().filter(|r| !r.is_empty())
        {
            reason = r.clone();
        } else if let Some(t) = &state.terminated {
            reason = match &t.reason {
                Some(r) if !r.is_empty() => r.clone(),
                _ if t.signal.unwrap_or(0) != 0 => format!("Signal:{}", t.signal.unwrap_or(0)),
                _ => format!("ExitCode:{}", t.exit_code),
            };
        } else if state.running.is_some() && c.ready {
            has_running = true;
        }
    }
    if reason == "Completed" && has_running {
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        reason = if ready { "Running" } else { "NotReady" }.into();
    }
    reason
}

fn restarts(pod: &Pod) -> String {
    let all: Vec<ContainerStatus> = statuses(pod, false);
    let count: i32 = all.iter().map(|c| c.restart_count).sum();
    let last = all
        .iter()
        .filter_map(|c| {
            c.last_state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .clone()
        })
        .map(|t| t.0)
        .max();
    match last {
        Some(t) if count > 0 => format!("{count} ({} ago)", age(Some(t))),
        _ => count.to_string(),
    }
}

fn ready(pod: &Pod) -> String {
    let all = statuses(pod, false);
    let total = pod.spec.as_ref().map_or(all.len(), |s| s.containers.len());
    let ready = all.iter().filter(|c| c.ready).count();
    format!("{ready}/{total}")
}

/// `get pods` in the requested output format.
pub fn pods(
    pods: &[Pod],
    output: Option<&str>,
    namespaces: bool,
    single: bool,
) -> Result<String, String> {
    match output {
        Some("json") | Some("yaml") => {
            let value = if single && pods.len() == 1 {
                serde_json::to_value(&pods[0])
            } else {
                serde_json::to_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                    "items": pods,
                }))
            }
            .map_err(|e| e.to_string())?;
            if output == Some("json") {
                serde_json::to_string_pretty(&value)
                    .map(|s| s + "\n")
                    .map_err(|e| e.to_string())
            } else {
                serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())
            }
        }
        None | Some("wide") => {
            if pods.is_empty() {
                return Ok(String::new());
            }
            let wide = output == Some("wide");
            let mut header = vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE"];
            if namespaces {
                header.insert(0, "NAMESPACE");
            }
            if wide {
                header.extend(["IP", "NODE", "SOURCE"]);
            }
            let mut rows = vec![header.into_iter().map(String::from).collect()];
            for p in pods {
                let mut row = vec![
                    p.metadata.name.clone().unwrap_or_default(),
                    ready(p),
                    pod_status(p),
                    restarts(p),
                    pod_age(p),
                ];
                if namespaces {
                    row.insert(0, p.metadata.namespace.clone().unwrap_or_default());
                }
                if wide {
                    let status = p.status.clone().unwrap_or_default();
                    row.push(status.pod_ip.unwrap_or_else(|| "<none>".into()));
                    row.push(
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_else(|| "<none>".into()),
                    );
                    row.push(
                        p.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(crate::pod::ANNOTATION_CONFIG_SOURCE))
                            .cloned()
                            .unwrap_or_else(|| "<none>".into()),
                    );
                }
                rows.push(row);
            }
            Ok(table(&rows))
        }
        Some(other) => Err(format!(
            "unable to match a printer suitable for the output format {other:?}, allowed formats are: json, wide, yaml"
        )),
    }
}

fn event_object(e: &Event) -> String {
    let o = &e.involved_object;
    let kind = o.kind.as_deref().unwrap_or("Pod").to_ascii_lowercase();
    let name = format!("{kind}/{}", o.name.clone().unwrap_or_default());
    match &o.field_path {
        Some(f) => format!("{name} ({f})"),
        None => name,
    }
}

fn event_age(e: &Event) -> String {
    let last = age(time(&e.last_timestamp));
    match e.count {
        Some(n) if n > 1 => format!("{last} (x{n} over {})", age(time(&e.first_timestamp))),
        _ => last,
    }
}

/// `get events`' table.
pub fn events(events: &[Event], namespaces: bool) -> String {
    let mut header = vec!["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for e in events {
        let mut row = vec![
            age(time(&e.last_timestamp)),
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            event_object(e),
            e.message.clone().unwrap_or_default(),
        ];
        if namespaces {
            row.insert(0, e.metadata.namespace.clone().unwrap_or_default());
        }
        rows.push(row);
    }
    table(&rows)
}

fn state_lines(out: &mut String, title: &str, state: &ContainerState) {
    if let Some(r) = &state.running {
        let _ = writeln!(out, "    {title:<16}Running");
        if let Some(t) = &r.started_at {
            let _ = writeln!(out, "      Started:      {}", t.0);
        }
    } else if let Some(t) = &state.terminated {
        let _ = writeln!(out, "    {title:<16}Terminated");
        let _ = writeln!(
            out,
            "      Reason:       {}",
            t.reason.clone().unwrap_or_default()
        );
        if let Some(m) = &t.message {
            let _ = writeln!(out, "      Message:      {}", m.trim_end());
        }
        let _ = writeln!(out, "      Exit Code:    {}", t.exit_code);
        if let Some(s) = &t.started_at {
            let _ = writeln!(out, "      Started:      {}", s.0);
        }
        if let Some(f) = &t.finished_at {
            let _ = writeln!(out, "      Finished:     {}", f.0);
        }
    } else if let Some(w) = &state.waiting {
        let _ = writeln!(out, "    {title:<16}Waiting");
        if let Some(r) = &w.reason {
            let _ = writeln!(out, "      Reason:       {r}");
        }
        if let Some(m) = &w.message {
            let _ = writeln!(out, "      Message:      {m}");
        }
    }
}

fn map_lines(
    out: &mut String,
    title: &str,
    map: Option<&std::collections::BTreeMap<String, String>>,
) {
    let entries: Vec<String> = map
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if entries.is_empty() {
        let _ = writeln!(out, "{title:<14}<none>");
    }
    for (i, e) in entries.iter().enumerate() {
        let lead = if i == 0 { title } else { "" };
        let _ = writeln!(out, "{lead:<14}{e}");
    }
}

/// `describe pod`: metadata, status, each container's state, conditions and recent events.
pub fn describe(
    pod: &Pod,
    events_of_pod: &[Event],
    diagnosis: &crate::status::Diagnosis,
) -> String {
    let mut out = String::new();
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    describe_header(&mut out, pod, &spec, &status);
    for (title, init) in [("Init Containers:", true), ("Containers:", false)] {
        let list = if init {
            spec.init_containers.clone().unwrap_or_default()
        } else {
            spec.containers.clone()
        };
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}");
        let all = statuses(pod, init);
        for c in &list {
            describe_container(&mut out, c, all.iter().find(|s| s.name == c.name));
        }
    }
    let conditions = status.conditions.clone().unwrap_or_default();
    if !conditions.is_empty() {
        let _ = writeln!(out, "Conditions:");
        let mut rows = vec![vec!["  Type".to_string(), "Status".to_string()]];
        for c in &conditions {
            rows.push(vec![format!("  {}", c.type_), c.status.clone()]);
        }
        out.push_str(&table(&rows));
    }
    diagnosis_lines(&mut out, diagnosis);
    describe_events(&mut out, events_of_pod);
    out
}

/// The pod's own fields, from its name to its QoS class.
fn describe_header(out: &mut String, pod: &Pod, spec: &PodSpec, status: &PodStatus) {
    let m = &pod.metadata;
    let field = |out: &mut String, k: &str, v: &str| {
        let _ = writeln!(out, "{:<14}{v}", format!("{k}:"));
    };
    field(out, "Name", m.name.as_deref().unwrap_or_default());
    field(out, "Namespace", m.namespace.as_deref().unwrap_or_default());
    if let Some(p) = &spec.priority {
        field(out, "Priority", &p.to_string());
    }
    let node = match (&spec.node_name, &status.host_ip) {
        (Some(n), Some(ip)) => format!("{n}/{ip}"),
        (Some(n), None) => n.clone(),
        _ => "<none>".into(),
    };
    field(out, "Node", &node);
    if let Some(t) = &status.start_time {
        field(out, "Start Time", &t.0.to_string());
    }
    map_lines(out, "Labels:", m.labels.as_ref());
    map_lines(out, "Annotations:", m.annotations.as_ref());
    field(out, "Status", &pod_status(pod));
    if let Some(r) = &status.reason {
        field(out, "Reason", r);
    }
    if let Some(msg) = &status.message {
        field(out, "Message", msg);
    }
    field(out, "IP", status.pod_ip.as_deref().unwrap_or("<none>"));
    if let Some(q) = &status.qos_class {
        field(out, "QoS Class", q);
    }
}

/// One container of the pod, with its status `s` when it has one.
fn describe_container(out: &mut String, c: &Container, s: Option<&ContainerStatus>) {
    let _ = writeln!(out, "  {}:", c.name);
    let line = |out: &mut String, k: &str, v: &str| {
        let _ = writeln!(out, "    {:<16}{v}", format!("{k}:"));
    };
    if let Some(id) = s.and_then(|s| s.container_id.clone()) {
        line(out, "Container ID", &id);
    }
    line(out, "Image", c.image.as_deref().unwrap_or_default());
    if let Some(id) = s.map(|s| s.image_id.clone()).filter(|i| !i.is_empty()) {
        line(out, "Image ID", &id);
    }
    let ports: Vec<String> = c
        .ports
        .iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}",
                p.container_port,
                p.protocol.as_deref().unwrap_or("TCP")
            )
        })
        .collect();
    line(
        out,
        "Port",
        &if ports.is_empty() {
            "<none>".into()
        } else {
            ports.join(", ")
        },
    );
    if let Some(cmd) = &c.command {
        line(out, "Command", &cmd.join(" "));
    }
    if let Some(args) = &c.args {
        line(out, "Args", &args.join(" "));
    }
    if let Some(s) = s {
        if let Some(state) = &s.state {
            state_lines(out, "State:", state);
        }
        if let Some(last) = s.last_state.as_ref().filter(|l| l.terminated.is_some()) {
            state_lines(out, "Last State:", last);
        }
        line(out, "Ready", if s.ready { "True" } else { "False" });
        line(out, "Restart Count", &s.restart_count.to_string());
    }
}

/// The pod's events, as kubectl lists them under a description.
fn describe_events(out: &mut String, events_of_pod: &[Event]) {
    if events_of_pod.is_empty() {
        let _ = writeln!(out, "Events:       <none>");
        return;
    }
    let _ = writeln!(out, "Events:");
    let mut rows = vec![
        ["  Type", "Reason", "Age", "From", "Message"]
            .map(String::from)
            .to_vec(),
        ["  ----", "------", "----", "----", "-------"]
            .map(String::from)
            .to_vec(),
    ];
    for e in events_of_pod {
        rows.push(vec![
            format!("  {}", e.type_.clone().unwrap_or_default()),
            e.reason.clone().unwrap_or_default(),
            event_age(e),
            "kubelet".into(),
            e.message.clone().unwrap_or_default(),
        ]);
    }
    out.push_str(&table(&rows));
}

/// What ended pods left on the node, one row per thing left.
pub fn cleanups(cleanups: &[crate::status::Cleanup]) -> String {
    if cleanups.is_empty() {
        return "No leftovers: every ended pod is cleaned up.\n".into();
    }
    let mut rows = vec![
        ["POD", "UID", "SINCE", "ATTEMPTS", "LEFT"]
            .map(String::from)
            .to_vec(),
    ];
    for c in cleanups {
        for left in &c.left {
            rows.push(vec![
                c.pod.clone(),
                c.uid.clone(),
                age(Some(c.since.0)),
                c.attempts.to_string(),
                left.clone(),
            ]);
        }
    }
    table(&rows)
}

/// What the node is doing about the pod (nodelet's own, beyond kubectl's): what its sync
/// waits on and for how long, its last sync error, and its probes' latest results.
fn diagnosis_lines(out: &mut String, d: &crate::status::Diagnosis) {
    if !d.waiting_on.is_empty() {
        let _ = writeln!(out, "Waiting On:");
        for step in &d.waiting_on {
            let _ = writeln!(out, "  {} (for {})", step.what, age(Some(step.since.0)));
            if let Some(progress) = &step.progress {
                let _ = writeln!(out, "    {progress}");
            }
        }
    }
    if let Some(e) = &d.last_error {
        let _ = writeln!(
            out,
            "Last Sync Error: {} ({} ago)",
            e.what,
            age(Some(e.since.0))
        );
    }
    if !d.probes.is_empty() {
        let _ = writeln!(out, "Probes:");
        let mut rows = vec![
            ["  Container", "Probe", "Result", "Last", "Message"]
                .map(String::from)
                .to_vec(),
        ];
        for p in &d.probes {
            let result = if p.success { "success" } else { "failure" };
            rows.push(vec![
                format!("  {}", p.container),
                p.probe.clone(),
                format!("{result} x{}", p.times),
                format!("{} ago", age(Some(p.at.0))),
                p.message.clone().unwrap_or_default(),
            ]);
        }
        out.push_str(&table(&rows));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "app"}, {"name": "side"}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_status_column_follows_kubectl() {
        let running = pod(
            serde_json::json!({"phase": "Running", "containerStatuses": [
                {"name": "app", "ready": true, "restartCount": 0, "image": "", "imageID": "", "state": {"running": {}}},
                {"name": "side", "ready": false, "restartCount": 3, "image": "", "imageID": "",
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]}),
        );
        assert_eq!(pod_status(&running), "CrashLoopBackOff");
        assert_eq!(ready(&running), "1/2");
        let init = pod(
            serde_json::json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "ready": false, "restartCount": 0, "image": "", "imageID": "", "state": {"running": {}}},
            ]}),
        );
        assert_eq!(pod_status(&init), "Init:0/1");
        let exited = pod(serde_json::json!({"phase": "Failed", "containerStatuses": [
            {"name": "app", "ready": false, "restartCount": 0, "image": "", "imageID": "",
             "state": {"terminated": {"exitCode": 3}}},
        ]}));
        assert_eq!(pod_status(&exited), "ExitCode:3");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let ago = |s: i64| {
            age(Some(
                crate::types::now() - k8s_openapi::jiff::SignedDuration::from_secs(s),
            ))
        };
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(200), "3m20s");
        assert_eq!(ago(3600 * 5 + 60), "5h1m");
        assert_eq!(ago(86400 * 3), "3d");
    }

    #[test]
    fn tables_pad_columns_three_spaces_apart() {
        let rows = vec![
            vec!["NAME".to_string(), "READY".to_string()],
            vec!["a-long-name".to_string(), "1/1".to_string()],
        ];
        assert_eq!(table(&rows), "NAME          READY\na-long-name   1/1\n");
    }
}
