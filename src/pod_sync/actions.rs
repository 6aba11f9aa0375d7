//! The plan of one pod sync: from the desired spec and what the runtime holds, decide whether a
//! sandbox must be (re)created, which containers to kill, which to start, what to collect.
//! Pure: no I/O, so every transition is unit-tested.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container as SpecContainer, Pod, PodSpec};

use super::convert::{ResourcesDigest, resources_digest};
use crate::pod::{container_changed, spec};
use crate::runtime::{Container, ContainerState, PodRuntime, SandboxState};

/// A container to stop, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    pub id: String,
    pub name: String,
    pub reason: String,
    /// A grace period other than the pod's (a probe's terminationGracePeriodSeconds).
    pub grace: Option<i64>,
}

/// A running container that must be restarted because a probe failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub reason: String,
    pub grace: Option<i64>,
}

/// A container to create and start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub name: String,
    pub init: bool,
    pub restart_count: u32,
    /// The running container whose process namespace an ephemeral container joins
    /// (`targetContainerName`).
    pub pid_target: Option<String>,
}

/// A running container to resize in place to its spec's resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resize {
    pub id: String,
    pub name: String,
}

/// What one sync does, in order: kill the old pod, create a sandbox, kill containers, start
/// containers, collect dead ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Stop every container and sandbox of the pod first (its sandbox is gone or duplicated).
    pub kill_pod: bool,
    /// Create a sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// The ready sandbox to start containers in, when no new one is made.
    pub sandbox_id: Option<String>,
    pub kill: Vec<Kill>,
    pub start: Vec<Start>,
    /// Running containers whose cgroup limits change in place (an in-place resize).
    pub resize: Vec<Resize>,
    /// Dead containers no longer needed (older attempts, old sandboxes).
    pub remove_containers: Vec<String>,
    /// Old, not ready sandboxes.
    pub remove_sandboxes: Vec<String>,
    /// The sandbox of a pod that has finished, to stop (not remove).
    pub stop_sandbox: Option<String>,
}

impl Plan {
    /// Whether carrying the plan out changes nothing in the runtime.
    pub fn is_empty(&self) -> bool {
        !self.kill_pod
            && self.create_sandbox.is_none()
            && self.kill.is_empty()
            && self.start.is_empty()
            && self.resize.is_empty()
            && self.remove_containers.is_empty()
            && self.remove_sandboxes.is_empty()
            && self.stop_sandbox.is_none()
    }
}

fn next_restart_count(rt: &PodRuntime, name: &str) -> u32 {
    rt.containers
        .iter()
        .filter(|c| c.name == name)
        .map(|c| c.attempt + 1)
        .max()
        .unwrap_or(0)
}

fn start(rt: &PodRuntime, c: &SpecContainer, init: bool) -> Start {
    Start {
        name: c.name.clone(),
        init,
        restart_count: next_restart_count(rt, &c.name),
        pid_target: None,
    }
}

fn exited_ok(c: &Container) -> bool {
    c.state == ContainerState::Exited && c.exit_code == 0
}

/// Should a container that ended be started again under this restart policy?
fn restarts(policy: &str, c: &Container) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => !exited_ok(c),
        _ => true,
    }
}

/// Has the pod run to completion (no container will ever be started again)?
pub fn finished(pod: &Pod, rt: &PodRuntime) -> bool {
    let s = spec(pod);
    let policy = s.restart_policy.as_deref().unwrap_or("Always");
    let init_failed = policy == "Never"
        && s.init_containers
            .iter()
            .flatten()
            .filter(|c| !is_sidecar(c))
            .any(|c| {
                rt.latest_container(&c.name).is_some_and(|latest| {
                    latest.state == ContainerState::Exited && !exited_ok(latest)
                })
            });
    policy != "Always"
        && (init_failed
            || s.containers.iter().all(|c| {
                rt.latest_container(&c.name).is_some_and(|latest| {
                    latest.state == ContainerState::Exited && !restarts(policy, latest)
                })
            }))
}

