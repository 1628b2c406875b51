//! What the handlers' annotations cannot say, added to the generated OpenAPI document as
//! JSON, so that the document states exactly what the server accepts and answers (issue 31,
//! item 6; the fuzzer of `tests/tests/suite/http_contract.rs` holds it to that):
//!
//! - an integer's bounds where its `format` is one JSON Schema tools do not know (utoipa
//!   names an unsigned width `u-int32`, `u-int64`, respelled `uint32`, `uint64`, but states
//!   no `maximum`): one more is refused, as the type cannot hold it;
//! - an action's `by_seconds`, 1 to [`EXTEND_MAX`] whatever the action (the others ignore
//!   it, but never one out of bounds);
//! - `start_at` and `start_after_ms` of a start, mutually exclusive (`not` both given), and
//!   the longest `start_after_ms` ([`START_AHEAD_MAX`]);
//! - a callback's body: `{"ok": output}` or `{"error": {…}}`, one key, never `null`;
//! - no text a request carries holds NUL (U+0000), which PostgreSQL cannot store or compare
//!   in text: every string of a parameter or a request body (the caller's own data, any
//!   JSON, aside) gets a pattern that excludes it, as the server refuses it;
//! - the events of `GET /api/v1/runs/{id}/follow` and its `Last-Event-ID` header's positions;
//! - `state=` empty on `GET /api/v1/deliveries`, taken as no filter;
//! - the events of `GET /api/v1/runs/{id}/events`: each a `state` event whose `data` is
//!   a `RunStateEvent` in JSON (OpenAPI 3.1 reads an event stream's `schema` as one event's).
//!
//! Each change names what it changes: a renamed schema or route fails the document's test
//! (`tests/tests/suite/openapi.rs`), which checks that every `$ref` resolves.

use serde_json::{Value, json};

use sagaflow_engine::transition::operator::EXTEND_MAX;

use crate::START_AHEAD_MAX;

/// The name of the callback body's schema in the document.
const CALLBACK_BODY: &str = "CallbackBody";

/// The routes whose request body is a callback's.
const CALLBACK_ROUTES: [&str; 2] = ["/api/v1/callbacks", "/api/v1/callbacks/{token}"];

/// Adds to `doc` what the annotations cannot say (see the module's documentation).
pub(super) fn exact(doc: &mut Value) {
    unsigned_bounds(doc);
    extension_bounds(doc);
    start_exclusive(doc);
    callback_body(doc);
    event_stream(doc);
    follow_stream(doc);
    empty_delivery_state(doc);
    nul_free_requests(doc);
}

/// `GET /api/v1/deliveries?state=` (empty) lists every state, as leaving it out does.
fn empty_delivery_state(doc: &mut Value) {
    let Some(params) = doc
        .pointer_mut("/paths/~1api~1v1~1deliveries/get/parameters")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for p in params.iter_mut().filter(|p| p["name"] == "state") {
        if let Some(schema) = p.get_mut("schema") {
            *schema = json!({"anyOf": [schema.take(), {"const": ""}]});
        }
    }
}

/// The pattern of a string without NUL.
const NUL_FREE: &str = "^[^\\u0000]*$";

/// Every string schema in `v` that names no value set (`enum`, `const`, `format`) excludes
/// NUL: by its pattern, or beside a pattern it already has.
fn nul_free(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let string = match map.get("type") {
                Some(Value::String(t)) => t == "string",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            let named = ["enum", "const", "format"]
                .iter()
                .any(|k| map.contains_key(*k));
            if string && !named {
                if map.contains_key("pattern") {
                    map.insert("allOf".to_owned(), json!([{"pattern": NUL_FREE}]));
                } else {
                    map.insert("pattern".to_owned(), json!(NUL_FREE));
                }
            }
            map.values_mut().for_each(nul_free);
        }
        Value::Array(items) => items.iter_mut().for_each(nul_free),
        _ => {}
    }
}

/// The names of the components `v` refers to.
fn refs(v: &Value, found: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                && !found.iter().any(|f| f == name)
            {
                found.push(name.to_owned());
            }
            map.values().for_each(|v| refs(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
        _ => {}
    }
}

/// [`nul_free`] on every operation's path and query parameters and on every schema a request
/// body uses, directly or through other schemas.
fn nul_free_requests(doc: &mut Value) {
    let mut components = Vec::new();
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for op in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
        {
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params
                    .iter_mut()
                    .filter(|p| p["in"] == "path" || p["in"] == "query")
                {
                    if let Some(schema) = p.get_mut("schema") {
                        nul_free(schema);
                    }
                }
            }
            if let Some(body) = op.get_mut("requestBody") {
                nul_free(body);
                refs(body, &mut components);
            }
        }
    }
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    // Breadth first through the references, each component once.
    let mut i = 0;
    while let Some(name) = components.get(i).cloned() {
        if let Some(schema) = schemas.get_mut(&name) {
            nul_free(schema);
            let mut more = Vec::new();
            refs(schema, &mut more);
            for m in more {
                if !components.contains(&m) {
                    components.push(m);
                }
            }
        }
        i += 1;
    }
}

