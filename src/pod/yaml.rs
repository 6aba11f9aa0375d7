//! YAML (or JSON) read into a [`serde_json::Value`] with a bound on how much it may expand.
//! Aliases let a few bytes stand for a large subtree, so a small document can otherwise ask
//! for gigabytes: the nested "billion laughs" and the flat "fat leaf" (one wide anchor named
//! many times) alike. Every value built costs a unit of a budget shared by all the documents
//! of one text (a string two, and one more per 16 bytes); past it, reading stops with an error.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Units one text may spend: at most some 16 MiB of values. A manifest of a hundred pods
/// spends a few tens of thousands.
pub const LIMIT: usize = 500_000;

/// What is left to spend for one text.
pub struct Budget(Cell<usize>);

impl Default for Budget {
    fn default() -> Self {
        Budget(Cell::new(LIMIT))
    }
}

impl Budget {
    fn spend<E: serde::de::Error>(&self, units: usize) -> Result<(), E> {
        match self.0.get().checked_sub(units) {
            Some(left) => {
                self.0.set(left);
                Ok(())
            }
            None => Err(E::custom(format!(
                "the text expands to more than the {LIMIT} units of values one text may hold (YAML aliases?); refused"
            ))),
        }
    }
}

/// Reads one document as a value, spending from `budget`.
pub fn value<'de, D: Deserializer<'de>>(document: D, budget: &Budget) -> Result<Value, D::Error> {
    Node(budget).deserialize(document)
}

/// Reads one text holding a single document.
pub fn from_str(text: &str) -> Result<Value, serde_yaml_ng::Error> {
    value(
        serde_yaml_ng::Deserializer::from_str(text),
        &Budget::default(),
    )
}

/// A reading error as a message that quotes none of the text's values (serde quotes the value
/// it could not take, which may be a Secret's): what went wrong, and where.
pub fn error_text(e: &serde_yaml_ng::Error) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for c in e.to_string().chars() {
        match (quote, c) {
            (None, '"' | '`') => {
                quote = Some(c);
                out.push_str("(value not shown)");
            }
            (Some(open), c) if c == open => quote = None,
            (Some(_), _) => {}
            (None, c) => out.push(c),
        }
    }
    out
}

#[derive(Clone, Copy)]
struct Node<'b>(&'b Budget);

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Node<'_> {
    fn text<E: serde::de::Error>(&self, s: &str) -> Result<(), E> {
        self.0.spend(2 + s.len() / 16)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.spend(1)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.spend(1)?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.spend(1)?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.spend(1)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.text(v)?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.text(&v)?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.0.spend(1)?;
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.spend(1)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.spend(1)?;
        let mut fields = Map::new();
        while let Some(key) = map.next_key_seed(self)? {
            let key = match key {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(A::Error::custom(format!(
                        "a map key must be a string, found {other}"
                    )));
                }
            };
            let value = map.next_value_seed(self)?;
            fields.insert(key, value);
        }
        Ok(Value::Object(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_documents_read_as_serde_json_reads_them() {
        let v = from_str("a: [1, -2, 2.5, true, null, x]\nb: {c: d}\n3: e\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": [1, -2, 2.5, true, null, "x"], "b": {"c": "d"}, "3": "e"})
        );
    }

    #[test]
    fn errors_name_the_place_but_never_a_value() {
        let e = from_str("a:\n  k: !!int hunter2\n").unwrap_err();
        let text = error_text(&e);
        assert!(
            !text.contains("hunter2") && text.contains("line 2"),
            "{text}"
        );
    }

    #[test]
    fn a_fat_leaf_is_refused_before_it_grows() {
        // One anchor of 2,000 values named 2,000 times: 4 million values from 20 KiB.
        let leaf = vec!["x"; 2000].join(", ");
        let refs = vec!["*a"; 2000].join(", ");
        let bomb = format!("a: &a [{leaf}]\nb: [{refs}]\n");
        let e = from_str(&bomb).unwrap_err().to_string();
        assert!(e.contains("expands to more than"), "{e}");
    }

    #[test]
    fn the_budget_is_shared_by_the_documents_of_one_text() {
        let doc = format!("a: [{}]\n", vec!["x"; 150_000].join(", "));
        let budget = Budget::default();
        let text = format!("{doc}---\n{doc}");
        let results: Vec<bool> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| value(d, &budget).is_ok())
            .collect();
        assert_eq!(results, [true, false]);
    }
}
