//! Command-line flags with the upstream kubelet's names, built from the knob table.

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, ArgMatches, Command};

use super::fields::{Kind, Raw, RawValue};
use super::{Config, FIELDS};

/// The clap command: every knob of [`FIELDS`] as a `--flag`, its help ending in its default.
pub fn command() -> Command {
    let mut cmd = Command::new("nodelet")
        .about("nodelet: a node agent that does the kubelet's job")
        .disable_help_subcommand(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("version")
                .long("version")
                .action(ArgAction::SetTrue)
                .help(
                    "Print the version as the kubelet does (Kubernetes vX.Y.Z+nodelet-N) and exit",
                ),
        )
        // Like the kubelet's flag parser: a flag given again overrides the earlier value.
        .args_override_self(true);
    for (f, default) in FIELDS.iter().zip(Config::defaults_shown()) {
        if f.flag.is_empty() {
            continue;
        }
        let mut arg = Arg::new(f.name).long(f.flag).help(help(f.help, &default));
        arg = match f.kind {
            Kind::Scalar => arg.num_args(1),
            Kind::Bool => arg
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .value_parser(["true", "false"]),
            Kind::Map | Kind::List | Kind::Records => arg.num_args(1).action(ArgAction::Append),
            Kind::Headers => arg
                .num_args(1)
                .action(ArgAction::Append)
                .value_name("Key:Value"),
        };
        if f.flag == "run-once" {
            arg = arg.alias("runonce");
        }
        if f.flag == "v" {
            arg = arg.short('v');
        }
        if f.flag.starts_with("testing-") {
            arg = arg.hide(true);
        }
        cmd = cmd.arg(arg);
    }
    cmd
}

/// A knob's help text and its default, unless the text says it (a default that depends on other
/// knobs) or there is none to say.
fn help(text: &'static str, default: &serde_json::Value) -> String {
    match default_text(default) {
        Some(shown) if !text.contains("[default") => format!("{text} [default {shown}]"),
        _ => text.to_string(),
    }
}

/// A default as `--help` says it: none for an empty one or an object.
pub(super) fn default_text(default: &serde_json::Value) -> Option<String> {
    match default {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Bool(_) | serde_json::Value::Number(_) => Some(default.to_string()),
        serde_json::Value::Array(items) if !items.is_empty() => Some(
            items
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => None,
    }
}

/// The knobs set on the command line, as raw text; problems found are appended to `errors`.
pub fn to_raw(matches: &ArgMatches, errors: &mut Vec<String>) -> Raw {
    let mut raw = Raw::new();
    for f in FIELDS.iter().filter(|f| !f.flag.is_empty()) {
        let Some(values) = matches.get_many::<String>(f.name) else {
            continue;
        };
        let values: Vec<&String> = values.collect();
        let value = match f.kind {
            Kind::Scalar | Kind::Bool => {
                RawValue::Scalar(values.last().map(|v| v.to_string()).unwrap_or_default())
            }
            Kind::List => RawValue::List(
                values
                    .iter()
                    .flat_map(|v| v.split(','))
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect(),
            ),
            Kind::Records => RawValue::List(
                values
                    .iter()
                    .flat_map(|v| v.split(';'))
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect(),
            ),
            Kind::Map => {
                let mut map = BTreeMap::new();
                for item in values.iter().flat_map(|v| v.split(',')) {
                    let item = item.trim();
                    if item.is_empty() {
                        continue;
                    }
                    match item.split_once(['=', '<']) {
                        Some((k, v)) => {
                            map.insert(k.trim().to_string(), vec![v.trim().to_string()]);
                        }
                        None => errors.push(format!(
                            "--{}: {item:?} is not of the form key=value",
                            f.flag
                        )),
                    }
                }
                RawValue::Map(map)
            }
            Kind::Headers => {
                let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for item in values {
                    match item.split_once(':') {
                        Some((k, v)) if !k.trim().is_empty() => {
                            map.entry(k.trim().to_string())
                                .or_default()
                                .push(v.trim().to_string());
                        }
                        // Not echoed: a header is often a credential.
                        _ => errors.push(format!(
                            "--{}: a value is not of the form Key:Value (not shown: it may be a credential)",
                            f.flag
                        )),
                    }
                }
                RawValue::Map(map)
            }
        };
        raw.insert(f.name, value);
    }
    raw
}