/// The bounds of each integer `format` utoipa writes that JSON Schema tools do not know, and
/// the name it is written as: utoipa spells an unsigned `u32` `u-int32`.
fn integer_format(format: &str) -> Option<(&'static str, i128, i128)> {
    let bounds = |name, min: i128, max: i128| Some((name, min, max));
    match format {
        "int8" => bounds("int8", i8::MIN.into(), i8::MAX.into()),
        "int16" => bounds("int16", i16::MIN.into(), i16::MAX.into()),
        "u-int8" | "uint8" => bounds("uint8", 0, u8::MAX.into()),
        "u-int16" | "uint16" => bounds("uint16", 0, u16::MAX.into()),
        "u-int32" | "uint32" => bounds("uint32", 0, u32::MAX.into()),
        "u-int64" | "uint64" => bounds("uint64", 0, u64::MAX.into()),
        _ => None,
    }
}

/// Every integer schema of a width JSON Schema tools do not know states its bounds (those it
/// states are kept), with the format spelled `uint32` rather than utoipa's `u-int32`.
fn unsigned_bounds(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some((name, min, max)) = map
                .get("format")
                .and_then(Value::as_str)
                .and_then(integer_format)
            {
                map.insert("format".to_owned(), json!(name));
                map.entry("maximum").or_insert_with(|| number(max));
                map.entry("minimum").or_insert_with(|| number(min));
            }
            map.values_mut().for_each(unsigned_bounds);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_bounds),
        _ => {}
    }
}

/// `n` as a JSON number (every bound of [`integer_format`] fits an `i64` or a `u64`).
fn number(n: i128) -> Value {
    u64::try_from(n)
        .map(Value::from)
        .or_else(|_| i64::try_from(n).map(Value::from))
        .unwrap_or(Value::Null)
}

/// An action's `by_seconds` is 1 to [`EXTEND_MAX`], for every action.
fn extension_bounds(doc: &mut Value) {
    if let Some(by) = doc
        .pointer_mut("/components/schemas/ActionBody/properties/by_seconds")
        .and_then(Value::as_object_mut)
    {
        by.insert("minimum".to_owned(), json!(1));
        by.insert("maximum".to_owned(), json!(EXTEND_MAX.as_secs()));
        by.insert(
            "description".to_owned(),
            json!("Seconds to add to the deadlines in flight, for `extend` (the other actions ignore it)"),
        );
    }
}

/// A start gives `start_at` or `start_after_ms`, not both (`null` is the same as absent);
/// `start_after_ms` is at most [`START_AHEAD_MAX`].
fn start_exclusive(doc: &mut Value) {
    let Some(start) = doc
        .pointer_mut("/components/schemas/StartBody")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if let Some(after) = start
        .get_mut("properties")
        .and_then(|p| p.get_mut("start_after_ms"))
        .and_then(Value::as_object_mut)
    {
        let max = u64::try_from(START_AHEAD_MAX.as_millis()).unwrap_or(u64::MAX);
        after.insert("maximum".to_owned(), json!(max));
    }
    let given = json!({"not": {"type": "null"}});
    start.insert(
        "not".to_owned(),
        json!({
            "description": "`start_at` and `start_after_ms` are mutually exclusive",
            "required": ["start_at", "start_after_ms"],
            "properties": {"start_at": given, "start_after_ms": given},
        }),
    );
}

