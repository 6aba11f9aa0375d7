//! The node's HTTP endpoints: healthz and the read-only API, over real HTTP on free ports.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bed::{FOREVER, Node, eventually, free_port, pod_yaml, prometheus_families};

/// (status code, body) of a GET on loopback.
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((code, body))
}

pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[tokio::test]
async fn healthz_answers_with_its_checks() {
    let port = free_port();
    let node = Node::start("healthz", &["--healthz-port", &port.to_string()]).await;
    let (code, body) = eventually("healthz to answer", Duration::from_secs(30), || {
        get(port, "/healthz")
    })
    .await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = get(port, "/healthz?verbose").await.unwrap();
    assert_eq!(code, 200);
    for check in [
        "[+]ping ok",
        "[+]syncloop ok",
        "[+]pleg ok",
        "[+]runtime ok",
        "healthz check passed",
    ] {
        assert!(body.contains(check), "{check} missing in {body}");
    }
    assert_eq!(
        get(port, "/healthz/pleg").await.unwrap(),
        (200, "ok".to_string())
    );
    assert_eq!(get(port, "/healthz/nothing").await.unwrap().0, 404);
    node.finish().await;
}

/// Checks every sample line of the Prometheus text format: `name{labels} value`.
fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            assert!(
                matches!(words.first(), Some(&"HELP") | Some(&"TYPE")),
                "bad comment {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "bad labels in {line:?}"
            );
        }
        samples.push((series.to_string(), value));
    }
    samples
}

