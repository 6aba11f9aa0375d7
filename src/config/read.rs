//! Reading raw knobs into typed values: the readers and parsers the settings table names.
//! A reader is given the knob's name and its default and returns the value in force; a problem
//! is recorded (naming the field and its flag) and the default kept, so every problem is found.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::duration;
use super::fields::{Raw, RawValue, by_name};
use super::{Enforcement, ReserveEnforcement};

/// The longest period or timeout accepted: longer ones overflow timers.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Reads raw knobs into typed values, collecting every problem.
pub(super) struct Reader<'a> {
    pub raw: &'a Raw,
    pub problems: Vec<String>,
}

impl Reader<'_> {
    /// How a problem names the knob: its file name and its flag.
    pub fn label(name: &str) -> String {
        match by_name(name) {
            Some(f) if !f.flag.is_empty() => format!("{name} (--{})", f.flag),
            Some(_) => format!("{name} (config file)"),
            None => name.to_string(),
        }
    }

    /// Records a problem with the knob `name`.
    pub fn problem(&mut self, name: &str, msg: impl std::fmt::Display) {
        self.problems.push(format!("{}: {msg}", Self::label(name)));
    }

    pub fn text(&mut self, name: &str) -> Option<String> {
        match self.raw.get(name) {
            Some(RawValue::Scalar(s)) => Some(s.clone()),
            Some(RawValue::Map(_) | RawValue::List(_)) => {
                self.problem(name, "expected a single value");
                None
            }
            None => None,
        }
    }

    /// The knob's text parsed, or `default` when it is not given or does not parse.
    pub fn parsed<T>(
        &mut self,
        name: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> T {
        match self.text(name) {
            None => default,
            Some(text) => parse(&text).unwrap_or_else(|msg| {
                self.problem(name, msg);
                default
            }),
        }
    }

    pub fn list(&mut self, name: &str) -> Option<Vec<String>> {
        match self.raw.get(name) {
            Some(RawValue::List(items)) => Some(items.clone()),
            Some(RawValue::Scalar(s)) => Some(vec![s.clone()]),
            Some(RawValue::Map(_)) => {
                self.problem(name, "expected a list");
                None
            }
            None => None,
        }
    }

    /// A map knob, each key's last value.
    pub fn map(&mut self, name: &str) -> Option<BTreeMap<String, String>> {
        match self.raw.get(name) {
            Some(RawValue::Map(m)) => Some(
                m.iter()
                    .map(|(k, v)| (k.clone(), v.last().cloned().unwrap_or_default()))
                    .collect(),
            ),
            Some(RawValue::Scalar(_) | RawValue::List(_)) => {
                self.problem(name, "expected a map");
                None
            }
            None => None,
        }
    }

    /// A list knob, each item parsed; items that do not parse are reported and left out.
    pub fn items<T>(
        &mut self,
        name: &str,
        default: Vec<T>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Vec<T> {
        let Some(items) = self.list(name) else {
            return default;
        };
        let mut out = Vec::new();
        for item in items {
            match parse(&item) {
                Ok(v) => out.push(v),
                Err(msg) => self.problem(name, msg),
            }
        }
        out
    }
}

/// Calls a reader of the settings table.
pub(super) fn with<T>(
    r: &mut Reader<'_>,
    name: &'static str,
    default: T,
    read: impl FnOnce(&mut Reader<'_>, &'static str, T) -> T,
) -> T {
    read(r, name, default)
}

/// A path; given empty, none.
pub(super) fn path(r: &mut Reader<'_>, name: &str, default: Option<PathBuf>) -> Option<PathBuf> {
    match r.text(name) {
        None => default,
        Some(s) if s.is_empty() => None,
        Some(s) => Some(PathBuf::from(s)),
    }
}

/// A directory that always has a value; given empty, the default.
pub(super) fn dir(r: &mut Reader<'_>, name: &str, default: PathBuf) -> PathBuf {
    r.text(name)
        .filter(|s| !s.is_empty())
        .map_or(default, PathBuf::from)
}

pub(super) fn list(r: &mut Reader<'_>, name: &str, default: Vec<String>) -> Vec<String> {
    r.list(name).unwrap_or(default)
}

pub(super) fn map(
    r: &mut Reader<'_>,
    name: &str,
    default: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    r.map(name).unwrap_or(default)
}

/// A map whose keys may repeat (HTTP headers).
pub(super) fn headers(
    r: &mut Reader<'_>,
    name: &str,
    default: BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    match r.raw.get(name) {
        Some(RawValue::Map(m)) => m.clone(),
        Some(_) => {
            r.problem(name, "expected a map");
            default
        }
        None => default,
    }
}

/// A field naming a cgroup (kubeletCgroups, systemCgroups, --runtime-cgroups): an absolute
/// name that stays inside each hierarchy.
pub(super) fn cgroup_name(
    r: &mut Reader<'_>,
    name: &str,
    default: Option<String>,
) -> Option<String> {
    r.parsed(name, default, |s| match s {
        "" => Ok(None),
        s if !s.starts_with('/') || s.split('/').any(|p| p == "..") => {
            Err(format!("{s:?} is not an absolute cgroup name"))
        }
        s => Ok(Some(s.to_string())),
    })
}

/// cpuManagerPolicyOptions: full-pcpus-only, the one option nodelet has (upstream's others
/// are refused by name).
pub(super) fn cpu_manager_options(r: &mut Reader<'_>, name: &str, default: bool) -> bool {
    let mut full = default;
    for (option, value) in r.map(name).unwrap_or_default() {
        match (option.as_str(), bool(&value)) {
            ("full-pcpus-only", Ok(on)) => full = on,
            ("full-pcpus-only", Err(msg)) => r.problem(name, format!("full-pcpus-only: {msg}")),
            (other, _) => r.problem(name, format!("unsupported cpumanager option: {other:?}")),
        }
    }
    full
}

/// reservedMemory (--reserved-memory): `<NUMA node>:<type>=<quantity>,...` entries.
pub(super) fn reserved_memory(
    r: &mut Reader<'_>,
    name: &str,
    default: BTreeMap<u32, BTreeMap<String, u64>>,
) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let Some(entries) = r.list(name) else {
        return default;
    };
    crate::cm::memory::parse_reserved(&entries).unwrap_or_else(|e| {
        r.problem(name, e);
        default
    })
}

