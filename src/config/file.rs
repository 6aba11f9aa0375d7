//! Reading a KubeletConfiguration file (YAML or JSON) into raw knobs, reporting every problem at once.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::fields::{ACCEPTED_UPSTREAM_FIELDS, Kind, Raw, RawValue, ZERO_IS_A_VALUE, by_name};

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const KIND: &str = "KubeletConfiguration";

/// What a config file said: its knobs, its problems and the fields that are accepted but not acted on.
#[derive(Debug, Default)]
pub struct FileKnobs {
    pub raw: Raw,
    pub errors: Vec<String>,
    pub ignored: Vec<String>,
}

/// Reads and checks the file at `path`. Every problem names the file and the field.
pub fn read(path: &Path) -> FileKnobs {
    let mut out = FileKnobs::default();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            out.errors
                .push(format!("config file {}: cannot read: {e}", path.display()));
            return out;
        }
    };
    parse(&text, &path.display().to_string(), &mut out);
    out
}

fn parse(text: &str, origin: &str, out: &mut FileKnobs) {
    let doc: Value = match crate::pod::yaml::from_str(text) {
        Ok(doc) => doc,
        Err(e) => {
            out.errors.push(format!(
                "config file {origin}: not valid YAML or JSON: {}",
                crate::pod::yaml::error_text(&e)
            ));
            return;
        }
    };
    let Value::Object(fields) = doc else {
        out.errors.push(format!(
            "config file {origin}: expected a KubeletConfiguration object"
        ));
        return;
    };
    let err = |field: &str, msg: String| format!("config file {origin}: {field}: {msg}");
    match fields.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        other => out.errors.push(err(
            "apiVersion",
            format!("must be {API_VERSION:?}, found {}", describe(other)),
        )),
    }
    match fields.get("kind") {
        Some(Value::String(v)) if v == KIND => {}
        other => out.errors.push(err(
            "kind",
            format!("must be {KIND:?}, found {}", describe(other)),
        )),
    }
    for (name, value) in &fields {
        if name == "apiVersion" || name == "kind" {
            continue;
        }
        if name == "authentication" || name == "authorization" {
            nested(name, value, origin, out);
            continue;
        }
        let Some(field) = by_name(name).filter(|f| f.in_file) else {
            if ACCEPTED_UPSTREAM_FIELDS.contains(&name.as_str()) {
                if !unset(name, value, true) {
                    out.ignored.push(name.clone());
                }
            } else {
                out.errors.push(err(name, "unknown field".into()));
            }
            continue;
        };
        if unset(name, value, false) {
            continue;
        }
        let converted = match field.kind {
            Kind::Scalar | Kind::Bool => scalar(value).map(RawValue::Scalar),
            Kind::Map => string_map(value).map(RawValue::Map),
            Kind::List => string_list(value).map(RawValue::List),
            Kind::Headers => header_map(value).map(RawValue::Map),
            Kind::Records => reservations(value).map(RawValue::List),
        };
        match converted {
            Ok(v) => {
                out.raw.insert(field.name, v);
            }
            Err(msg) => out.errors.push(err(name, msg)),
        }
    }
}

/// The `authentication` and `authorization` blocks: their settings are the dotted fields of the
/// table (`authentication.x509.clientCAFile`, `authorization.mode`, ...); a setting nodelet
/// does not know is accepted and reported as not acted on.
fn nested(block: &str, value: &Value, origin: &str, out: &mut FileKnobs) {
    let Value::Object(settings) = value else {
        out.errors.push(format!(
            "config file {origin}: {block}: expected an object, found {}",
            describe(Some(value))
        ));
        return;
    };
    for (key, v) in settings {
        let dotted = format!("{block}.{key}");
        if let Value::Object(_) = v
            && by_name(&dotted).is_none()
        {
            nested(&dotted, v, origin, out);
            continue;
        }
        match by_name(&dotted) {
            Some(_) if unset(&dotted, v, false) => {}
            Some(field) => match scalar(v) {
                Ok(text) => {
                    out.raw.insert(field.name, RawValue::Scalar(text));
                }
                Err(msg) => out
                    .errors
                    .push(format!("config file {origin}: {dotted}: {msg}")),
            },
            None if unset(&dotted, v, true) => {}
            None => out.ignored.push(dotted),
        }
    }
}