#[tokio::test]
async fn the_read_only_api_serves_pods_and_metrics() {
    let port = free_port();
    let node = Node::start(
        "readonly",
        &[
            "--read-only-port",
            &port.to_string(),
            "--address",
            "127.0.0.1",
        ],
    )
    .await;
    let probed = pod_yaml("web", &[("c", FOREVER)], "").replace(
        "    command:",
        "    readinessProbe: {exec: {command: ['true']}, periodSeconds: 1}\n    command:",
    );
    node.write_manifest("web.yaml", &probed);
    node.wait_running("web", 1).await;
    let st = node
        .wait_status("web", "Running and ready", |s| {
            s.phase.as_deref() == Some("Running")
                && s.container_statuses.as_ref().is_some_and(|c| c[0].ready)
        })
        .await;

    let (code, body) = eventually("the read-only API", Duration::from_secs(30), || {
        get(port, "/pods")
    })
    .await;
    assert_eq!(code, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    let pod = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == node.pod_name("web"))
        .expect("the pod");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["podIP"], serde_json::json!(st.pod_ip));

    let (_, body) = get(port, "/runningpods/").await.unwrap();
    let running: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(running["items"][0]["spec"]["containers"][0]["name"], "c");

    let (code, body) = get(port, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    let samples = parse_prometheus(&body);
    let value = |series: &str| samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v);
    assert_eq!(value("kubelet_running_pods"), Some(1.0), "{body}");
    assert_eq!(
        value("kubelet_running_containers{container_state=\"running\"}"),
        Some(1.0)
    );
    assert!(
        value("kubelet_started_containers_total{container_type=\"container\"}").unwrap_or(0.0)
            >= 1.0
    );
    assert!(
        value("kubelet_runtime_operations_total{operation_type=\"RunPodSandbox\"}").unwrap_or(0.0)
            >= 1.0
    );
    for family in [
        "kubelet_pleg_relist_duration_seconds_count",
        "kubelet_pod_worker_duration_seconds_count{operation_type=\"sync\"}",
        "kubelet_pod_start_duration_seconds_count",
        "process_resident_memory_bytes",
    ] {
        assert!(value(family).is_some(), "{family} missing in {body}");
    }
    // The pod's start, as upstream counts its steps: one sandbox run with the default handler,
    // a worker started for a pod of one container, its cgroup made, and no error; the topology
    // manager admitted it (under the none policy, which aligns nothing), and its container's
    // log directory is measured.
    let uid = pod["metadata"]["uid"].as_str().expect("a UID");
    let log_series = format!(
        "kubelet_container_log_filesystem_used_bytes{{uid=\"{uid}\",namespace=\"default\",pod=\"{}\",container=\"c\"}}",
        node.pod_name("web")
    );
    for (series, least) in [
        (
            "kubelet_run_podsandbox_duration_seconds_count{runtime_handler=\"\"}",
            1.0,
        ),
        ("kubelet_containers_per_pod_count_bucket{le=\"1\"}", 1.0),
        ("kubelet_pod_worker_start_duration_seconds_count", 1.0),
        (
            "kubelet_cgroup_manager_duration_seconds_count{operation_type=\"create\"}",
            1.0,
        ),
        ("kubelet_pleg_last_seen_seconds", 1.0),
        ("kubelet_topology_manager_admission_requests_total", 1.0),
        ("kubelet_topology_manager_admission_duration_ms_count", 1.0),
    ] {
        assert!(
            value(series).is_some_and(|v| v >= least),
            "{series} below {least} in {body}"
        );
    }
    assert!(
        value(&log_series).is_some(),
        "{log_series} missing in {body}"
    );
    // Under the managers' none policies nothing is pinned, refused or pooled.
    for series in [
        "kubelet_topology_manager_admission_errors_total",
        "kubelet_memory_manager_pinning_requests_total",
        "kubelet_cpu_manager_pinning_requests_total",
        "kubelet_cpu_manager_shared_pool_size_millicores",
    ] {
        assert_eq!(value(series), Some(0.0), "{series} in {body}");
    }
    assert_eq!(
        value("kubelet_started_pods_errors_total"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        value("kubelet_pod_in_progress_resizes"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        value(&format!("kubelet_node_name{{node=\"{}\"}}", node.name)),
        Some(1.0),
        "{body}"
    );
    assert!(
        value("kubelet_cgroup_version").is_some_and(|v| v == 1.0 || v == 2.0),
        "{body}"
    );
    assert!(body.contains("\nkubernetes_build_info{"), "{body}");
    // The server counts its requests as upstream's does: the earlier ones served, this scrape
    // still in flight.
    let http = |path: &str| {
        format!(
            "{{method=\"GET\",path=\"{path}\",server_type=\"readonly\",long_running=\"false\"}}"
        )
    };
    for (series, least) in [
        (format!("kubelet_http_requests_total{}", http("pods")), 1.0),
        (format!("kubelet_http_requests_total{}", http("runningpods")), 1.0),
        (format!("kubelet_http_requests_duration_seconds_count{}", http("pods")), 1.0),
        (format!("kubelet_http_inflight_requests{}", http("metrics")), 1.0),
        // The image was there (the test bed loads it) and its policy is IfNotPresent.
        (
            "kubelet_image_manager_ensure_image_requests_total{pull_policy=\"ifnotpresent\",present_locally=\"true\",pull_required=\"false\"}".into(),
            1.0,
        ),
        ("kubelet_metrics_provider{provider=\"cri\"}".into(), 1.0),
    ] {
        assert!(
            value(&series).is_some_and(|v| v >= least),
            "{series} below {least} in {body}"
        );
    }
    // A standalone node never registers: its startup durations stay zero.
    assert_eq!(
        value("kubelet_node_startup_duration_seconds"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(value("kubelet_mirror_pods"), Some(0.0), "{body}");
    // Housekeeping (every 2 s) counts the pods: the one static pod is desired, active and
    // synced by its worker.
    let counts = [
        "kubelet_desired_pods{static=\"true\"} 1",
        "kubelet_desired_pods{static=\"\"} 0",
        "kubelet_active_pods{static=\"true\"} 1",
        "kubelet_working_pods{lifecycle=\"sync\",config=\"desired\",static=\"true\"} 1",
        "kubelet_working_pods{lifecycle=\"terminating\",config=\"orphan\",static=\"true\"} 0",
    ];
    eventually("the pod counts", Duration::from_secs(10), || async {
        let (_, body) = get(port, "/metrics").await?;
        counts
            .iter()
            .all(|line| body.lines().any(|l| l == *line))
            .then_some(())
    })
    .await;
    // Prometheus's own parser reads every endpoint; each family has its type and help.
    for path in [
        "/metrics",
        "/metrics/probes",
        "/metrics/resource",
        "/metrics/cadvisor",
    ] {
        let (_, text) = get(port, path).await.unwrap();
        let families = prometheus_families(&text)
            .unwrap_or_else(|e| panic!("Prometheus cannot read {path}: {e}\n{text}"));
        for (name, f) in &families {
            assert!(!f.help.is_empty(), "{path}: {name} has no help");
        }
        if path == "/metrics" {
            for (name, kind) in [
                ("kubelet_running_pods", "GAUGE"),
                ("kubelet_started_pods_total", "COUNTER"),
                ("kubelet_pod_worker_duration_seconds", "HISTOGRAM"),
                ("process_resident_memory_bytes", "GAUGE"),
            ] {
                assert_eq!(
                    families.get(name).map(|f| f.kind.as_str()),
                    Some(kind),
                    "{name}"
                );
            }
        }
    }
    let (code, body) = get(port, "/stats/summary").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    let n = &summary["node"];
    assert_eq!(n["nodeName"], node.name.as_str());
    for field in [
        &n["cpu"]["usageCoreNanoSeconds"],
        &n["memory"]["workingSetBytes"],
        &n["fs"]["capacityBytes"],
        &n["runtime"]["imageFs"]["capacityBytes"],
    ] {
        assert!(field.as_u64().is_some_and(|v| v > 0), "{field} in {n}");
    }
    // The agent's own cgroup and the pods' are reported as system containers, as upstream's.
    let system = n["systemContainers"].as_array().expect("systemContainers");
    for name in ["kubelet", "pods"] {
        let c = system
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {system:?}"));
        for field in [
            &c["cpu"]["usageCoreNanoSeconds"],
            &c["memory"]["workingSetBytes"],
        ] {
            assert!(field.as_u64().is_some_and(|v| v > 0), "{field} in {c}");
        }
        assert!(c["startTime"].is_string(), "{c}");
    }
    let stats = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == node.pod_name("web"))
        .unwrap_or_else(|| panic!("the pod in {body}"));
    assert_eq!(stats["podRef"]["uid"], pod["metadata"]["uid"]);
    assert_eq!(stats["containers"][0]["name"], "c");
    assert!(
        stats["containers"][0]["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{stats}"
    );
    assert!(stats["startTime"].is_string(), "{stats}");
    assert!(stats["containers"][0]["startTime"].is_string(), "{stats}");
    // The pod's processes: its container's and the sandbox's.
    assert!(
        stats["process_stats"]["process_count"]
            .as_u64()
            .is_some_and(|n| n >= 2),
        "{stats}"
    );
    // Pressure stall information of the node (/proc/pressure), and of the agent's own cgroup,
    // the pod and its container from their cgroups on the unified hierarchy (mounted beside v1
    // here).
    let kubelet = system.iter().find(|c| c["name"] == "kubelet");
    let kubelet = kubelet.expect("the kubelet system container");
    for (what, at) in [
        ("node", n),
        ("kubelet", kubelet),
        ("pod", stats),
        ("container", &stats["containers"][0]),
    ] {
        for psi in [&at["cpu"]["psi"], &at["memory"]["psi"], &at["io"]["psi"]] {
            assert!(
                psi["some"]["total"].is_u64() && psi["full"]["avg10"].is_f64(),
                "the {what}'s pressure: {at}"
            );
        }
    }
    // No swap on these machines: none used, none to be had.
    for at in [&n["swap"], &stats["swap"], &stats["containers"][0]["swap"]] {
        assert_eq!(at["swapUsageBytes"], 0, "{at}");
    }

    // A restarted container: its exited instance is not scraped beside the running one.
    node.write_manifest(
        "crashy.yaml",
        &pod_yaml("crashy", &[("c", "sleep 10; exit 1")], ""),
    );
    node.wait_status("crashy", "restarted and running again", |s| {
        s.container_statuses.as_ref().is_some_and(|c| {
            c[0].restart_count >= 1 && c[0].state.as_ref().is_some_and(|st| st.running.is_some())
        })
    })
    .await;

    // Its exit is counted as upstream's status manager counts it.
    let exited = "kubelet_terminated_containers_total{container_type=\"container\",exit_code=\"1\",reason=\"Error\"}";
    let (_, body) = get(port, "/metrics").await.unwrap();
    assert!(
        parse_prometheus(&body)
            .iter()
            .any(|(s, v)| s == exited && *v >= 1.0),
        "{exited} in {body}"
    );

    // What metrics-server scrapes: each series with its value and the sample's time in ms.
    let (code, body) = get(port, "/metrics/resource").await.unwrap();
    assert_eq!(code, 200);
    let restarted = format!(
        "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"default\",pod=\"{}\"}} ",
        node.pod_name("crashy")
    );
    assert_eq!(body.matches(&restarted).count(), 1, "{body}");
    let labels = format!(
        "{{container=\"c\",namespace=\"default\",pod=\"{}\"}}",
        node.pod_name("web")
    );
    for series in [
        format!("container_cpu_usage_seconds_total{labels}"),
        format!("container_memory_working_set_bytes{labels}"),
        "node_cpu_usage_seconds_total".to_string(),
        "node_memory_working_set_bytes".to_string(),
    ] {
        let sample = body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("{series} missing in {body}"));
        let fields: Vec<&str> = sample.split(' ').collect();
        assert!(
            fields.len() == 2
                && fields[0].parse::<f64>().is_ok_and(|v| v > 0.0)
                && fields[1].parse::<i64>().is_ok_and(|ms| ms > 0),
            "{series} {sample}"
        );
    }
    assert!(
        body.contains(&format!("container_start_time_seconds{labels} ")),
        "{body}"
    );
    assert!(body.contains("\nresource_scrape_error 0\n"), "{body}");

    // cAdvisor's endpoint, from the cgroups: each container's figures labelled with its cgroup,
    // runtime ID, image, pod, namespace and container name; its pod's cgroup with the pod's
    // name; the pod's network under its sandbox (`POD`); the root cgroup; and the machine.
    let (code, body) = get(port, "/metrics/cadvisor").await.unwrap();
    assert_eq!(code, 200);
    let statuses = st.container_statuses.as_deref().unwrap_or_default();
    let id = statuses[0].container_id.as_deref().unwrap_or_default();
    let id = id.split_once("://").map_or(id, |(_, id)| id);
    let web = node.pod_name("web");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let image = pod["spec"]["containers"][0]["image"].as_str().unwrap();
    let find = |family: &str, parts: &[String]| {
        body.lines().find_map(|l| {
            let rest = l.strip_prefix(family)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let labels: Vec<&str> = labels.split(',').collect();
            if !parts.iter().all(|p| labels.contains(&p.as_str())) {
                return None;
            }
            value.split(' ').next()?.parse::<f64>().ok()
        })
    };
    let container = [
        "container=\"c\"".to_string(),
        format!("name=\"{id}\""),
        format!("image=\"{image}\""),
        "namespace=\"default\"".to_string(),
        format!("pod=\"{web}\""),
    ];
    for family in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
        "container_threads",
        "container_processes",
        "container_ulimits_soft",
    ] {
        assert!(
            find(family, &container).is_some_and(|v| v > 0.0),
            "{family} {container:?} in {body}"
        );
    }
    let cgroup = body
        .lines()
        .find(|l| {
            l.starts_with("container_memory_usage_bytes{") && l.contains(&format!("name=\"{id}\""))
        })
        .and_then(|l| l.split("id=\"").nth(1)?.split('"').next())
        .unwrap_or_else(|| panic!("the container's cgroup in {body}"));
    assert!(cgroup.ends_with(&format!("/pod{uid}/{id}")), "{cgroup}");
    let pod_cgroup = [
        "container=\"\"".to_string(),
        format!("id=\"{}\"", cgroup.trim_end_matches(&format!("/{id}"))),
        format!("pod=\"{web}\""),
    ];
    assert!(
        find("container_memory_working_set_bytes", &pod_cgroup).is_some_and(|v| v > 0.0),
        "{pod_cgroup:?} in {body}"
    );
    let sandbox = [
        "container=\"POD\"".to_string(),
        format!("pod=\"{web}\""),
        "interface=\"eth0\"".to_string(),
    ];
    assert!(
        find("container_network_receive_packets_total", &sandbox).is_some(),
        "{sandbox:?} in {body}"
    );
    let root = ["id=\"/\"".to_string()];
    assert!(
        find("container_memory_usage_bytes", &root).is_some_and(|v| v > 0.0),
        "the root cgroup in {body}"
    );
    let cores = std::thread::available_parallelism().unwrap().get() as f64;
    let machine = body
        .lines()
        .find(|l| l.starts_with("machine_cpu_cores{boot_id=\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(machine, Some(cores), "{body}");
    assert!(body.contains("\nmachine_scrape_error 0\n"), "{body}");

    let (code, body) = get(port, "/metrics/probes").await.unwrap();
    assert_eq!(code, 200);
    let samples = parse_prometheus(&body);
    let series = format!(
        "prober_probe_total{{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"{}\",namespace=\"default\",pod_uid=\"{}\"}}",
        node.pod_name("web"),
        pod["metadata"]["uid"].as_str().unwrap_or_default()
    );
    assert!(
        samples.iter().any(|(s, v)| *s == series && *v >= 1.0),
        "{series} missing in {body}"
    );
    assert_eq!(
        get(port, "/healthz").await.unwrap(),
        (200, "ok".to_string())
    );
    // A pod's probe series go with it, as upstream's do.
    node.remove_manifest("web.yaml");
    let web = format!("pod=\"{}\"", node.pod_name("web"));
    eventually(
        "web's probe series gone",
        Duration::from_secs(60),
        || async {
            let (_, body) = get(port, "/metrics/probes").await?;
            (!body.contains(&web)).then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn the_summary_reports_pod_network_volumes_and_ephemeral_storage() {
    let port = free_port();
    let node = Node::start(
        "summary",
        &[
            "--read-only-port",
            &port.to_string(),
            "--address",
            "127.0.0.1",
        ],
    )
    .await;
    const BLOB: u64 = 200_000;
    let writer = pod_yaml(
        "disk",
        &[(
            "c",
            &format!("head -c {BLOB} /dev/zero > /scratch/blob; echo written; {FOREVER}"),
        )],
        "  volumes: [{name: scratch, emptyDir: {}}]\n",
    )
    .replace(
        "    command:",
        "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n    command:",
    );
    node.write_manifest("disk.yaml", &writer);
    node.write_manifest(
        "hostnet.yaml",
        &pod_yaml("hostnet", &[("c", FOREVER)], "  hostNetwork: true\n"),
    );
    node.wait_log("disk", "c", "written").await;
    node.wait_running("hostnet", 1).await;
    let ip = node
        .wait_status("disk", "a pod IP", |s| s.pod_ip.is_some())
        .await
        .pod_ip
        .unwrap_or_default();
    // Traffic through the pod's eth0 (a network namespace this test made): the refused
    // connection is a SYN in and a RST out.
    let _ = tokio::net::TcpStream::connect((ip.as_str(), 9)).await;

    let find = |summary: &serde_json::Value, name: &str| {
        summary["pods"]
            .as_array()
            .and_then(|pods| {
                pods.iter()
                    .find(|p| p["podRef"]["name"] == node.pod_name(name))
            })
            .cloned()
    };
    let (summary, disk) = eventually(
        "the pod's network traffic in /stats/summary",
        Duration::from_secs(30),
        || async {
            let (code, body) = get(port, "/stats/summary").await?;
            let summary: serde_json::Value = serde_json::from_str(&body).ok()?;
            let disk = find(&summary, "disk")?;
            let network = &disk["network"];
            (code == 200 && network["rxBytes"].as_u64()? > 0 && network["txBytes"].as_u64()? > 0)
                .then_some((summary, disk))
        },
    )
    .await;
    let network = &disk["network"];
    assert_eq!(network["name"], "eth0", "{network}");
    assert!(network["rxErrors"].is_u64() && network["txErrors"].is_u64());
    assert!(network["time"].is_string());
    assert!(
        network["interfaces"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["name"] == "eth0")),
        "{network}"
    );

    let volume = disk["volume"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
        .unwrap_or_else(|| panic!("the scratch volume in {disk}"));
    assert!(
        volume["usedBytes"].as_u64().unwrap_or(0) >= BLOB,
        "{volume}"
    );
    assert!(volume["inodesUsed"].as_u64().unwrap_or(0) >= 2, "{volume}");
    for field in ["capacityBytes", "availableBytes", "inodes", "inodesFree"] {
        assert!(
            volume[field].as_u64().is_some_and(|v| v > 0),
            "{field} in {volume}"
        );
    }
    let ephemeral = &disk["ephemeral-storage"];
    assert!(
        ephemeral["usedBytes"].as_u64().unwrap_or(0) >= BLOB,
        "{ephemeral}"
    );
    assert!(
        ephemeral["capacityBytes"].as_u64().is_some_and(|v| v > 0),
        "{ephemeral}"
    );
    let logs = &disk["containers"][0]["logs"];
    assert!(logs["usedBytes"].as_u64().is_some_and(|v| v > 0), "{logs}");

    // A pod on the host network has no network of its own, as upstream reports it.
    let hostnet = find(&summary, "hostnet").unwrap_or_else(|| panic!("hostnet in {summary}"));
    assert!(hostnet.get("network").is_none(), "{hostnet}");
    assert!(
        hostnet["ephemeral-storage"]["usedBytes"].is_u64(),
        "{hostnet}"
    );

    let node_network = &summary["node"]["network"];
    assert!(
        node_network["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty() && i.iter().all(|i| i["name"] != "lo")),
        "{node_network}"
    );
    node.finish().await;
}