/// qosReserved: only memory, as a percentage (upstream's ParseQOSReserved).
pub(super) fn qos_reserved(r: &mut Reader<'_>, name: &str, default: Option<i64>) -> Option<i64> {
    let mut memory = default;
    for (resource, value) in r.map(name).unwrap_or_default() {
        if resource != "memory" {
            r.problem(name, format!("cannot reserve {resource:?} resource"));
            continue;
        }
        match value.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) if (0..=100).contains(&p) => memory = Some(p),
            Some(Ok(_)) => r.problem(name, "percentage must be between 0 and 100"),
            _ => r.problem(
                name,
                format!("failed to parse percentage {value:?} for \"memory\" resource"),
            ),
        }
    }
    memory
}

/// userNamespaces: idsPerPod, a multiple of 65536 that fits a uid.
pub(super) fn user_namespaces(r: &mut Reader<'_>, name: &str, default: u32) -> u32 {
    let ids = r.map(name).unwrap_or_default();
    match ids.get("idsPerPod").map(|v| v.trim().parse::<u64>()) {
        None => default,
        Some(Ok(n)) if n >= 65536 && n.is_multiple_of(65536) && n <= u64::from(u32::MAX) => {
            n as u32
        }
        Some(_) => {
            r.problems.push(format!(
                "{name}.idsPerPod (config file): must be a multiple of 65536, from 65536 to 4294967295"
            ));
            default
        }
    }
}

/// featureGates: `Gate=true|false`.
pub(super) fn feature_gates(
    r: &mut Reader<'_>,
    name: &str,
    default: BTreeMap<String, bool>,
) -> BTreeMap<String, bool> {
    let Some(given) = r.map(name) else {
        return default;
    };
    let mut gates = BTreeMap::new();
    for (gate, value) in given {
        match value.parse::<bool>() {
            Ok(on) => {
                gates.insert(gate, on);
            }
            Err(_) => r.problem(name, format!("{gate}={value}: expected true or false")),
        }
    }
    gates
}