/// The callback body, `{"ok": output}` or `{"error": {"code", "message", "retryable", …}}`,
/// named [`CALLBACK_BODY`], for both callback routes.
fn callback_body(doc: &mut Value) {
    let schema = json!({
        "description": "What the remote says: `{\"ok\": output}` (the step completes with \
                        `output`) or `{\"error\": {\"code\", \"message\", \"retryable\"}}` \
                        (the step fails with it, and is retried when `retryable`).",
        "oneOf": [
            {
                "type": "object",
                "required": ["ok"],
                "properties": {"ok": {"description": "The step's output: any JSON value"}},
                "additionalProperties": false,
            },
            {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {
                    "type": "object",
                    "description": "The step's error; other members are ignored",
                    "required": ["code", "message", "retryable"],
                    "properties": {
                        "code": {"type": "string", "description": "A short machine-readable code"},
                        "message": {"type": "string"},
                        "retryable": {"type": "boolean", "description": "Whether another attempt may succeed"},
                        "outcome": {
                            "type": "string",
                            "enum": ["unknown", "not_applied", "applied"],
                            "description": "Whether the effect may have happened (default `unknown`)",
                        },
                        "details": {"description": "Structured details: any JSON value"},
                        "retry_after_ms": {
                            "type": ["integer", "null"],
                            "minimum": 0,
                            "maximum": u64::MAX,
                            "description": "The delay asked for before the next attempt",
                        },
                    },
                }},
                "additionalProperties": false,
            },
        ],
    });
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.insert(CALLBACK_BODY.to_owned(), schema);
    }
    let reference = json!({"$ref": format!("#/components/schemas/{CALLBACK_BODY}")});
    for route in CALLBACK_ROUTES {
        let pointer = format!(
            "/paths/{}/post/requestBody/content/application~1json/schema",
            route.replace('~', "~0").replace('/', "~1")
        );
        if let Some(s) = doc.pointer_mut(&pointer) {
            *s = reference.clone();
        }
    }
}

/// Each event of a run's history stream (`GET /api/v1/runs/{id}/follow`): `history`, with
/// its position as `id`, or `progress`, each with a `RunUpdate` as its `data`; the
/// `Last-Event-ID` header takes the positions the `after` parameter takes.
fn follow_stream(doc: &mut Value) {
    let Some(op) = doc.pointer_mut("/paths/~1api~1v1~1runs~1{id}~1follow/get") else {
        return;
    };
    let update = json!({
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"$ref": "#/components/schemas/RunUpdate"},
    });
    if let Some(s) = op.pointer_mut("/responses/200/content/text~1event-stream/schema") {
        *s = json!({
            "description": "One event: `history` (with its position as `id`) or `progress`; \
                            as `data` a `RunUpdate` in JSON",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["event", "id", "data"],
                    "properties": {"event": {"const": "history"}, "id": {"type": "string"}, "data": update},
                },
                {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {"event": {"const": "progress"}, "data": update},
                },
            ],
        });
    }
    let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    let after = params
        .iter()
        .find(|p| p["name"] == "after" && p["in"] == "query")
        .map(|p| p["schema"].clone());
    if let Some(after) = after {
        for p in params
            .iter_mut()
            .filter(|p| p["name"] == "Last-Event-ID" && p["in"] == "header")
        {
            p["schema"] = after.clone();
        }
    }
}

/// Each event of a run's event stream: `event: state` with a `RunStateEvent` as its `data`.
fn event_stream(doc: &mut Value) {
    let pointer =
        "/paths/~1api~1v1~1runs~1{id}~1events/get/responses/200/content/text~1event-stream/schema";
    if let Some(s) = doc.pointer_mut(pointer) {
        *s = json!({
            "description": "One event: `event: state`, and as `data` the run's state in JSON",
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": "state"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": "#/components/schemas/RunStateEvent"},
                },
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_integers_get_their_bounds_and_keep_stated_ones() {
        let mut v = json!({"a": {"type": "integer", "format": "u-int32"},
                           "b": {"type": "integer", "format": "uint64", "minimum": 1, "maximum": 9},
                           "c": {"type": "integer", "format": "int32"}});
        unsigned_bounds(&mut v);
        assert_eq!(v["a"]["maximum"], json!(u32::MAX));
        assert_eq!(v["a"]["format"], json!("uint32"));
        assert_eq!(v["a"]["minimum"], json!(0));
        assert_eq!(v["b"]["maximum"], json!(9));
        assert_eq!(v["b"]["minimum"], json!(1));
        assert!(v["c"].get("maximum").is_none());
    }

    #[test]
    fn request_strings_exclude_nul_beside_their_own_pattern() {
        let mut v = json!({"a": {"type": "string"},
                           "b": {"type": ["string", "null"], "pattern": "\\S"},
                           "c": {"type": "string", "enum": ["x"]},
                           "d": {"type": "integer"}});
        nul_free(&mut v);
        assert_eq!(v["a"]["pattern"], json!(NUL_FREE));
        assert_eq!(v["b"]["pattern"], json!("\\S"));
        assert_eq!(v["b"]["allOf"], json!([{"pattern": NUL_FREE}]));
        assert!(v["c"].get("pattern").is_none());
        assert!(v["d"].get("pattern").is_none());
    }
}