/// What the probes say that the plan needs, by container ID.
#[derive(Clone, Debug, Default)]
pub struct ProbeView {
    /// Running containers whose liveness or startup probe failed.
    pub unhealthy: HashMap<String, Unhealthy>,
    /// Running containers whose startup probe has not succeeded yet.
    pub unstarted: std::collections::HashSet<String>,
}

pub use crate::pod::is_sidecar;

/// Computes the actions that bring the runtime to the pod's spec.
pub fn plan(pod: &Pod, rt: &PodRuntime, probes: &ProbeView) -> Plan {
    let s = spec(pod);
    let policy = s.restart_policy.as_deref().unwrap_or("Always");
    let ready: Vec<_> = rt
        .sandboxes
        .iter()
        .filter(|sb| sb.state == SandboxState::Ready)
        .collect();
    let [current] = ready.as_slice() else {
        return in_new_sandbox(pod, rt, policy);
    };
    let mut plan = Plan::default();
    if finished(pod, rt) {
        // The pod is done: what still runs (sidecars, or those beside a failed init container)
        // is stopped in upstream's termination order, and its sandbox with it; its containers
        // and logs are kept.
        if rt
            .containers
            .iter()
            .any(|c| c.state == ContainerState::Running)
        {
            plan.kill_pod = true;
        } else {
            plan.stop_sandbox = Some(current.id.clone());
        }
        return plan;
    }
    plan.sandbox_id = Some(current.id.clone());
    collect_garbage(rt, &current.id, &mut plan);
    let at = InSandbox {
        pod,
        rt,
        sandbox: &current.id,
        probes,
        policy,
    };
    if plan_init(&mut plan, &at, s) {
        return plan;
    }
    plan_app(&mut plan, &at, s);
    plan_ephemeral(&mut plan, rt, s);
    plan
}

/// The plan of a pod without a ready sandbox: a new one, and its first containers (the first
/// init container, or every app container).
fn in_new_sandbox(pod: &Pod, rt: &PodRuntime, policy: &str) -> Plan {
    let s = spec(pod);
    let mut plan = Plan::default();
    // A finished pod is not brought back; under Never, neither is one whose containers
    // already ran (upstream does not recreate its sandbox).
    if finished(pod, rt) || (policy == "Never" && !rt.containers.is_empty()) {
        return plan;
    }
    plan.kill_pod = !rt.sandboxes.is_empty() || !rt.containers.is_empty();
    plan.create_sandbox = Some(rt.latest_sandbox().map_or(0, |sb| sb.attempt + 1));
    match s.init_containers.iter().flatten().next() {
        Some(first) => plan.start.push(start(rt, first, true)),
        None => {
            plan.start = s
                .containers
                .iter()
                // Under OnFailure, containers that already succeeded stay done.
                .filter(|c| {
                    !(policy == "OnFailure" && rt.latest_container(&c.name).is_some_and(exited_ok))
                })
                .map(|c| start(rt, c, false))
                .collect()
        }
    }
    plan
}

/// The pod as the runtime holds it in its ready sandbox, and what is planned against.
struct InSandbox<'a> {
    pod: &'a Pod,
    rt: &'a PodRuntime,
    sandbox: &'a str,
    probes: &'a ProbeView,
    policy: &'a str,
}

impl<'a> InSandbox<'a> {
    /// The container of this name in the ready sandbox.
    fn container(&self, name: &str) -> Option<&'a Container> {
        self.rt
            .containers
            .iter()
            .find(|c| c.name == name && c.sandbox_id == self.sandbox)
    }
}

