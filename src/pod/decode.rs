//! Decoding manifest text (YAML or JSON, one or more documents) into Pods, and the ConfigMaps,
//! Secrets and RuntimeClasses that may stand beside them.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::Value;

/// What one manifest holds.
#[derive(Debug, Default)]
pub struct Decoded {
    pub pods: Vec<Pod>,
    pub config_maps: Vec<ConfigMap>,
    pub secrets: Vec<Secret>,
    pub runtime_classes: Vec<RuntimeClass>,
}

/// Decodes every document of `text`: a v1 Pod, ConfigMap or Secret, a node.k8s.io/v1
/// RuntimeClass, a PodList of Pods, or a List of any of them. Empty documents are skipped. Any document that does not decode fails the
/// whole text: each problem is one message. A Secret's values never appear in a message.
pub fn decode_manifest(text: &str) -> Result<Decoded, Vec<String>> {
    let mut out = Decoded::default();
    let mut problems = Vec::new();
    let documents = serde_yaml_ng::Deserializer::from_str(text);
    let budget = super::yaml::Budget::default();
    for (index, document) in documents.enumerate() {
        let doc = index + 1;
        let value = match super::yaml::value(document, &budget) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!(
                    "document {doc}: not valid YAML or JSON: {}",
                    super::yaml::error_text(&e)
                ));
                // A syntax error leaves the parser unable to find the next document.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        if let Err(msg) = decode_document(value, &mut out) {
            problems.push(format!("document {doc}: {msg}"));
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

fn decode_document(value: Value, out: &mut Decoded) -> Result<(), String> {
    let Value::Object(fields) = &value else {
        return Err(
            "expected an object with kind: Pod, ConfigMap, Secret, RuntimeClass or PodList".into(),
        );
    };
    let kind = fields.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "PodList" && kind != "List" {
        return decode_one(value, None, out);
    }
    let items = match fields.get("items") {
        Some(Value::Array(items)) => items.clone(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(format!("{kind}: items must be a list")),
    };
    let implied = (kind == "PodList").then_some("Pod");
    for (i, item) in items.into_iter().enumerate() {
        decode_one(item, implied, out).map_err(|e| format!("items[{i}]: {e}"))?;
    }
    Ok(())
}

/// One object; a PodList's items may leave out kind and apiVersion (`implied`).
fn decode_one(mut value: Value, implied: Option<&str>, out: &mut Decoded) -> Result<(), String> {
    let Value::Object(fields) = &mut value else {
        return Err("expected an object with kind: Pod".into());
    };
    if let Some(kind) = implied {
        fields.entry("kind").or_insert_with(|| Value::from(kind));
        fields
            .entry("apiVersion")
            .or_insert_with(|| Value::from("v1"));
    }
    let text_of = |key: &str| fields.get(key).and_then(Value::as_str).unwrap_or("");
    let kind = text_of("kind").to_string();
    let allowed: &[&str] = if implied.is_some() {
        &["Pod"]
    } else {
        &["Pod", "ConfigMap", "Secret", "RuntimeClass"]
    };
    if !allowed.contains(&kind.as_str()) {
        return Err(format!(
            "kind must be {}, found {kind:?}",
            allowed.join(", ")
        ));
    }
    let api_version = if kind == "RuntimeClass" {
        "node.k8s.io/v1"
    } else {
        "v1"
    };
    if text_of("apiVersion") != api_version {
        return Err(format!(
            "apiVersion of a {kind} must be {api_version}, found {:?}",
            text_of("apiVersion")
        ));
    }
    match kind.as_str() {
        "Pod" => out.pods.push({
            octal_modes(&mut value);

            serde_json::from_value(value).map_err(|e| format!("not a valid Pod: {e}"))?
        }),
        "ConfigMap" => out.config_maps.push(
            serde_json::from_value(value).map_err(|e| format!("not a valid ConfigMap: {e}"))?,
        ),
        "RuntimeClass" => out.runtime_classes.push(
            serde_json::from_value(value).map_err(|e| format!("not a valid RuntimeClass: {e}"))?,
        ),
        _ => out.secrets.push(decode_secret(value)?),
    }
    Ok(())
}

/// File modes written the way Kubernetes manifests write them, `defaultMode: 0400`, are octal
/// in the YAML 1.1 the API machinery reads; this YAML 1.2 parser keeps them as strings, so they
/// are turned into numbers here.
fn octal_modes(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (key, v) in fields.iter_mut() {
                if let Value::String(text) = v
                    && (key == "mode" || key == "defaultMode")
                    && text.len() > 1
                    && text.starts_with('0')
                    && let Ok(n) = i64::from_str_radix(text, 8)
                {
                    *v = Value::from(n);
                } else {
                    octal_modes(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

/// A Secret, decoded so that no error message can echo a value: data and stringData are read by
/// hand, the rest (metadata, type) by serde.
fn decode_secret(mut value: Value) -> Result<Secret, String> {
    let mut take = |key: &str| {
        value
            .as_object_mut()
            .and_then(|m| m.remove(key))
            .unwrap_or(Value::Null)
    };
    let data = take("data");
    let string_data = take("stringData");
    let mut secret: Secret =
        serde_json::from_value(value).map_err(|e| format!("not a valid Secret: {e}"))?;
    let entries = |field: &str, v: Value| -> Result<Vec<(String, String)>, String> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::Object(m) => m
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k, s)),
                    _ => Err(format!("Secret {field}[{k:?}]: the value must be a string")),
                })
                .collect(),
            _ => Err(format!("Secret {field}: must be a map of keys to strings")),
        }
    };
    let mut bytes = BTreeMap::new();
    for (k, v) in entries("data", data)? {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(v.trim())
            .map_err(|_| format!("Secret data[{k:?}]: the value is not valid base64"))?;
        bytes.insert(k, ByteString(decoded));
    }
    let strings: BTreeMap<String, String> =
        entries("stringData", string_data)?.into_iter().collect();
    secret.data = (!bytes.is_empty()).then_some(bytes);
    secret.string_data = (!strings.is_empty()).then_some(strings);
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_pods(text: &str) -> Result<Vec<Pod>, Vec<String>> {
        decode_manifest(text).map(|d| d.pods)
    }

    #[test]
    fn yaml_json_and_multi_document_files_decode() {
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers: [{name: c, image: i}]\n";
        assert_eq!(decode_pods(yaml).unwrap().len(), 1);
        let json =
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[]}}"#;
        assert_eq!(
            decode_pods(json).unwrap()[0].metadata.name.as_deref(),
            Some("a")
        );
        let multi = format!(
            "---\n{yaml}---\n{}\n---\n",
            yaml.replace("name: a", "name: b")
        );
        let pods = decode_pods(&multi).unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[1].metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn other_kinds_and_garbage_are_refused_with_reasons() {
        let err = decode_manifest("apiVersion: v1\nkind: Service\n").unwrap_err();
        assert!(err[0].contains("kind must be Pod"), "{err:?}");
        assert!(decode_manifest("{{{").is_err());
        assert!(decode_manifest("- a\n- b\n").is_err());
        let err = decode_manifest("apiVersion: v1\nkind: Pod\nspec: 5\n").unwrap_err();
        assert!(err[0].contains("not a valid Pod"), "{err:?}");
    }

    #[test]
    fn pod_lists_and_lists_decode() {
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"a"},"spec":{"containers":[]}},{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b"}}]}"#;
        let pods = decode_pods(list).unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[1].metadata.name.as_deref(), Some("b"));
        let yaml = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: c}}\n";
        assert_eq!(decode_pods(yaml).unwrap().len(), 1);
        let bad = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service}\n";
        assert!(decode_manifest(bad).unwrap_err()[0].contains("items[0]"));
    }

    #[test]
    fn an_empty_file_holds_no_pods() {
        assert!(decode_pods("").unwrap().is_empty());
        assert!(decode_pods("---\n").unwrap().is_empty());
    }

    #[test]
    fn config_maps_and_secrets_decode_beside_pods() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: aGk=}\nstringData: {t: x}\n---\napiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: ConfigMap, metadata: {name: d}}]\n";
        let d = decode_manifest(text).unwrap();
        assert_eq!(d.config_maps.len(), 2);
        let secret = &d.secrets[0];
        assert_eq!(secret.data.as_ref().unwrap()["k"].0, b"hi");
        assert_eq!(secret.string_data.as_ref().unwrap()["t"], "x");
        let in_pod_list =
            "apiVersion: v1\nkind: PodList\nitems: [{kind: ConfigMap, metadata: {name: d}}]\n";
        assert!(decode_manifest(in_pod_list).is_err());
    }

    #[test]
    fn yaml_1_1_octal_modes_are_read_as_octal() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes:\n  - {name: a, secret: {secretName: s, defaultMode: 0400, items: [{key: k, path: k, mode: 0644}]}}\n  - {name: b, configMap: {name: c, defaultMode: 420}}\n  containers: []\n";
        let pod = decode_pods(text).unwrap().remove(0);
        let volumes = pod.spec.unwrap().volumes.unwrap();
        let secret = volumes[0].secret.as_ref().unwrap();
        assert_eq!(secret.default_mode, Some(0o400));
        assert_eq!(secret.items.as_ref().unwrap()[0].mode, Some(0o644));
        assert_eq!(
            volumes[1].config_map.as_ref().unwrap().default_mode,
            Some(420)
        );
    }

    #[test]
    fn a_bad_secret_value_is_never_echoed() {
        for text in [
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: 'hunter2!!'}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: [hunter2]}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: !!int hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: !!float hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: !!bool hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: !!binary hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: !custom hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: !!null hunter2}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {j: !!str hunter2, k: !!int hunter2}\n",
        ] {
            let err = decode_manifest(text).unwrap_err().join(" ");
            assert!(err.contains("k") && !err.contains("hunter2"), "{err}");
        }
    }
}
