//! Configuration: built-in defaults < config file < flags, and a bad file reports every problem.

use std::process::Command;

use nodelet::config::{Invocation, from_args};

fn load(args: &[&str]) -> Result<nodelet::config::Config, Vec<String>> {
    match from_args(std::iter::once("nodelet").chain(args.iter().copied())) {
        Invocation::Run(r) => match *r {
            Ok(loaded) => Ok(loaded.config),
            Err(e) => Err(e.problems),
        },
        Invocation::Exit(e) => panic!("clap exit: {e}"),
        Invocation::Version(line) => panic!("version printed: {line}"),
    }
}

#[test]
fn flags_override_the_file_which_overrides_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubelet.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /from/file
syncFrequency: 1m30s
healthzPort: 20000
clusterDNS: [10.96.0.10]
",
    )
    .unwrap();
    let path = file.display().to_string();
    let c = load(&[
        "--config",
        &path,
        "--healthz-port",
        "30000",
        "--hostname-override",
        "n",
    ])
    .unwrap();
    assert_eq!(
        c.static_pod_path.as_deref(),
        Some(std::path::Path::new("/from/file"))
    );
    assert_eq!(c.sync_frequency, std::time::Duration::from_secs(90));
    assert_eq!(c.healthz_port, 30000, "the flag wins over the file");
    assert_eq!(
        c.file_check_frequency,
        std::time::Duration::from_secs(20),
        "default when neither sets it"
    );
    let json = dir.path().join("kubelet.json");
    std::fs::write(
        &json,
        r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","readOnlyPort":10255}"#,
    )
    .unwrap();
    let c = load(&[
        "--config",
        &json.display().to_string(),
        "--hostname-override",
        "n",
    ])
    .unwrap();
    assert_eq!(c.read_only_port, 10255);
}

#[test]
fn a_config_file_with_three_errors_reports_all_three_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
fileCheckFrequency: 20 seconds
healthzPort: 99999
containerRuntimeEndpoint: /run/containerd/containerd.sock
",
    )
    .unwrap();
    let path = file.display().to_string();
    let problems = load(&["--config", &path, "--hostname-override", "n"]).unwrap_err();
    assert_eq!(problems.len(), 3, "{problems:?}");
    for field in [
        "fileCheckFrequency",
        "healthzPort",
        "containerRuntimeEndpoint",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(field)),
            "{field} missing in {problems:?}"
        );
    }

    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["--config", &path, "--hostname-override", "n"])
        .output()
        .expect("run nodelet");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for field in [
        "fileCheckFrequency",
        "healthzPort",
        "containerRuntimeEndpoint",
    ] {
        assert!(stderr.contains(field), "{field} missing in {stderr}");
    }
}

#[test]
fn unknown_fields_in_the_file_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPat: /x
",
    )
    .unwrap();
    let problems = load(&[
        "--config",
        &file.display().to_string(),
        "--hostname-override",
        "n",
    ])
    .unwrap_err();
    assert!(
        problems[0].contains("staticPodPat: unknown field"),
        "{problems:?}"
    );
}

/// Runs the agent with `extra` flags against a runtime endpoint where nothing answers, in a
/// test dir of its own (the agent makes its root dir a shared mount before it asks for the
/// runtime); its exit status and stderr, and the endpoint's path.
fn start_without_a_runtime(test: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = crate::bed::test_dir(test);
    let sock = dir.path().join("none.sock").display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .args(extra)
        .args([
            "--container-runtime-endpoint",
            &format!("unix://{sock}"),
            "--hostname-override",
            "n",
            "--healthz-port",
            "0",
            "--runtime-request-timeout",
            "1s",
        ])
        .output()
        .expect("run nodelet");
    crate::bed::unmount_all_under(dir.path());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        sock,
    )
}

#[test]
fn a_runtime_that_never_answers_fails_start_up_naming_the_endpoint() {
    let (code, stderr, sock) = start_without_a_runtime("no-runtime", &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&sock), "{stderr}");
}

/// `failCgroupV1: true` refuses a host without the unified cgroup hierarchy, before anything
/// else; on a unified host it changes nothing (the agent goes on to the runtime).
#[test]
fn fail_cgroupv1_refuses_a_cgroup_v1_host() {
    let (code, stderr, sock) = start_without_a_runtime("cgroupv1", &["--fail-cgroupv1"]);
    assert_eq!(code, Some(1), "{stderr}");
    let unified = std::fs::metadata("/sys/fs/cgroup/cgroup.controllers").is_ok()
        && !std::path::Path::new("/sys/fs/cgroup/memory").exists();
    if unified {
        assert!(stderr.contains(&sock), "{stderr}");
    } else {
        assert!(stderr.contains("--fail-cgroupv1"), "{stderr}");
    }
}

/// `protectKernelDefaults: true` refuses a host whose kernel settings differ from what the
/// kubelet expects, naming each with both values; where none differs the agent goes on.
#[test]
fn protect_kernel_defaults_names_each_setting_that_differs() {
    let expected = [
        ("vm.overcommit_memory", "vm/overcommit_memory", "1"),
        ("vm.panic_on_oom", "vm/panic_on_oom", "0"),
        ("kernel.panic", "kernel/panic", "10"),
        ("kernel.panic_on_oops", "kernel/panic_on_oops", "1"),
        (
            "kernel.keys.root_maxkeys",
            "kernel/keys/root_maxkeys",
            "1000000",
        ),
        (
            "kernel.keys.root_maxbytes",
            "kernel/keys/root_maxbytes",
            "25000000",
        ),
    ];
    let (code, stderr, sock) =
        start_without_a_runtime("kernel-defaults", &["--protect-kernel-defaults"]);
    assert_eq!(code, Some(1), "{stderr}");
    let mut differ = 0;
    for (name, path, want) in expected {
        let now = std::fs::read_to_string(format!("/proc/sys/{path}")).expect("a kernel setting");
        if now.trim() != want {
            differ += 1;
            let said = format!("{name} is {}, expected {want}", now.trim());
            assert!(stderr.contains(&said), "{said} in {stderr}");
        }
    }
    if differ == 0 {
        assert!(stderr.contains(&sock), "{stderr}");
    } else {
        assert!(stderr.contains("--protect-kernel-defaults"), "{stderr}");
    }
}
