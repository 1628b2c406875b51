//! The OpenAPI document of the HTTP API (`GET /api/v1/openapi.json`), on both backends: it
//! needs a token, it names every route the router serves, and what the API really answers
//! matches the schemas it documents, strictly enough that a renamed field fails.

use std::net::SocketAddr;
use std::time::Duration;

use crate::fixtures::answer;
use reqwest::StatusCode;
use sagaflow::internals::API_ROUTES;
use sagaflow::{Engine, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, fast_builder};
use serde::Deserialize;
use serde_json::{Value, json};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

#[derive(Deserialize, schemars::JsonSchema)]
struct Order {
    order_id: String,
}

fn order() -> Workflow {
    Workflow::builder("order", 1)
        .input::<Order>()
        .step("reserve", |ctx: StepContext| async move {
            let o: Order = ctx.input()?;
            Ok::<_, StepError>(format!("reserved {}", o.order_id))
        })
        .build()
        .expect("valid")
}

/// `stuck@1`: `charge`, whose refund fails, then `ship`, which is refused: the run stops in
/// `error` with an alert, its steps carrying outputs and error envelopes.
fn stuck() -> Workflow {
    Workflow::builder("stuck", 1)
        .default_retry(sagaflow::RetryPolicy::default().with_max_failures(1))
        .step("charge", |_: StepContext| async {
            Ok::<_, StepError>("charged")
        })
        .compensate(|_: StepContext| async {
            Err::<(), _>(StepError::terminal_unknown(
                "refunds_down",
                "the refund service is down",
            ))
        })
        .step("ship", |_: StepContext| async {
            Err::<(), _>(StepError::refused("no_stock", "nothing to ship"))
        })
        .after(["charge"])
        .build()
        .expect("valid")
}

/// An engine and its API on 127.0.0.1, with an operator and a read-only token.
async fn serve(db: &TestDb) -> (Engine, SocketAddr, tokio::task::JoinHandle<()>) {
    let engine = fast_builder(db)
        .with_workflow(order())
        .with_workflow(stuck())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let (addr, server) =
        crate::fixtures::serve_admin(&engine, crate::fixtures::admin_tokens(OPS, VIEW)).await;
    (engine, addr, server)
}

/// The document, read with the read-only token.
async fn document(http: &reqwest::Client, addr: SocketAddr, b: &str) -> Value {
    let (status, doc) = answer(
        http.get(format!("http://{addr}/api/v1/openapi.json"))
            .bearer_auth(VIEW),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "[{b}] {doc}");
    doc
}