/// Whether the file leaves `field` unset: absent to upstream too, because its value is the Go
/// zero value of a field that is not a pointer (see [`ZERO_IS_A_VALUE`]). `deep` also counts
/// lists and objects of zeros, for fields nodelet only warns about.
fn unset(field: &str, v: &Value, deep: bool) -> bool {
    !ZERO_IS_A_VALUE.contains(&field) && is_zero(v, deep)
}

fn is_zero(v: &Value, deep: bool) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => {
            s.is_empty() || s == "0" || super::duration::parse(s).is_ok_and(|d| d.is_zero())
        }
        Value::Array(items) => deep && items.iter().all(|i| is_zero(i, deep)),
        Value::Object(m) => deep && m.values().all(|i| is_zero(i, deep)),
    }
}

fn describe(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => v.to_string(),
    }
}

fn scalar(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("expected a single value, found {other}")),
    }
}

fn string_list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Array(items) => items.iter().map(list_item).collect(),
        other => Ok(vec![scalar(other)?]),
    }
}

/// A list item: a value, or an object as text: a taint (`registerWithTaints`) as its flag text
/// `key=value:Effect`, a shutdown stage (`shutdownGracePeriodByPodPriority`) as
/// `priority=seconds`.
fn list_item(v: &Value) -> Result<String, String> {
    let Value::Object(m) = v else {
        return scalar(v);
    };
    if m.contains_key("priority") || m.contains_key("shutdownGracePeriodSeconds") {
        let number = |k: &str| m.get(k).and_then(Value::as_i64).unwrap_or(0);
        return match m
            .keys()
            .find(|k| *k != "priority" && *k != "shutdownGracePeriodSeconds")
        {
            Some(other) => Err(format!("unknown field {other:?} in {v}")),
            None => Ok(format!(
                "{}={}",
                number("priority"),
                number("shutdownGracePeriodSeconds")
            )),
        };
    }
    let text = |k: &str| m.get(k).and_then(Value::as_str);
    match (text("key"), text("value"), text("effect")) {
        (Some(key), Some(value), Some(effect)) if !value.is_empty() => {
            Ok(format!("{key}={value}:{effect}"))
        }
        (Some(key), _, Some(effect)) => Ok(format!("{key}:{effect}")),
        _ => Err(format!(
            "expected a value or a taint {{key, value, effect}}, found {v}"
        )),
    }
}

/// reservedMemory's `[{numaNode, limits: {type: quantity}}]`, each as its flag text
/// `node:type=quantity,...`.
fn reservations(v: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "expected a list of {{numaNode, limits}}, found {v}"
        ));
    };
    items
        .iter()
        .map(|item| {
            let node = item.get("numaNode").and_then(Value::as_u64);
            let limits = item.get("limits").and_then(Value::as_object);
            let (Some(node), Some(limits)) = (node, limits) else {
                return Err(format!("expected {{numaNode, limits}}, found {item}"));
            };
            let limits = limits
                .iter()
                .map(|(k, q)| Ok(format!("{k}={}", scalar(q)?)))
                .collect::<Result<Vec<_>, String>>()?;
            Ok(format!("{node}:{}", limits.join(",")))
        })
        .collect()
}

fn string_map(v: &Value) -> Result<BTreeMap<String, Vec<String>>, String> {
    let Value::Object(m) = v else {
        return Err(format!("expected a map of strings, found {v}"));
    };
    m.iter()
        .map(|(k, v)| Ok((k.clone(), vec![scalar(v)?])))
        .collect()
}