/// enforceNodeAllocatable: `pods` limits kubepods; `kube-reserved` and `system-reserved` (or
/// their `-compressible` forms) limit the cgroups kubeReservedCgroup and systemReservedCgroup
/// name to the reserves; `none` or nothing limits nothing.
pub(super) fn enforcement(r: &mut Reader<'_>, name: &str, default: Enforcement) -> Enforcement {
    use ReserveEnforcement::{All, Compressible, Off};
    let Some(values) = r.list(name) else {
        return default;
    };
    let mut out = Enforcement {
        pods: false,
        kube_reserved: Off,
        system_reserved: Off,
    };
    for v in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        let (reserve, how) = match v {
            "pods" => {
                out.pods = true;
                continue;
            }
            "none" => continue,
            "kube-reserved" => (&mut out.kube_reserved, All),
            "kube-reserved-compressible" => (&mut out.kube_reserved, Compressible),
            "system-reserved" => (&mut out.system_reserved, All),
            "system-reserved-compressible" => (&mut out.system_reserved, Compressible),
            other => {
                r.problem(name, format!(
                    "{other:?} is not pods, kube-reserved, system-reserved, their -compressible forms or none"
                ));
                continue;
            }
        };
        if *reserve != Off && *reserve != how {
            let base = v.trim_end_matches("-compressible");
            r.problem(
                name,
                format!("both {base:?} and \"{base}-compressible\" cannot be specified together"),
            );
        }
        *reserve = how;
    }
    out
}

pub(super) fn bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" => Ok(false),
        other => Err(format!("{other:?} is not true or false")),
    }
}

pub(super) fn port(s: &str) -> Result<u16, String> {
    s.trim()
        .parse::<u16>()
        .map_err(|_| format!("port {s:?} is not a number from 0 to 65535"))
}

pub(super) fn ip(s: &str) -> Result<IpAddr, String> {
    s.trim()
        .parse::<IpAddr>()
        .map_err(|_| format!("{s:?} is not an IP address"))
}

/// A period or timeout: more than zero, at most a year.
pub(super) fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration::parse(s)? {
        d if d.is_zero() => Err("must be greater than zero".into()),
        d => up_to_a_year(d),
    }
}

/// A duration of zero to a year.
pub(super) fn some_duration(s: &str) -> Result<Duration, String> {
    up_to_a_year(duration::parse(s)?)
}

fn up_to_a_year(d: Duration) -> Result<Duration, String> {
    if d > MAX_DURATION {
        Err("must be at most a year".into())
    } else {
        Ok(d)
    }
}

/// A graceful shutdown duration: zero (off), or at least a second, as upstream.
pub(super) fn shutdown_period(s: &str) -> Result<Duration, String> {
    match duration::parse(s)? {
        d if !d.is_zero() && d < Duration::from_secs(1) => {
            Err("must be either zero or otherwise >= 1s".into())
        }
        d => up_to_a_year(d),
    }
}

pub(super) fn positive_number(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() => Ok(n),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

pub(super) fn positive_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// A number from `low` to `high`, described as `what` when it is not.
pub(super) fn number_in<T: std::str::FromStr + PartialOrd>(
    s: &str,
    low: T,
    high: T,
    what: &str,
) -> Result<T, String> {
    match s.trim().parse::<T>() {
        Ok(n) if n >= low && n <= high => Ok(n),
        _ => Err(format!("{s:?} is not {what}")),
    }
}

/// A CRI endpoint: `unix://` and an absolute path.
pub(super) fn endpoint(s: &str) -> Result<PathBuf, String> {
    match s.split_once("://") {
        Some(("unix", path)) if path.starts_with('/') => Ok(PathBuf::from(path)),
        Some(("unix", path)) => Err(format!("unix endpoint {path:?} must be an absolute path")),
        Some((scheme, _)) => Err(format!(
            "endpoint scheme {scheme:?} is not supported; use unix:///path/to/socket"
        )),
        None => Err(format!("endpoint {s:?} has no scheme; use unix://{s}")),
    }
}

/// A percentage from 0 to 100.
pub(super) fn percent(s: &str) -> Result<u8, String> {
    number_in(s, 0, 100, "a percentage from 0 to 100")
}

/// containerLogMaxSize: a quantity of bytes, negative to turn rotation off (as upstream). Zero
/// is refused: every log, even an empty one, would be rotated on every check.
pub(super) fn log_max_size(s: &str) -> Result<Option<u64>, String> {
    match crate::pod::parse_quantity(s) {
        Some(n) if n < 0.0 => Ok(None),
        Some(n) if n >= 1.0 && n < u64::MAX as f64 => Ok(Some(n as u64)),
        _ => Err(format!(
            "{s:?} is not a size of at least one byte (like 10Mi), or negative to turn rotation off"
        )),
    }
}
