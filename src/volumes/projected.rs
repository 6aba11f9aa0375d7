//! The files of configMap, secret, downwardAPI and projected volumes: which keys become which
//! files with which modes, as upstream computes them.

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, KeyToPath, Pod, ServiceAccountTokenProjection, Volume,
};

use super::Inputs;
use super::atomic::{File, Payload};
use crate::objects::{Kind, View};

/// The mode files get when neither the item nor the volume names one (0644).
const DEFAULT_MODE: i32 = 0o644;

/// One object's keys as files: every key, or just `items`. A missing object or key is an error
/// unless `optional`.
fn object_files(
    view: &View,
    kind: Kind,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
    out: &mut Payload,
) -> Result<(), String> {
    let Some(object) = view.get(kind, name) else {
        return if optional {
            Ok(())
        } else {
            Err(View::not_found(kind, name))
        };
    };
    let file = |bytes: &Vec<u8>, mode: Option<i32>| File {
        bytes: bytes.clone(),
        mode: mode.unwrap_or(default_mode) as u32,
    };
    match items {
        None => {
            for (key, bytes) in &object.data {
                out.insert(key.clone(), file(bytes, None));
            }
        }
        Some(items) => {
            for item in items {
                match object.data.get(&item.key) {
                    Some(bytes) => {
                        out.insert(item.path.clone(), file(bytes, item.mode));
                    }
                    None if optional => {}
                    None => return Err(view.no_key(kind, name, &item.key)),
                }
            }
        }
    }
    Ok(())
}

/// `key="value"` lines in key order, values quoted as Go's %q does, as upstream writes them.
fn format_map(map: Option<&std::collections::BTreeMap<String, String>>) -> String {
    let mut lines = Vec::new();
    for (k, v) in map.into_iter().flatten() {
        let mut quoted = String::from("\"");
        for ch in v.chars() {
            match ch {
                '"' => quoted.push_str("\\\""),
                '\\' => quoted.push_str("\\\\"),
                '\n' => quoted.push_str("\\n"),
                '\r' => quoted.push_str("\\r"),
                '\t' => quoted.push_str("\\t"),
                c if c.is_control() => quoted.push_str(&format!("\\x{:02x}", c as u32)),
                c => quoted.push(c),
            }
        }
        quoted.push('"');
        lines.push(format!("{k}={quoted}"));
    }
    lines.join("\n")
}

/// The content of a downwardAPI file's fieldRef.
fn field_file(pod: &Pod, path: &str) -> Result<String, String> {
    let m = &pod.metadata;
    match path {
        "metadata.labels" => Ok(format_map(m.labels.as_ref())),
        "metadata.annotations" => Ok(format_map(m.annotations.as_ref())),
        _ => crate::pod::metadata_field(pod, path)
            .ok_or_else(|| format!("fieldRef {path:?} is not supported in a downwardAPI volume")),
    }
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    inputs: &Inputs<'_>,
    out: &mut Payload,
) -> Result<(), String> {
    for item in items {
        let text = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), _) => field_file(pod, &f.field_path)?,
            (None, Some(r)) => {
                (inputs.resource_field)(r).map_err(|why| format!("{}: {why}", item.path))?
            }
            (None, None) => return Err(format!("{}: no fieldRef or resourceFieldRef", item.path)),
        };
        out.insert(
            item.path.clone(),
            File {
                bytes: text.into_bytes(),
                mode: item.mode.unwrap_or(default_mode) as u32,
            },
        );
    }
    Ok(())
}

/// The token the API server issued for this pod and projection.
fn token_file(
    pod: &Pod,
    projection: &ServiceAccountTokenProjection,
    mode: i32,
    view: &View,
    out: &mut Payload,
) -> Result<(), String> {
    let name = crate::objects::token_name(
        pod.metadata.uid.as_deref().unwrap_or_default(),
        projection
            .expiration_seconds
            .unwrap_or(crate::objects::TOKEN_EXPIRATION_SECONDS),
        projection.audience.as_deref().unwrap_or_default(),
    );
    let token = view
        .get(Kind::ServiceAccountToken, &name)
        .and_then(|t| t.data.get(crate::objects::TOKEN_KEY).cloned())
        .ok_or_else(|| {
            let account = crate::pod::spec(pod)
                .service_account_name
                .as_deref()
                .unwrap_or("default");
            format!("the token of service account {account:?} is not issued yet")
        })?;
    out.insert(
        projection.path.clone(),
        File {
            bytes: token,
            mode: mode as u32,
        },
    );
    Ok(())
}