/// Plans the init containers; true when the plan stops at one of them (the app containers
/// wait).
fn plan_init(plan: &mut Plan, at: &InSandbox<'_>, s: &PodSpec) -> bool {
    let inits = || s.init_containers.iter().flatten();
    // Once every regular init container succeeded and every sidecar started (its startup probe
    // passed), or once an app container ran, the pod is initialized for good: init containers
    // are not run again, and only sidecars are kept running.
    let regular_done = inits()
        .filter(|c| !is_sidecar(c))
        .all(|c| at.container(&c.name).is_some_and(exited_ok));
    let sidecars_started = inits().filter(|c| is_sidecar(c)).all(|c| {
        at.container(&c.name).is_some_and(|c| {
            c.state == ContainerState::Running && !at.probes.unstarted.contains(&c.id)
        })
    });
    let app_started = s.containers.iter().any(|c| at.container(&c.name).is_some());
    let initialized = regular_done && (sidecars_started || app_started);
    let app_done = at.policy != "Always"
        && s.containers.iter().all(|c| {
            at.container(&c.name)
                .is_some_and(|c| c.state == ContainerState::Exited && !restarts(at.policy, c))
        });
    for init in inits() {
        let stops = if is_sidecar(init) {
            plan_sidecar(plan, at, init, initialized, app_done)
        } else {
            !initialized && plan_regular_init(plan, at, init)
        };
        if stops {
            return true;
        }
    }
    false
}

/// Plans a sidecar; true when the pod is not initialized yet and waits for it.
fn plan_sidecar(
    plan: &mut Plan,
    at: &InSandbox<'_>,
    init: &SpecContainer,
    initialized: bool,
    app_done: bool,
) -> bool {
    let Some(c) = at.container(&init.name) else {
        if !app_done {
            plan.start.push(start(at.rt, init, true));
        }
        return !initialized;
    };
    match c.state {
        ContainerState::Running if container_changed(&c.digest, &c.user_image, init) => {
            plan.kill.push(kill(c, "container spec changed"));
            plan.start.push(start(at.rt, init, true));
        }
        ContainerState::Running => {
            if let Some(u) = at.probes.unhealthy.get(&c.id) {
                plan.kill.push(Kill {
                    grace: u.grace,
                    ..kill(c, &u.reason)
                });
                plan.start.push(start(at.rt, init, true));
            } else if !initialized && at.probes.unstarted.contains(&c.id) {
                return true;
            } else {
                resize(plan, at, c, init, true);
            }
        }
        _ if app_done => {}
        ContainerState::Exited => plan.start.push(start(at.rt, init, true)),
        ContainerState::Created | ContainerState::Unknown => {
            plan.kill.push(kill(c, "container is not running"));
            plan.start.push(start(at.rt, init, true));
        }
    }
    !initialized && !plan.start.is_empty()
}

/// Plans a regular init container of a pod not yet initialized; true unless it already
/// succeeded (the next one's turn).
fn plan_regular_init(plan: &mut Plan, at: &InSandbox<'_>, init: &SpecContainer) -> bool {
    match at.container(&init.name) {
        Some(c) if exited_ok(c) => false,
        Some(c) if c.state == ContainerState::Running => true,
        None => {
            plan.start.push(start(at.rt, init, true));
            true
        }
        Some(c) => {
            if at.policy != "Never" {
                if c.state != ContainerState::Exited {
                    plan.kill.push(kill(c, "init container is not running"));
                }
                plan.start.push(start(at.rt, init, true));
            }
            true
        }
    }
}

