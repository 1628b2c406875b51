//! Checking an input against a workflow's JSON Schema: every start of a workflow that declares
//! its input type (the schema tells *where* an input is wrong, as a JSON Pointer), and the
//! only check of engines that start runs of a workflow without its code (see
//! [`Workflow::from_description`](super::Workflow::from_description)).
//!
//! Written here rather than taken from a JSON Schema crate on purpose: the schema stands for a
//! Rust type that serde reads, and it must refuse what that type refuses. JSON Schema counts
//! `2.0` as an integer; a Rust integer field does not, so a validator that follows the
//! specification would accept inputs the workers then cannot read.
//!
//! The keywords that input types deriving `schemars::JsonSchema` produce are checked: `type`,
//! `enum`, `const`, `properties`, `required`, `additionalProperties`, `items`, `prefixItems`,
//! `anyOf`, `oneOf`, `allOf`, `not`, the numeric bounds, the length bounds of strings and
//! arrays, and references into `$defs` or `definitions`. Other keywords (`format`,
//! `pattern`, …) are not checked here: the engine that runs the workflow checks every input
//! against its input type again before the first step.

use serde_json::Value;

/// How deep references may nest before a schema counts as cyclic.
const MAX_DEPTH: usize = 64;

pub use crate::error::FieldError;

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pointer.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "at {}: {}", self.pointer, self.message)
        }
    }
}

/// A [`FieldError`] at a pointer, its message formatted.
macro_rules! bad {
    ($at:expr, $($fmt:tt)+) => {
        FieldError { pointer: ($at).to_owned(), message: format!($($fmt)+) }
    };
}

/// A name as one token of a JSON Pointer (`~` and `/` escaped).
fn pointer_token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// Checks `value` against `schema`; the error names the first place that does not match.
pub(crate) fn check(schema: &Value, value: &Value) -> Result<(), FieldError> {
    Checker { root: schema }.check(schema, value, "", 0)
}

struct Checker<'a> {
    root: &'a Value,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        // Written without a fraction, as the input type's integer fields read it (`2.0` is
        // an integer to JSON Schema, not to a Rust integer field).
        "integer" => matches!(v, Value::Number(n) if n.is_i64() || n.is_u64()),
        other => kind(v) == other,
    }
}

