//! Decoding manifest text (YAML or JSON, one or more documents) into Pods.

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

/// Decodes every document of `text` as a v1 Pod or a PodList (or List) of Pods. Empty documents
/// are skipped. Any document that does not decode fails the whole text: each problem is one
/// message.
pub fn decode_pods(text: &str) -> Result<Vec<Pod>, Vec<String>> {
    let mut pods = Vec::new();
    let mut problems = Vec::new();
    let documents = serde_yaml_ng::Deserializer::from_str(text);
    for (index, document) in documents.enumerate() {
        let doc = index + 1;
        let value = match Value::deserialize(document) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("document {doc}: not valid YAML or JSON: {e}"));
                // A syntax error leaves the parser unable to find the next document.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        match decode_document(value) {
            Ok(found) => pods.extend(found),
            Err(msg) => problems.push(format!("document {doc}: {msg}")),
        }
    }
    if problems.is_empty() {
        Ok(pods)
    } else {
        Err(problems)
    }
}

fn decode_document(value: Value) -> Result<Vec<Pod>, String> {
    let Value::Object(fields) = &value else {
        return Err("expected an object with kind: Pod or PodList".into());
    };
    let kind = fields.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "PodList" && kind != "List" {
        return decode_one(value, false).map(|pod| vec![pod]);
    }
    let items = match fields.get("items") {
        Some(Value::Array(items)) => items.clone(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(format!("{kind}: items must be a list")),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            decode_one(item, kind == "PodList").map_err(|e| format!("items[{i}]: {e}"))
        })
        .collect()
}

/// One Pod; a PodList's items may leave out kind and apiVersion.
fn decode_one(mut value: Value, in_pod_list: bool) -> Result<Pod, String> {
    let Value::Object(fields) = &mut value else {
        return Err("expected an object with kind: Pod".into());
    };
    if in_pod_list {
        fields.entry("kind").or_insert_with(|| Value::from("Pod"));
        fields
            .entry("apiVersion")
            .or_insert_with(|| Value::from("v1"));
    }
    let text_of = |key: &str| fields.get(key).and_then(Value::as_str).unwrap_or("");
    if text_of("kind") != "Pod" {
        return Err(format!("kind must be Pod, found {:?}", text_of("kind")));
    }
    if text_of("apiVersion") != "v1" {
        return Err(format!(
            "apiVersion must be v1, found {:?}",
            text_of("apiVersion")
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("not a valid Pod: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = decode_pods("apiVersion: v1\nkind: Service\n").unwrap_err();
        assert!(err[0].contains("kind must be Pod"), "{err:?}");
        assert!(decode_pods("{{{").is_err());
        assert!(decode_pods("- a\n- b\n").is_err());
        let err = decode_pods("apiVersion: v1\nkind: Pod\nspec: 5\n").unwrap_err();
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
        assert!(decode_pods(bad).unwrap_err()[0].contains("items[0]"));
    }

    #[test]
    fn an_empty_file_holds_no_pods() {
        assert!(decode_pods("").unwrap().is_empty());
        assert!(decode_pods("---\n").unwrap().is_empty());
    }
}