/// Plans the app containers: started, restarted by the restart policy or a failed probe,
/// replaced when their spec changed, or resized.
fn plan_app(plan: &mut Plan, at: &InSandbox<'_>, s: &PodSpec) {
    for want in &s.containers {
        let Some(c) = at.container(&want.name) else {
            plan.start.push(start(at.rt, want, false));
            continue;
        };
        let spec_changed = container_changed(&c.digest, &c.user_image, want);
        match c.state {
            ContainerState::Running if spec_changed => {
                plan.kill.push(kill(c, "container spec changed"));
                plan.start.push(start(at.rt, want, false));
            }
            ContainerState::Running => {
                if let Some(u) = at.probes.unhealthy.get(&c.id) {
                    plan.kill.push(Kill {
                        grace: u.grace,
                        ..kill(c, &u.reason)
                    });
                    if at.policy != "Never" {
                        plan.start.push(start(at.rt, want, false));
                    }
                } else {
                    resize(plan, at, c, want, false);
                }
            }
            ContainerState::Exited => {
                if restarts(at.policy, c) {
                    plan.start.push(start(at.rt, want, false));
                }
            }
            ContainerState::Created | ContainerState::Unknown => {
                plan.kill.push(kill(c, "container is not running"));
                plan.start.push(start(at.rt, want, false));
            }
        }
    }
}

/// Ephemeral containers run once, as upstream: never restarted, nor started again in a new
/// sandbox. One that targets a container joins that container's process namespace, so it
/// waits for the target to exist.
fn plan_ephemeral(plan: &mut Plan, rt: &PodRuntime, s: &PodSpec) {
    for want in crate::pod::ephemeral_containers(s) {
        if rt.latest_container(&want.name).is_some() {
            continue;
        }
        let target = s
            .ephemeral_containers
            .iter()
            .flatten()
            .find(|e| e.name == want.name)
            .and_then(|e| e.target_container_name.as_deref());
        let pid_target = match target {
            None => None,
            Some(name) => match rt.latest_container(name) {
                Some(c) if c.state == ContainerState::Running => Some(c.id.clone()),
                _ => continue,
            },
        };
        plan.start.push(Start {
            pid_target,
            ..start(rt, &want, false)
        });
    }
}