impl<'a> Checker<'a> {
    fn resolve(&self, reference: &str) -> Result<&'a Value, String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| format!("the input schema refers outside itself (`{reference}`)"))?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| format!("the input schema refers to `{reference}`, which it lacks"))
    }

    fn check(
        &self,
        schema: &'a Value,
        v: &Value,
        at: &str,
        depth: usize,
    ) -> Result<(), FieldError> {
        if depth > MAX_DEPTH {
            return Err(bad!(at, "the input schema nests too deep"));
        }
        let s = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(bad!(at, "no value is allowed here")),
            Value::Object(s) => s,
            _ => return Ok(()),
        };
        if let Some(Value::String(r)) = s.get("$ref") {
            let target = self.resolve(r).map_err(|m| bad!(at, "{m}"))?;
            self.check(target, v, at, depth + 1)?;
        }
        match s.get("type") {
            Some(Value::String(t)) if !has_type(v, t) => {
                return Err(bad!(at, "expected {t}, found {}", kind(v)));
            }
            Some(Value::Array(ts))
                if !ts.iter().filter_map(Value::as_str).any(|t| has_type(v, t)) =>
            {
                let names: Vec<_> = ts.iter().filter_map(Value::as_str).collect();
                return Err(bad!(
                    at,
                    "expected {}, found {}",
                    names.join(" or "),
                    kind(v)
                ));
            }
            _ => {}
        }
        if let Some(Value::Array(allowed)) = s.get("enum")
            && !allowed.contains(v)
        {
            return Err(bad!(
                at,
                "{v} is not one of {}",
                Value::Array(allowed.clone())
            ));
        }
        if let Some(c) = s.get("const")
            && c != v
        {
            return Err(bad!(at, "expected {c}"));
        }
        for (key, any) in [("anyOf", true), ("oneOf", true), ("allOf", false)] {
            let Some(Value::Array(subs)) = s.get(key) else {
                continue;
            };
            let mut first_err = None;
            let mut matched = 0;
            for sub in subs {
                match self.check(sub, v, at, depth + 1) {
                    Ok(()) => matched += 1,
                    Err(e) => {
                        if !any {
                            return Err(e);
                        }
                        first_err.get_or_insert(e);
                    }
                }
            }
            if any && matched == 0 && !subs.is_empty() {
                return Err(first_err.unwrap_or_else(|| bad!(at, "matches no alternative")));
            }
        }
        if let Some(not) = s.get("not")
            && self.check(not, v, at, depth + 1).is_ok()
        {
            return Err(bad!(at, "this value is not allowed"));
        }
        self.bounds(s, v, at)?;
        match v {
            Value::Object(fields) => {
                if let Some(Value::Array(required)) = s.get("required") {
                    for name in required.iter().filter_map(Value::as_str) {
                        if !fields.contains_key(name) {
                            return Err(bad!(at, "missing field `{name}`"));
                        }
                    }
                }
                let props = s.get("properties").and_then(Value::as_object);
                for (name, field) in fields {
                    let here = format!("{at}/{}", pointer_token(name));
                    match props.and_then(|p| p.get(name)) {
                        Some(sub) => self.check(sub, field, &here, depth + 1)?,
                        None => match s.get("additionalProperties") {
                            Some(Value::Bool(false)) => {
                                return Err(bad!(at, "unknown field `{name}`"));
                            }
                            Some(extra @ Value::Object(_)) => {
                                self.check(extra, field, &here, depth + 1)?;
                            }
                            _ => {}
                        },
                    }
                }
            }
            Value::Array(items) => {
                let prefix = s.get("prefixItems").and_then(Value::as_array);
                let skip = prefix.map_or(0, Vec::len);
                if let Some(prefix) = prefix {
                    for (i, (sub, item)) in prefix.iter().zip(items).enumerate() {
                        self.check(sub, item, &format!("{at}/{i}"), depth + 1)?;
                    }
                }
                if let Some(sub) = s.get("items") {
                    for (i, item) in items.iter().enumerate().skip(skip) {
                        self.check(sub, item, &format!("{at}/{i}"), depth + 1)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn bounds(
        &self,
        s: &serde_json::Map<String, Value>,
        v: &Value,
        at: &str,
    ) -> Result<(), FieldError> {
        let num = |k: &str| s.get(k).and_then(Value::as_f64);
        let count = |k: &str| s.get(k).and_then(Value::as_u64);
        if let Some(x) = v.as_f64() {
            if let Some(min) = num("minimum")
                && x < min
            {
                return Err(bad!(at, "{v} is below the minimum {min}"));
            }
            if let Some(max) = num("maximum")
                && x > max
            {
                return Err(bad!(at, "{v} is above the maximum {max}"));
            }
            if let Some(min) = num("exclusiveMinimum")
                && x <= min
            {
                return Err(bad!(at, "{v} must be above {min}"));
            }
            if let Some(max) = num("exclusiveMaximum")
                && x >= max
            {
                return Err(bad!(at, "{v} must be below {max}"));
            }
        }
        let len = match v {
            Value::String(t) => Some((t.chars().count() as u64, "minLength", "maxLength")),
            Value::Array(a) => Some((a.len() as u64, "minItems", "maxItems")),
            _ => None,
        };
        if let Some((n, min_key, max_key)) = len {
            if let Some(min) = count(min_key)
                && n < min
            {
                return Err(bad!(at, "shorter than {min}"));
            }
            if let Some(max) = count(max_key)
                && n > max
            {
                return Err(bad!(at, "longer than {max}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::check;

    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)] // read through its schema only
    #[serde(deny_unknown_fields)]
    struct Order {
        order_id: String,
        qty: u32,
        note: Option<String>,
        lines: Vec<Line>,
        channel: Channel,
    }

    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
    }

    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    #[serde(rename_all = "snake_case")]
    enum Channel {
        Web,
        Store,
    }

    #[test]
    fn a_derived_schema_accepts_what_the_type_reads_and_refuses_the_rest() {
        let schema = schemars::schema_for!(Order).to_value();
        let ok = json!({"order_id": "o-1", "qty": 2, "note": null, "lines": [{"sku": "A"}], "channel": "web"});
        assert_eq!(check(&schema, &ok), Ok(()));
        let e = check(
            &schema,
            &json!({"order_id": "o", "qty": 1, "lines": [{"sku": 5}], "channel": "web"}),
        )
        .expect_err("refused");
        assert_eq!(e.pointer, "/lines/0/sku");
        for (bad, says) in [
            (
                json!({"qty": 2, "lines": [], "channel": "web"}),
                "missing field `order_id`",
            ),
            (
                json!({"order_id": 1, "qty": 2, "lines": [], "channel": "web"}),
                "at /order_id: expected string",
            ),
            (
                json!({"order_id": "o", "qty": -1, "lines": [], "channel": "web"}),
                "below the minimum",
            ),
            (
                json!({"order_id": "o", "qty": 1.5, "lines": [], "channel": "web"}),
                "expected integer",
            ),
            (
                json!({"order_id": "o", "qty": 2.0, "lines": [], "channel": "web"}),
                "expected integer",
            ),
            (
                json!({"order_id": "o", "qty": 1, "lines": [{}], "channel": "web"}),
                "at /lines/0: missing field `sku`",
            ),
            (
                json!({"order_id": "o", "qty": 1, "lines": [], "channel": "fax"}),
                "at /channel",
            ),
            (
                json!({"order_id": "o", "qty": 1, "lines": [], "channel": "web", "x": 1}),
                "unknown field `x`",
            ),
            (json!("o-1"), "expected object"),
        ] {
            let e = check(&schema, &bad).expect_err("refused").to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