/// Every `$ref` of `v` (a part of the document at `at`) that names no schema of `doc`.
fn dangling(doc: &Value, v: &Value, at: &str, found: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                let known = r
                    .strip_prefix("#/components/schemas/")
                    .is_some_and(|name| doc["components"]["schemas"][name].is_object());
                if !known {
                    found.push(format!("{at}: {r}"));
                }
            }
            for (k, v) in map {
                dangling(doc, v, &format!("{at}/{k}"), found);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                dangling(doc, v, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

/// The document's schemas made strict: an object schema that lists its properties admits no
/// other, so a renamed field fails as a missing one and as an unknown one.
fn strict(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(strict);
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

/// Checks JSON values against the schemas of the document's answers.
pub(crate) struct Answers {
    doc: Value,
    components: Value,
}

impl Answers {
    pub(crate) fn new(doc: Value) -> Self {
        let mut components = doc["components"].clone();
        strict(&mut components);
        Self { doc, components }
    }

    /// The documented schema of the answer to `method path` with `status` in JSON.
    fn schema(&self, method: &str, path: &str, status: u16) -> Value {
        let schema = &self.doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]
            ["schema"];
        assert!(
            schema.is_object(),
            "no JSON answer {status} documented for {method} {path}"
        );
        let mut schema = schema.clone();
        strict(&mut schema);
        schema
    }

    /// A validator of `schema`, whose `$ref`s resolve into the document's components.
    fn validator(&self, schema: Value) -> jsonschema::Validator {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.components,
            "allOf": [schema],
        });
        jsonschema::options()
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("not a valid schema: {e}"))
    }

    /// Why `body` does not match the answer documented for `method path` with `status`.
    fn errors(&self, method: &str, path: &str, status: u16, body: &Value) -> Vec<String> {
        let v = self.validator(self.schema(method, path, status));
        v.iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect()
    }

    /// Asserts that `body` matches the answer documented for `method path` with `status`.
    pub(crate) fn check(
        &self,
        method: &str,
        path: &str,
        status: StatusCode,
        body: &Value,
        b: &str,
    ) {
        let errors = self.errors(method, path, status.as_u16(), body);
        assert!(
            errors.is_empty(),
            "[{b}] {method} {path} {status} does not match its documented schema: {errors:#?}\n{body:#}"
        );
    }

    /// Asserts that `body` matches the component schema `name`.
    fn check_component(&self, name: &str, body: &Value, b: &str) {
        let v = self.validator(json!({ "$ref": format!("#/components/schemas/{name}") }));
        let errors: Vec<String> = v.iter_errors(body).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "[{b}] {name}: {errors:#?}\n{body:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_document_needs_a_token_and_names_every_route_the_router_serves() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}{p}");

        let (status, body) = answer(http.get(url("/api/v1/openapi.json"))).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "[{b}] {body}"
        );
        let doc = document(&http, addr, b).await;
        assert!(
            doc["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1")),
            "[{b}] {}",
            doc["openapi"]
        );

        let mut found = Vec::new();
        dangling(&doc, &doc, "", &mut found);
        assert!(
            found.is_empty(),
            "[{b}] references to no schema: {found:#?}"
        );

        // Every route the router serves is documented, behind the bearer scheme, with the 401
        // its middleware answers; the document names no route the router does not serve.
        let bearer = &doc["components"]["securitySchemes"]["bearer"];
        assert_eq!(
            (bearer["type"].as_str(), bearer["scheme"].as_str()),
            (Some("http"), Some("bearer")),
            "[{b}] {bearer}"
        );
        for (method, path) in API_ROUTES {
            let op = &doc["paths"][path][method];
            assert!(op.is_object(), "[{b}] {method} {path} is not documented");
            assert_eq!(op["security"], json!([{ "bearer": [] }]), "[{b}] {path}");
            assert!(
                op["responses"]["401"].is_object(),
                "[{b}] {method} {path} documents no 401"
            );
        }
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for method in item.as_object().expect("path item").keys() {
                let served = API_ROUTES.contains(&(method.as_str(), path.as_str()))
                    || (method == "get" && path == "/healthz")
                    || (method == "post" && path == "/api/v1/callbacks/{token}")
                    || (method == "post" && path == "/api/v1/callbacks");
                assert!(served, "[{b}] the document names {method} {path}");
            }
        }
        // Health answers without a token, and its entry says so.
        let health = &doc["paths"]["/healthz"]["get"];
        assert!(
            health["security"].is_null() && !health["responses"]["401"].is_object(),
            "[{b}] {health}"
        );

        // The documented action names are the ones the router takes: each reaches the run
        // lookup (404 run_not_found), where another name is an unknown action.
        let act = &doc["paths"]["/api/v1/runs/{id}/actions/{action}"]["post"];
        let param = act["parameters"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "action"))
            .unwrap_or_else(|| panic!("[{b}] no action parameter in {act}"));
        let action_schema = match param["schema"]["$ref"].as_str() {
            Some(r) => &doc["components"]["schemas"][r.rsplit('/').next().unwrap_or_default()],
            None => &param["schema"],
        };
        let actions: Vec<&str> = action_schema["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("[{b}] the actions are no enum: {action_schema}"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            actions.contains(&"retry") && actions.contains(&"cancel"),
            "[{b}] {actions:?}"
        );
        let nobody = sagaflow::Uuid::now_v7();
        for action in actions.iter().copied().chain(["explode"]) {
            let (status, body) = answer(
                http.post(url(&format!("/api/v1/runs/{nobody}/actions/{action}")))
                    .bearer_auth(OPS)
                    .json(&json!({ "reason": "checking the document", "step": "s", "by_seconds": 60 })),
            )
            .await;
            let expected = if action == "explode" {
                "unknown_action"
            } else {
                "run_not_found"
            };
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::NOT_FOUND, Some(expected)),
                "[{b}] {action}: {body}"
            );
        }

        // The list's state filter is documented with the run states.
        let list = &doc["paths"]["/api/v1/runs"]["get"];
        let state = list["parameters"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "state"))
            .unwrap_or_else(|| panic!("[{b}] no state parameter in {list}"));
        assert_eq!(state["in"], "query", "[{b}] {state}");
        let states = &doc["components"]["schemas"]["RunState"]["enum"];
        for s in RunState::ALL {
            assert!(
                states
                    .as_array()
                    .is_some_and(|a| a.contains(&json!(s.as_str()))),
                "[{b}] {s} missing from {states}"
            );
        }

        engine.shutdown().await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_match_the_schemas_the_document_gives_them() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}{p}");
        let answers = Answers::new(document(&http, addr, b).await);
        let start = "/api/v1/workflows/{name}/runs";

        let (status, health) = answer(http.get(url("/healthz"))).await;
        answers.check("get", "/healthz", status, &health, b);

        // Starting: created, then the run holding the business key.
        let order = json!({ "input": { "order_id": "o-1" }, "business_key": "o-1" });
        let (status, created) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(OPS)
                .json(&order),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        answers.check("post", start, status, &created, b);
        let (status, again) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(OPS)
                .json(&order),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {again}");
        answers.check("post", start, status, &again, b);

        // The fields clients read are the documented ones, and a renamed one fails.
        let documented = &answers.doc["components"]["schemas"]["StartAnswer"]["required"];
        for field in ["id", "state", "created"] {
            assert!(
                documented
                    .as_array()
                    .is_some_and(|r| r.contains(&json!(field))),
                "[{b}] {field} is not a required field of StartAnswer: {documented}"
            );
        }
        let mut renamed = created.clone();
        let value = renamed
            .as_object_mut()
            .and_then(|o| o.remove("created"))
            .expect("created");
        renamed["was_created"] = value;
        assert!(
            !answers.errors("post", start, 201, &renamed).is_empty(),
            "[{b}] a renamed field passes: {renamed}"
        );

        // A run that finishes, and one that stops in error with an alert.
        let done: sagaflow::Uuid = created["id"].as_str().expect("id").parse().expect("uuid");
        engine
            .wait(done, Duration::from_secs(30))
            .await
            .expect("completes");
        let stuck = engine.start("stuck", &json!(null)).await.expect("start");
        let run = engine
            .wait(stuck, Duration::from_secs(30))
            .await
            .expect("stops");
        assert_eq!(run.state, RunState::Error, "[{b}]");

        for id in [done, stuck] {
            let (status, detail) = answer(
                http.get(url(&format!("/api/v1/runs/{id}")))
                    .bearer_auth(VIEW),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "[{b}] {detail}");
            answers.check("get", "/api/v1/runs/{id}", status, &detail, b);
        }
        // The preview of an undo: of the run in error, refused for the finished one, and
        // none for an action that undoes nothing.
        let preview = "/api/v1/runs/{id}/actions/{action}/preview";
        let (status, shown) = answer(
            http.get(url(&format!(
                "/api/v1/runs/{stuck}/actions/compensate/preview"
            )))
            .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {shown}");
        assert_eq!(shown["undo"], "compensate", "[{b}] {shown}");
        answers.check("get", preview, status, &shown, b);
        let (status, refused) = answer(
            http.get(url(&format!("/api/v1/runs/{done}/actions/cancel/preview")))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "[{b}] {refused}");
        answers.check("get", preview, status, &refused, b);
        let (status, none) = answer(
            http.get(url(&format!("/api/v1/runs/{stuck}/actions/pause/preview")))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "[{b}] {none}");
        answers.check("get", preview, status, &none, b);
        let (status, list) = answer(http.get(url("/api/v1/runs")).bearer_auth(VIEW)).await;
        assert_eq!(
            (status, list["runs"].as_array().map(Vec::len)),
            (StatusCode::OK, Some(2)),
            "[{b}] {list}"
        );
        answers.check("get", "/api/v1/runs", status, &list, b);

        let (status, alerts) = answer(http.get(url("/api/v1/alerts")).bearer_auth(VIEW)).await;
        assert!(
            alerts["alerts"].as_array().is_some_and(|a| !a.is_empty()),
            "[{b}] {alerts}"
        );
        answers.check("get", "/api/v1/alerts", status, &alerts, b);
        let (status, resolved) = answer(
            http.post(url(&format!(
                "/api/v1/alerts/{}/resolve",
                alerts["alerts"][0]["id"]
            )))
            .bearer_auth(OPS)
            .json(&json!({ "reason": "refunds are handled by hand" })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {resolved}");
        answers.check("post", "/api/v1/alerts/{id}/resolve", status, &resolved, b);
        // The resolved alert, with who and why, as its run's answer documents it.
        let (status, detail) = answer(
            http.get(url(&format!("/api/v1/runs/{stuck}")))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(
            (
                detail["alerts"][0]["resolved_by"].as_str(),
                detail["alerts"][0]["resolution"].as_str()
            ),
            (Some("api:ops"), Some("refunds are handled by hand")),
            "[{b}] {detail}"
        );
        answers.check("get", "/api/v1/runs/{id}", status, &detail, b);

        // The alert's notice, delivered to the log sink by the supervisor leader.
        let deliveries = sagaflow_testkit::eventually_some(
            Duration::from_secs(15),
            "the alert's delivery",
            || async {
                let (status, d) =
                    answer(http.get(url("/api/v1/deliveries")).bearer_auth(VIEW)).await;
                (status == StatusCode::OK
                    && d["deliveries"].as_array().is_some_and(|a| !a.is_empty()))
                .then_some(d)
            },
        )
        .await;
        assert_eq!(
            deliveries["deliveries"][0]["sink"], "log",
            "[{b}] {deliveries}"
        );
        answers.check("get", "/api/v1/deliveries", StatusCode::OK, &deliveries, b);
        let (status, refused) = answer(
            http.post(url(&format!(
                "/api/v1/deliveries/{}/redeliver",
                deliveries["deliveries"][0]["notice_id"]
            )))
            .bearer_auth(OPS),
        )
        .await;
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_dead_lettered")),
            "[{b}] {refused}"
        );
        answers.check(
            "post",
            "/api/v1/deliveries/{id}/redeliver",
            status,
            &refused,
            b,
        );

        let (status, acted) = answer(
            http.post(url(&format!("/api/v1/runs/{stuck}/actions/compensate")))
                .bearer_auth(OPS)
                .json(&json!({ "reason": "checking the document" })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {acted}");
        answers.check(
            "post",
            "/api/v1/runs/{id}/actions/{action}",
            status,
            &acted,
            b,
        );

        let (status, stats) = answer(http.get(url("/api/v1/stats")).bearer_auth(VIEW)).await;
        answers.check("get", "/api/v1/stats", status, &stats, b);
        let (status, defs) = answer(http.get(url("/api/v1/definitions")).bearer_auth(VIEW)).await;
        answers.check("get", "/api/v1/definitions", status, &defs, b);

        // Error answers, with and without `fields`.
        let (status, refused) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(OPS)
                .json(&json!({ "input": { "order_id": 7 } })),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {refused}");
        assert!(refused["error"]["fields"].is_array(), "[{b}] {refused}");
        answers.check("post", start, status, &refused, b);
        let (status, missing) = answer(
            http.get(url(&format!("/api/v1/runs/{}", sagaflow::Uuid::now_v7())))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "[{b}] {missing}");
        answers.check("get", "/api/v1/runs/{id}", status, &missing, b);
        let (status, unauthorized) = answer(http.get(url("/api/v1/stats"))).await;
        answers.check("get", "/api/v1/stats", status, &unauthorized, b);
        let (status, forbidden) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(VIEW)
                .json(&order),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {forbidden}");
        answers.check("post", start, status, &forbidden, b);

        // A server-sent event's data is a RunStateEvent.
        let resp = http
            .get(url(&format!("/api/v1/runs/{done}/events")))
            .bearer_auth(VIEW)
            .send()
            .await
            .expect("events");
        let stream = resp.text().await.expect("a finished run's stream ends");
        let data = stream
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("[{b}] no event in {stream:?}"));
        let data: Value = serde_json::from_str(data).expect("JSON data");
        answers.check_component("RunStateEvent", &data, b);

        engine.shutdown().await;
        server.abort();
    }
}