/// A running container whose spec's resources differ from the limits it runs with is resized
/// in place; or restarted, where its `resizePolicy` says so for a resource that changed. One
/// created without a recorded digest is left alone.
fn resize(plan: &mut Plan, at: &InSandbox<'_>, c: &Container, want: &SpecContainer, init: bool) {
    let Some(have) = ResourcesDigest::decode(&c.resources) else {
        return;
    };
    let wanted = resources_digest(at.pod, want);
    if have == wanted {
        return;
    }
    let restarts_on = |resource: &str| {
        want.resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    if (have.cpu != wanted.cpu && restarts_on("cpu"))
        || (have.memory != wanted.memory && restarts_on("memory"))
    {
        plan.kill.push(kill(
            c,
            "its resources changed and its resize policy restarts it",
        ));
        plan.start.push(start(at.rt, want, init));
    } else {
        plan.resize.push(Resize {
            id: c.id.clone(),
            name: c.name.clone(),
        });
    }
}

fn kill(c: &Container, reason: &str) -> Kill {
    Kill {
        id: c.id.clone(),
        name: c.name.clone(),
        reason: reason.into(),
        grace: None,
    }
}

/// Keeps the newest dead container per name (MaxPerPodContainer 1, as upstream: it gives the
/// container's last state and previous logs); removes older dead ones, and not-ready sandboxes
/// other than the current one once they hold no container.
fn collect_garbage(rt: &PodRuntime, current: &str, plan: &mut Plan) {
    let mut dead: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    // Newest first.
    for c in rt
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Exited)
    {
        let count = dead.entry(c.name.as_str()).or_default();
        *count += 1;
        if *count > 1 {
            plan.remove_containers.push(c.id.clone());
        }
    }
    plan.remove_sandboxes = rt
        .sandboxes
        .iter()
        .filter(|sb| sb.id != current && sb.state == SandboxState::NotReady)
        .filter(|sb| {
            !rt.containers
                .iter()
                .any(|c| c.sandbox_id == sb.id && !plan.remove_containers.contains(&c.id))
        })
        .map(|sb| sb.id.clone())
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Sandbox;
    use crate::types::PodUid;

    /// Init containers named `+name` are sidecars.
    fn pod(policy: &str, init: &[&str], apps: &[&str]) -> Pod {
        let c = |n: &&str| match n.strip_prefix('+') {
            Some(n) => {
                serde_json::json!({"name": n, "image": "busybox:1", "restartPolicy": "Always"})
            }
            None => serde_json::json!({"name": n, "image": "busybox:1"}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "restartPolicy": policy,
                "initContainers": init.iter().map(c).collect::<Vec<_>>(),
                "containers": apps.iter().map(c).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    fn sandbox(id: &str, attempt: u32, ready: bool) -> Sandbox {
        Sandbox {
            id: id.into(),
            uid: PodUid("u".into()),
            name: "p".into(),
            namespace: "default".into(),
            attempt,
            state: if ready {
                SandboxState::Ready
            } else {
                SandboxState::NotReady
            },
            created_at: attempt as i64,
            annotations: Default::default(),
            has_pod_labels: true,
        }
    }

    fn container(
        pod: &Pod,
        id: &str,
        sb: &str,
        name: &str,
        attempt: u32,
        state: ContainerState,
        code: Option<i32>,
    ) -> Container {
        let s = spec(pod);
        let want = s
            .containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .unwrap();
        Container {
            id: id.into(),
            sandbox_id: sb.into(),
            name: name.into(),
            attempt,
            state,
            created_at: attempt as i64,
            digest: crate::pod::container_digest(want),
            exit_code: code.unwrap_or(0),
            ..Default::default()
        }
    }

    fn names(plan: &Plan) -> Vec<(&str, u32)> {
        plan.start
            .iter()
            .map(|s| (s.name.as_str(), s.restart_count))
            .collect()
    }

    /// A pod with app container `a` and an ephemeral container `debugger` that targets it.
    fn debugged_pod() -> Pod {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![serde_json::from_value(
            serde_json::json!({"name": "debugger", "image": "busybox:1", "targetContainerName": "a"}),
        )
        .unwrap()]);
        p
    }

    #[test]
    fn an_ephemeral_container_starts_once_and_is_never_restarted() {
        let p = debugged_pod();
        let sb = sandbox("s1", 0, true);
        let running = container(&p, "a1", "s1", "a", 0, ContainerState::Running, None);
        let mut rt = PodRuntime {
            sandboxes: vec![sb],
            containers: vec![running],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert_eq!(names(&plan), [("debugger", 0)]);
        assert_eq!(plan.start[0].pid_target.as_deref(), Some("a1"));
        rt.containers.insert(
            0,
            Container {
                id: "d1".into(),
                sandbox_id: "s1".into(),
                name: "debugger".into(),
                state: ContainerState::Exited,
                ..Default::default()
            },
        );
        assert!(super::plan(&p, &rt, &ProbeView::default()).start.is_empty());
    }

    #[test]
    fn an_ephemeral_container_waits_for_its_target_to_run() {
        let p = debugged_pod();
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(
                &p,
                "a1",
                "s1",
                "a",
                0,
                ContainerState::Exited,
                Some(1),
            )],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert_eq!(names(&plan), [("a", 1)]);
    }

    /// A pod whose container `a` has `resources` and `resizePolicy`, and the runtime running
    /// `a` with the limits of `running_with`.
    fn resized(
        resources: serde_json::Value,
        policy: serde_json::Value,
        running_with: serde_json::Value,
    ) -> (Pod, PodRuntime) {
        let mut p = pod("Always", &[], &["a"]);
        let a = &mut p.spec.as_mut().unwrap().containers[0];
        a.resources = serde_json::from_value(resources).unwrap();
        a.resize_policy = serde_json::from_value(policy).unwrap();
        let mut before = a.clone();
        before.resources = serde_json::from_value(running_with).unwrap();
        let mut c = container(&p, "a1", "s1", "a", 0, ContainerState::Running, None);
        c.resources = resources_digest(&p, &before).encode();
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![c],
        };
        (p, rt)
    }

    #[test]
    fn changed_resources_resize_a_running_container_in_place() {
        let limits =
            |cpu: &str, mem: &str| serde_json::json!({"limits": {"cpu": cpu, "memory": mem}});
        let (p, rt) = resized(
            limits("200m", "64Mi"),
            serde_json::json!(null),
            limits("100m", "64Mi"),
        );
        let plan = plan(&p, &rt, &ProbeView::default());
        assert!(plan.kill.is_empty() && plan.start.is_empty(), "{plan:?}");
        assert_eq!(
            plan.resize,
            [Resize {
                id: "a1".into(),
                name: "a".into()
            }]
        );

        // The same limits written another way change nothing.
        let (p, rt) = resized(
            limits("1", "1Gi"),
            serde_json::json!(null),
            limits("1000m", "1024Mi"),
        );
        assert!(super::plan(&p, &rt, &ProbeView::default()).is_empty());

        // A container whose limits were not recorded is left alone.
        let (p, mut rt) = resized(
            limits("1", "1Gi"),
            serde_json::json!(null),
            limits("2", "1Gi"),
        );
        rt.containers[0].resources.clear();
        assert!(super::plan(&p, &rt, &ProbeView::default()).is_empty());
    }

    #[test]
    fn a_resize_policy_of_restart_restarts_the_container_for_its_resource_only() {
        let limits =
            |cpu: &str, mem: &str| serde_json::json!({"limits": {"cpu": cpu, "memory": mem}});
        let policy = serde_json::json!([
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        ]);
        let (p, rt) = resized(
            limits("200m", "64Mi"),
            policy.clone(),
            limits("100m", "64Mi"),
        );
        let plan = plan(&p, &rt, &ProbeView::default());
        assert!(plan.kill.is_empty(), "{plan:?}");
        assert_eq!(plan.resize.len(), 1);

        let (p, rt) = resized(limits("100m", "128Mi"), policy, limits("100m", "64Mi"));
        let plan = super::plan(&p, &rt, &ProbeView::default());
        assert!(plan.resize.is_empty(), "{plan:?}");
        assert_eq!(plan.kill[0].id, "a1");
        assert_eq!(names(&plan), [("a", 1)]);
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_its_containers() {
        let p = pod("Always", &[], &["a", "b"]);
        let plan = plan(&p, &PodRuntime::default(), &ProbeView::default());
        assert_eq!(plan.create_sandbox, Some(0));
        assert!(!plan.kill_pod);
        assert_eq!(names(&plan), [("a", 0), ("b", 0)]);
    }

    #[test]
    fn a_running_pod_with_matching_hashes_is_left_alone() {
        let p = pod("Always", &[], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "a",
                0,
                ContainerState::Running,
                None,
            )],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert_eq!(plan.sandbox_id.as_deref(), Some("s1"));
        assert!(plan.start.is_empty() && plan.kill.is_empty() && plan.create_sandbox.is_none());
    }

    #[test]
    fn a_changed_container_spec_replaces_the_container() {
        let p = pod("Always", &[], &["a"]);
        let mut c = container(&p, "c1", "s1", "a", 0, ContainerState::Running, None);
        c.digest = "v1:0".into();
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![c],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert_eq!(plan.kill[0].id, "c1");
        assert_eq!(names(&plan), [("a", 1)]);
    }

    #[test]
    fn a_failed_liveness_probe_restarts_the_container_unless_never() {
        for (policy, restarted) in [("Always", true), ("OnFailure", true), ("Never", false)] {
            let p = pod(policy, &[], &["a"]);
            let rt = PodRuntime {
                sandboxes: vec![sandbox("s1", 0, true)],
                containers: vec![container(
                    &p,
                    "c1",
                    "s1",
                    "a",
                    0,
                    ContainerState::Running,
                    None,
                )],
            };
            let unhealthy: HashMap<String, Unhealthy> = [(
                "c1".to_string(),
                Unhealthy {
                    reason: "failed liveness probe".into(),
                    grace: Some(1),
                },
            )]
            .into();
            let view = ProbeView {
                unhealthy,
                ..Default::default()
            };
            let plan = plan(&p, &rt, &view);
            assert_eq!(plan.kill[0].grace, Some(1));
            assert_eq!(!plan.start.is_empty(), restarted, "{policy}");
        }
    }

    #[test]
    fn exited_containers_follow_the_restart_policy() {
        for (policy, code, restarted) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
        ] {
            let p = pod(policy, &[], &["a"]);
            let rt = PodRuntime {
                sandboxes: vec![sandbox("s1", 0, true)],
                containers: vec![container(
                    &p,
                    "c1",
                    "s1",
                    "a",
                    4,
                    ContainerState::Exited,
                    Some(code),
                )],
            };
            let plan = plan(&p, &rt, &ProbeView::default());
            assert_eq!(!plan.start.is_empty(), restarted, "{policy} exit {code}");
            if restarted {
                assert_eq!(names(&plan), [("a", 5)]);
            }
        }
    }

    #[test]
    fn a_dead_sandbox_is_replaced_and_restart_counts_continue() {
        let p = pod("Always", &[], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "a",
                2,
                ContainerState::Exited,
                Some(137),
            )],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert!(plan.kill_pod);
        assert_eq!(plan.create_sandbox, Some(1));
        assert_eq!(names(&plan), [("a", 3)]);
    }

    #[test]
    fn a_finished_pod_is_not_recreated_when_its_sandbox_dies() {
        let p = pod("Never", &[], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "a",
                0,
                ContainerState::Exited,
                Some(0),
            )],
        };
        assert_eq!(plan(&p, &rt, &ProbeView::default()), Plan::default());
    }

    #[test]
    fn init_containers_run_one_at_a_time_before_the_app() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let fresh = plan(&p, &PodRuntime::default(), &ProbeView::default());
        assert_eq!(names(&fresh), [("i1", 0)]);
        let mut rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "i1",
                0,
                ContainerState::Running,
                None,
            )],
        };
        assert!(plan(&p, &rt, &ProbeView::default()).start.is_empty());
        rt.containers[0] = container(&p, "c1", "s1", "i1", 0, ContainerState::Exited, Some(0));
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("i2", 0)]);
        rt.containers.insert(
            0,
            container(&p, "c2", "s1", "i2", 0, ContainerState::Exited, Some(1)),
        );
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("i2", 1)]);
        rt.containers[0] = container(&p, "c2", "s1", "i2", 0, ContainerState::Exited, Some(0));
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("a", 0)]);
    }

    /// The runtime running sidecar `side` of `p` as container c1, and probes that have not
    /// seen it start yet.
    fn running_sidecar(p: &Pod) -> (PodRuntime, ProbeView) {
        let side = container(p, "c1", "s1", "side", 0, ContainerState::Running, None);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![side],
        };
        let unstarted = ProbeView {
            unstarted: ["c1".to_string()].into(),
            ..Default::default()
        };
        (rt, unstarted)
    }

    #[test]
    fn app_containers_wait_for_a_lone_sidecars_startup_probe() {
        let p = pod("Always", &["+side"], &["a"]);
        let (rt, unstarted) = running_sidecar(&p);
        assert!(plan(&p, &rt, &unstarted).start.is_empty());
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("a", 0)]);
    }

    #[test]
    fn sidecars_start_in_order_keep_running_and_stop_when_a_batch_pod_completes() {
        let p = pod("Never", &["+side", "i1"], &["a"]);
        assert_eq!(
            names(&plan(&p, &PodRuntime::default(), &ProbeView::default())),
            [("side", 0)]
        );
        let (mut rt, unstarted) = running_sidecar(&p);
        assert!(
            plan(&p, &rt, &unstarted).start.is_empty(),
            "waits for the sidecar's startup probe"
        );
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("i1", 0)]);
        rt.containers.insert(
            0,
            container(&p, "c2", "s1", "i1", 0, ContainerState::Exited, Some(0)),
        );
        assert_eq!(names(&plan(&p, &rt, &ProbeView::default())), [("a", 0)]);
        rt.containers[1] = container(&p, "c1", "s1", "side", 0, ContainerState::Exited, Some(1));
        rt.containers.insert(
            0,
            container(&p, "c3", "s1", "a", 0, ContainerState::Running, None),
        );
        assert_eq!(
            names(&plan(&p, &rt, &ProbeView::default())),
            [("side", 1)],
            "a dead sidecar restarts even under restartPolicy Never, without re-running init"
        );
        rt.containers[0] = container(&p, "c3", "s1", "a", 0, ContainerState::Exited, Some(0));
        rt.containers[2] = container(&p, "c1", "s1", "side", 0, ContainerState::Running, None);
        let done = plan(&p, &rt, &ProbeView::default());
        assert!(done.start.is_empty() && done.create_sandbox.is_none());
        assert!(
            done.kill_pod,
            "the finished pod's sidecar is stopped with the pod"
        );
    }

    #[test]
    fn a_finished_pod_has_its_sandbox_stopped_and_never_pods_are_not_recreated() {
        let p = pod("OnFailure", &[], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "a",
                0,
                ContainerState::Exited,
                Some(0),
            )],
        };
        assert_eq!(
            plan(&p, &rt, &ProbeView::default()).stop_sandbox.as_deref(),
            Some("s1")
        );
        let never = pod("Never", &[], &["a", "b"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![container(
                &never,
                "c1",
                "s1",
                "a",
                0,
                ContainerState::Exited,
                Some(0),
            )],
        };
        assert_eq!(plan(&never, &rt, &ProbeView::default()), Plan::default());
        let on_failure = pod("OnFailure", &[], &["a", "b"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec![
                container(
                    &on_failure,
                    "c2",
                    "s1",
                    "b",
                    0,
                    ContainerState::Exited,
                    Some(1),
                ),
                container(
                    &on_failure,
                    "c1",
                    "s1",
                    "a",
                    0,
                    ContainerState::Exited,
                    Some(0),
                ),
            ],
        };
        assert_eq!(
            names(&plan(&on_failure, &rt, &ProbeView::default())),
            [("b", 1)],
            "the succeeded one stays done"
        );
    }

    #[test]
    fn a_failed_init_container_fails_a_never_pod() {
        let p = pod("Never", &["i1"], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", 0, true)],
            containers: vec![container(
                &p,
                "c1",
                "s1",
                "i1",
                0,
                ContainerState::Exited,
                Some(1),
            )],
        };
        assert!(plan(&p, &rt, &ProbeView::default()).start.is_empty());
    }

    #[test]
    fn older_dead_containers_and_empty_sandboxes_are_collected() {
        let p = pod("Always", &[], &["a"]);
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s2", 1, true), sandbox("s1", 0, false)],
            containers: vec![
                container(&p, "c4", "s2", "a", 3, ContainerState::Running, None),
                container(&p, "c3", "s2", "a", 2, ContainerState::Exited, Some(1)),
                container(&p, "c2", "s1", "a", 1, ContainerState::Exited, Some(1)),
                container(&p, "c1", "s1", "a", 0, ContainerState::Exited, Some(1)),
            ],
        };
        let plan = plan(&p, &rt, &ProbeView::default());
        assert_eq!(
            plan.remove_containers,
            ["c2", "c1"],
            "the newest dead one is kept"
        );
        assert_eq!(plan.remove_sandboxes, ["s1"], "s1 holds nothing kept");
    }
}