/// Header values are often credentials: no message shows them.
fn header_map(v: &Value) -> Result<BTreeMap<String, Vec<String>>, String> {
    let Value::Object(m) = v else {
        return Err("expected a map of string lists (the value is not shown)".into());
    };
    let hidden = |k: &str| format!("header {k:?}: expected strings (the value is not shown)");
    m.iter()
        .map(|(k, v)| match v {
            Value::Array(items) => Ok((
                k.clone(),
                items
                    .iter()
                    .map(scalar)
                    .collect::<Result<_, _>>()
                    .map_err(|_| hidden(k))?,
            )),
            other => Ok((k.clone(), vec![scalar(other).map_err(|_| hidden(k))?])),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(text: &str) -> FileKnobs {
        let mut out = FileKnobs::default();
        parse(text, "test.yaml", &mut out);
        out
    }

    #[test]
    fn yaml_and_json_files_give_the_same_knobs() {
        let yaml = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: 1234\nstaticPodPath: /etc/m\n",
        );
        let json = knobs(
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","healthzPort":1234,"staticPodPath":"/etc/m"}"#,
        );
        assert!(yaml.errors.is_empty(), "{:?}", yaml.errors);
        assert_eq!(yaml.raw, json.raw);
        assert_eq!(
            yaml.raw.get("healthzPort"),
            Some(&RawValue::Scalar("1234".into()))
        );
    }

    #[test]
    fn unknown_fields_and_wrong_kind_are_all_reported() {
        let out = knobs("apiVersion: v1\nkind: Pod\nbogus: 1\nsyncFrequency: [1]\n");
        assert_eq!(out.errors.len(), 4, "{:?}", out.errors);
        assert!(
            out.errors
                .iter()
                .any(|e| e.contains("bogus: unknown field"))
        );
        assert!(
            out.errors
                .iter()
                .all(|e| e.starts_with("config file test.yaml"))
        );
    }

    #[test]
    fn the_authentication_and_authorization_blocks_give_their_dotted_settings() {
        let out = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication:\n  x509:\n    clientCAFile: /etc/ca.crt\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: true\n    cacheTTL: 1m\n  future: {x: 1}\nauthorization:\n  mode: Webhook\n  webhook: {cacheAuthorizedTTL: 1m}\n",
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            out.raw.get("authentication.x509.clientCAFile"),
            Some(&RawValue::Scalar("/etc/ca.crt".into()))
        );
        assert_eq!(
            out.raw.get("authentication.anonymous.enabled"),
            Some(&RawValue::Scalar("true".into()))
        );
        assert_eq!(
            out.raw.get("authentication.webhook.cacheTTL"),
            Some(&RawValue::Scalar("1m".into()))
        );
        assert_eq!(
            out.raw.get("authorization.mode"),
            Some(&RawValue::Scalar("Webhook".into()))
        );
        assert_eq!(
            out.raw.get("authorization.webhook.cacheAuthorizedTTL"),
            Some(&RawValue::Scalar("1m".into()))
        );
        assert_eq!(out.ignored, vec!["authentication.future.x".to_string()]);
    }

    #[test]
    fn a_kubeadm_file_with_its_zero_values_means_the_defaults() {
        let out = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 0s\nport: 0\nhealthzPort: 0\naddress: \"\"\ncgroupDriver: cgroupfs\ncrashLoopBackOff: {}\nimageMaximumGCAge: 0s\nlogging:\n  flushFrequency: 0\n  options:\n    json: {infoBufferSize: \"0\"}\n  verbosity: 0\nauthentication:\n  anonymous: {enabled: false}\n  webhook: {cacheTTL: 0s, enabled: true}\nauthorization:\n  webhook: {cacheAuthorizedTTL: 0s}\ncpuCFSQuota: false\nenableControllerAttachDetach: false\nevictionHard: {}\n",
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        let set: Vec<&str> = out.raw.keys().copied().collect();
        assert_eq!(
            set,
            [
                "authentication.anonymous.enabled",
                "authentication.webhook.enabled",
                "cgroupDriver",
                "cpuCFSQuota",
                "evictionHard",
                "healthzPort",
            ]
        );
        assert_eq!(
            out.ignored,
            vec!["enableControllerAttachDetach".to_string()]
        );
    }

    #[test]
    fn upstream_fields_not_acted_on_are_accepted() {
        let out = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstreamingConnectionIdleTimeout: 4h\nclusterDNS: [10.96.0.10]\n",
        );
        assert!(out.errors.is_empty());
        assert_eq!(
            out.ignored,
            vec!["streamingConnectionIdleTimeout".to_string()]
        );
        assert_eq!(
            out.raw.get("clusterDNS"),
            Some(&RawValue::List(vec!["10.96.0.10".into()]))
        );
    }

    #[test]
    fn shutdown_stages_read_as_priority_and_seconds() {
        let out = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: 20}\n- priority: 2000000000\n  shutdownGracePeriodSeconds: 5\n",
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            out.raw.get("shutdownGracePeriodByPodPriority"),
            Some(&RawValue::List(vec!["0=20".into(), "2000000000=5".into()]))
        );
        let out = knobs(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n- {priority: 1, seconds: 2}\n",
        );
        assert!(out.errors[0].contains("\"seconds\""), "{:?}", out.errors);
    }
}