/// The files of a configMap, secret, downwardAPI or projected volume; `None` for other kinds.
pub fn payload(pod: &Pod, v: &Volume, inputs: &Inputs<'_>) -> Option<Result<Payload, String>> {
    let mut out = Payload::new();
    let view = inputs.objects;
    let result = if let Some(cm) = &v.config_map {
        object_files(
            view,
            Kind::ConfigMap,
            &cm.name,
            cm.items.as_deref(),
            cm.default_mode.unwrap_or(DEFAULT_MODE),
            cm.optional.unwrap_or(false),
            &mut out,
        )
    } else if let Some(s) = &v.secret {
        object_files(
            view,
            Kind::Secret,
            s.secret_name.as_deref().unwrap_or_default(),
            s.items.as_deref(),
            s.default_mode.unwrap_or(DEFAULT_MODE),
            s.optional.unwrap_or(false),
            &mut out,
        )
    } else if let Some(d) = &v.downward_api {
        downward_files(
            pod,
            d.items.as_deref().unwrap_or_default(),
            d.default_mode.unwrap_or(DEFAULT_MODE),
            inputs,
            &mut out,
        )
    } else if let Some(p) = &v.projected {
        let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
        p.sources.iter().flatten().try_for_each(|source| {
            if let Some(cm) = &source.config_map {
                let optional = cm.optional.unwrap_or(false);
                let items = cm.items.as_deref();
                object_files(view, Kind::ConfigMap, &cm.name, items, mode, optional, &mut out)
            } else if let Some(s) = &source.secret {
                let optional = s.optional.unwrap_or(false);
                let items = s.items.as_deref();
                object_files(view, Kind::Secret, &s.name, items, mode, optional, &mut out)
            } else if let Some(d) = &source.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                downward_files(pod, items, mode, inputs, &mut out)
            } else if let Some(t) = &source.service_account_token {
                token_file(pod, t, mode, view, &mut out)
            } else {
                Err("only configMap, secret, downwardAPI and serviceAccountToken sources can be projected".into())
            }
        })
    } else {
        return None;
    };
    Some(result.map(|()| out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_written_sorted_and_quoted() {
        let map = [("b", "x\"y"), ("a", "1\n2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(format_map(Some(&map)), "a=\"1\\n2\"\nb=\"x\\\"y\"");
        assert_eq!(format_map(None), "");
    }

    #[test]
    fn items_pick_keys_and_modes_and_missing_ones_fail_unless_optional() {
        let (writer, reader) =
            crate::objects::store(false, crate::service_links::Store::standalone());
        let cm = crate::objects::config_map(
            serde_yaml_ng::from_str("metadata: {name: cm}\ndata: {a: '1', b: '2'}\n").unwrap(),
        )
        .unwrap();
        writer.replace(crate::types::Source::File, vec![cm]);
        let pod: Pod = serde_yaml_ng::from_str("metadata: {name: p, labels: {x: y}}\n").unwrap();
        let view = reader.view(&pod);
        let no_resources =
            |_: &k8s_openapi::api::core::v1::ResourceFieldSelector| -> Result<String, String> {
                Err("none".into())
            };
        let inputs = Inputs {
            objects: &view,
            resource_field: &no_resources,
        };
        let volume = |yaml: &str| -> Volume { serde_yaml_ng::from_str(yaml).unwrap() };
        let all = payload(&pod, &volume("{name: v, configMap: {name: cm}}"), &inputs)
            .unwrap()
            .unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(all["a"].mode, 0o644);
        let some = payload(
            &pod,
            &volume("{name: v, configMap: {name: cm, defaultMode: 256, items: [{key: b, path: d/b.txt, mode: 384}, {key: a, path: a}]}}"),
            &inputs,
        )
        .unwrap()
        .unwrap();
        assert_eq!(some["d/b.txt"].mode, 0o600);
        assert_eq!(some["a"].mode, 0o400);
        let err = payload(
            &pod,
            &volume("{name: v, configMap: {name: cm, items: [{key: z, path: z}]}}"),
            &inputs,
        )
        .unwrap()
        .unwrap_err();
        assert!(err.contains("couldn't find key z"), "{err}");
        let err = payload(
            &pod,
            &volume("{name: v, secret: {secretName: nope}}"),
            &inputs,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!(err, "secret \"nope\" not found");
        assert!(
            payload(
                &pod,
                &volume("{name: v, secret: {secretName: nope, optional: true}}"),
                &inputs
            )
            .unwrap()
            .unwrap()
            .is_empty()
        );
        let labels = payload(
            &pod,
            &volume("{name: v, projected: {sources: [{downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}, {configMap: {name: cm, items: [{key: a, path: a}]}}]}}"),
            &inputs,
        )
        .unwrap()
        .unwrap();
        assert_eq!(labels["labels"].bytes, b"x=\"y\"");
        assert!(labels.contains_key("a"));
        assert!(payload(&pod, &volume("{name: v, emptyDir: {}}"), &inputs).is_none());
    }
}
