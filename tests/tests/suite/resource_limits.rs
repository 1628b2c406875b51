//! Operators read and change the limits of remote resources through the HTTP API, the
//! `sagaflow` command and the console, on both backends: the listing shows a declared
//! resource with its load, an override is obeyed by the running engine and stored with who
//! set it and why, limits that are not valid are refused with the reason and change nothing,
//! a read-only token cannot change them, and an unknown resource is told apart. Then an
//! operator overrides limits in headless Chromium (SQLite).
//!
//! The `sagaflow` command tests need the binary: `cargo build --workspace --bins`.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use sagaflow::{
    CompensationShare, Engine, Rate, Resource, ResourceLimits, ResourceView, StepContext,
    StepError, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, fast_builder, sqlite_db};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::cli;
use crate::console::{self, XSS};
use crate::fixtures::{admin_tokens, answer, serve_admin};

const OPS: &str = "ops-limits-secret-0123456789";
const VIEW: &str = "view-limits-secret-0123456789";
const WAIT: Duration = Duration::from_secs(30);

/// `partner_call@1`: one step that calls resource `partner` and finishes once the test
/// opens its gate.
fn partner_call(gate: Arc<Semaphore>) -> Workflow {
    Workflow::builder("partner_call", 1)
        .step_using("call", gate, |gate, _ctx: StepContext| async move {
            let _pass = gate
                .acquire()
                .await
                .map_err(|_| StepError::refused("gate", "closed"))?;
            Ok::<_, StepError>(())
        })
        .resource("partner")
        .build()
        .expect("valid")
}

/// The code's limits of `partner`: one attempt at a time.
fn partner() -> Resource {
    Resource::new("partner").max_in_flight(1)
}

struct Served {
    engine: Engine,
    gate: Arc<Semaphore>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Lets every attempt finish, then stops.
    async fn stop(self) {
        self.gate.add_permits(1_000);
        self.engine.shutdown().await;
        self.server.abort();
    }
}

/// An engine declaring `partner` (and `quiet`, with no limits), serving the API and the
/// console with an operator and a read-only token.
async fn serve(db: &TestDb) -> Served {
    let gate = Arc::new(Semaphore::new(0));
    let engine = fast_builder(db)
        .with_workflow(partner_call(gate.clone()))
        .with_resource(partner())
        .with_resource(Resource::new("quiet"))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
    Served {
        engine,
        gate,
        addr,
        server,
    }
}

/// `partner` as the engine reads it.
async fn stored(engine: &Engine) -> ResourceView {
    engine
        .resources()
        .await
        .expect("resources")
        .into_iter()
        .find(|r| r.name == "partner")
        .expect("partner is stored")
}

/// Starts `n` runs calling `partner`.
async fn start_calls(engine: &Engine, n: usize) {
    for _ in 0..n {
        engine
            .start("partner_call", &json!({}))
            .await
            .expect("start");
    }
}

/// Waits until `partner` has `in_flight` attempts running and `waiting` steps due.
async fn until_load(engine: &Engine, in_flight: i64, waiting: i64, b: &str) {
    eventually(
        WAIT,
        &format!("[{b}] partner at {in_flight} in flight, {waiting} waiting"),
        || async {
            let r = stored(engine).await;
            (r.in_flight, r.waiting) == (in_flight, waiting)
        },
    )
    .await;
}

fn max_in_flight(n: u32) -> ResourceLimits {
    ResourceLimits {
        max_in_flight: Some(n),
        ..ResourceLimits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_api_lists_sets_and_clears_resource_limits() {
    for db in backends().await {
        let b = db.backend;
        let s = serve(&db).await;
        let http = reqwest::Client::new();
        let (_, doc) = answer(http.get(s.url("/api/v1/openapi.json")).bearer_auth(VIEW)).await;
        let answers = crate::openapi::Answers::new(doc);
        let limits_path = "/api/v1/resources/{name}/limits";
        let partner_limits = s.url("/api/v1/resources/partner/limits");

        // Three calls, one at a time: one in flight, two waiting, as the listing says.
        start_calls(&s.engine, 3).await;
        until_load(&s.engine, 1, 2, b).await;
        let (status, list) = answer(http.get(s.url("/api/v1/resources")).bearer_auth(VIEW)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {list}");
        answers.check("get", "/api/v1/resources", status, &list, b);
        let names: Vec<&str> = list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, ["partner", "quiet"], "[{b}] {list}");
        let listed = &list["resources"][0];
        assert_eq!(
            (
                &listed["limits"],
                &listed["defaults"],
                &listed["override_limits"],
                &listed["in_flight"],
                &listed["waiting"]
            ),
            (
                &json!({ "max_in_flight": 1 }),
                &json!({ "max_in_flight": 1 }),
                &Value::Null,
                &json!(1),
                &json!(2)
            ),
            "[{b}] {listed}"
        );

        // Refused, and nothing changes: no token, a read-only token, limits that are not
        // valid, unknown fields, no reason, an unknown resource.
        let before = stored(&s.engine).await;
        let (status, _) = answer(
            http.put(&partner_limits)
                .json(&json!({ "limits": { "max_in_flight": 3 }, "reason": "r" })),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}]");
        for request in [
            http.put(&partner_limits)
                .json(&json!({ "limits": { "max_in_flight": 3 }, "reason": "more" })),
            http.delete(&partner_limits)
                .json(&json!({ "reason": "back to the code's" })),
        ] {
            let (status, body) = answer(request.bearer_auth(VIEW)).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::FORBIDDEN, Some("forbidden")),
                "[{b}] {body}"
            );
            answers.check("put", limits_path, status, &body, b);
        }
        for (body, code, says) in [
            (
                json!({ "limits": { "max_in_flight": 0 }, "reason": "zero" }),
                "invalid_limits",
                "a concurrency limit must be at least 1",
            ),
            (
                json!({ "limits": { "rate": { "limit": 5, "period_ms": 172_800_000 } }, "reason": "two days" }),
                "invalid_limits",
                "at most a day",
            ),
            (
                json!({ "limits": { "max_in_flight": 2, "compensation_share": { "in_flight": 2 } }, "reason": "all of it" }),
                "invalid_limits",
                "must be less than max_in_flight (2)",
            ),
            (
                json!({ "limits": { "compensation_share": { "rate": 1 } }, "reason": "no rate" }),
                "invalid_limits",
                "a compensation share of the rate needs a rate",
            ),
            (
                json!({ "limits": { "max_inflight": 3 }, "reason": "typo" }),
                "invalid_body",
                "unknown field `max_inflight`",
            ),
            (
                json!({ "limits": { "max_in_flight": 3 }, "reason": "r", "force": true }),
                "invalid_body",
                "unknown field `force`",
            ),
            (
                json!({ "limits": { "max_in_flight": 3 }, "reason": "  " }),
                "reason_required",
                "needs a reason",
            ),
            (
                json!({ "reason": "no limits" }),
                "invalid_body",
                "missing field `limits`",
            ),
        ] {
            let (status, answer_body) =
                answer(http.put(&partner_limits).bearer_auth(OPS).json(&body)).await;
            assert_eq!(
                (status, answer_body["error"]["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some(code)),
                "[{b}] {body}: {answer_body}"
            );
            let message = answer_body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(says), "[{b}] {body}: {message}");
            answers.check("put", limits_path, status, &answer_body, b);
        }
        let (status, body) = answer(
            http.put(s.url("/api/v1/resources/nowhere/limits"))
                .bearer_auth(OPS)
                .json(&json!({ "limits": { "max_in_flight": 3 }, "reason": "r" })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("resource_not_found")),
            "[{b}] {body}"
        );
        answers.check("put", limits_path, status, &body, b);
        assert_eq!(
            stored(&s.engine).await,
            before,
            "[{b}] a refusal changed it"
        );

        // Set: stored with who and why, and the engine claims up to the new limit.
        let (status, set) = answer(
            http.put(&partner_limits).bearer_auth(OPS).json(&json!({
                "limits": { "max_in_flight": 3, "rate": { "limit": 50, "period_ms": 1000, "burst": 5 } },
                "reason": "partner raised our quota",
            })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {set}");
        answers.check("put", limits_path, status, &set, b);
        assert_eq!(
            (set["actor"].as_str(), set["reason"].as_str()),
            (Some("api:ops"), Some("partner raised our quota")),
            "[{b}] {set}"
        );
        let expected = ResourceLimits {
            max_in_flight: Some(3),
            max_in_flight_per_key: None,
            rate: Some(Rate {
                limit: 50,
                period_ms: 1000,
                burst: 5,
            }),
            ..ResourceLimits::default()
        };
        let now = stored(&s.engine).await;
        assert_eq!(
            (
                now.limits,
                now.override_limits,
                now.defaults,
                now.override_by.as_deref(),
                now.override_reason.as_deref()
            ),
            (
                expected.clone(),
                Some(expected.clone()),
                max_in_flight(1),
                Some("api:ops"),
                Some("partner raised our quota")
            ),
            "[{b}]"
        );
        assert_eq!(set["resource"]["limits"], json!(expected), "[{b}] {set}");
        until_load(&s.engine, 3, 0, b).await;

        // Clear: the code's limits again.
        let (status, body) = answer(
            http.delete(&partner_limits)
                .bearer_auth(OPS)
                .json(&json!({ "reason": "" })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("reason_required")),
            "[{b}] {body}"
        );
        let (status, cleared) = answer(
            http.delete(&partner_limits)
                .bearer_auth(OPS)
                .json(&json!({ "reason": "quota back to normal" })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {cleared}");
        answers.check("delete", limits_path, status, &cleared, b);
        assert_eq!(cleared["actor"], "api:ops", "[{b}] {cleared}");
        let now = stored(&s.engine).await;
        assert_eq!(
            (now.limits, now.override_limits, now.override_by),
            (max_in_flight(1), None, None),
            "[{b}]"
        );
        let (status, body) = answer(
            http.delete(s.url("/api/v1/resources/nowhere/limits"))
                .bearer_auth(OPS)
                .json(&json!({ "reason": "r" })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("resource_not_found")),
            "[{b}] {body}"
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_cli_sets_and_resets_resource_limits() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let s = serve(&db).await;
        start_calls(&s.engine, 2).await;
        until_load(&s.engine, 1, 1, b).await;

        // The listing, with its load, as a table and as JSON (with `list` or without).
        let listed = cli::json(url, &["resources"]).await;
        let partner = &listed["resources"][0];
        assert_eq!(
            (
                partner["name"].as_str(),
                &partner["limits"],
                &partner["in_flight"],
                &partner["waiting"]
            ),
            (
                Some("partner"),
                &json!({ "max_in_flight": 1 }),
                &json!(1),
                &json!(1)
            ),
            "[{b}] {listed}"
        );
        assert_eq!(
            cli::json(url, &["resources", "list"]).await,
            listed,
            "[{b}]"
        );
        let o = cli::sagaflow(url, &["resources"]).await;
        cli::code(&o, 0, "resources");
        let table = cli::stdout(&o);
        let row = table
            .lines()
            .find(|l| l.starts_with("partner "))
            .unwrap_or_else(|| panic!("[{b}] no partner row in\n{table}"));
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            [
                "partner",
                "1",
                "1",
                "1 in flight",
                "no breaker",
                "-",
                "-",
                "1 in flight"
            ],
            "[{b}] {table}"
        );
        assert!(
            table.contains("quiet") && table.contains("unlimited"),
            "[{b}] {table}"
        );

        // Set some limits: the others stay as they were; recorded as cli:<operator>.
        let set = cli::json(
            url,
            &[
                "resources",
                "set",
                "partner",
                "--per-key",
                "2",
                "--rate",
                "20/s",
                "--reason",
                "peak season",
                "--as",
                "alice",
            ],
        )
        .await;
        assert_eq!(
            (
                &set["resource"]["limits"],
                set["actor"].as_str(),
                set["resource"]["override_by"].as_str(),
                set["resource"]["override_reason"].as_str()
            ),
            (
                &json!({
                    "max_in_flight": 1,
                    "max_in_flight_per_key": 2,
                    "rate": { "limit": 20, "period_ms": 1000, "burst": 1 }
                }),
                Some("cli:alice"),
                Some("cli:alice"),
                Some("peak season")
            ),
            "[{b}] {set}"
        );
        // The burst alone, then the concurrency: the running engine obeys the new limit.
        let out = cli::sagaflow(
            url,
            &[
                "resources",
                "set",
                "partner",
                "--burst",
                "4",
                "--max-in-flight",
                "2",
                "--reason",
                "more at once",
                "--as",
                "alice",
            ],
        )
        .await;
        cli::code(&out, 0, "resources set --burst");
        assert!(
            cli::stdout(&out).contains(
                "limits now 2 in flight, 2 per key, 20/s burst 4 (were 1 in flight, 2 per key, 20/s burst 1)"
            ),
            "[{b}] {}",
            cli::stdout(&out)
        );
        until_load(&s.engine, 2, 0, b).await;
        let now = stored(&s.engine).await;
        assert_eq!(
            (now.override_by.as_deref(), now.override_reason.as_deref()),
            (Some("cli:alice"), Some("more at once")),
            "[{b}]"
        );
        // A slot and 5 of the 20 per second kept for compensations, with one slot more.
        let out = cli::sagaflow(
            url,
            &[
                "resources",
                "set",
                "partner",
                "--max-in-flight",
                "3",
                "--compensation-in-flight",
                "1",
                "--compensation-rate",
                "5",
                "--reason",
                "room for refunds",
                "--as",
                "alice",
            ],
        )
        .await;
        cli::code(&out, 0, "resources set --compensation-in-flight");
        assert!(
            cli::stdout(&out).contains(
                "limits now 3 in flight, 2 per key, 20/s burst 4, kept for compensations: \
                 1 in flight, 5/s (were 2 in flight"
            ),
            "[{b}] {}",
            cli::stdout(&out)
        );
        until_load(&s.engine, 2, 0, b).await;

        // Refused with the usage code, and nothing changes.
        for (args, says) in [
            (vec!["--max-in-flight", "0"], "at least 1"),
            (
                vec!["--limits", r#"{"max_in_flight": 0}"#],
                "must be at least 1",
            ),
            (
                vec!["--limits", r#"{"max_inflight": 3}"#],
                "unknown field `max_inflight`",
            ),
            (vec!["--rate", "20/fortnight"], "N/PERIOD"),
            (
                vec!["--compensation-in-flight", "3"],
                "must be less than max_in_flight (3)",
            ),
            (
                vec!["--compensation-rate", "20"],
                "must be less than the rate's limit (20)",
            ),
            (
                vec!["--rate", "none", "--burst", "3"],
                "--burst applies to a rate",
            ),
            (
                vec!["--limits", "{}", "--per-key", "3"],
                "cannot be used with",
            ),
            (vec![], "required"),
        ] {
            let mut all = vec![
                "resources",
                "set",
                "partner",
                "--reason",
                "r",
                "--as",
                "bob",
            ];
            all.extend(&args);
            let o = cli::sagaflow(url, &all).await;
            cli::code(&o, 2, &all.join(" "));
            assert!(
                cli::stderr(&o).contains(says),
                "[{b}] {args:?}: {}",
                cli::stderr(&o)
            );
        }
        let o = cli::sagaflow(
            url,
            &[
                "resources",
                "set",
                "partner",
                "--per-key",
                "3",
                "--as",
                "bob",
            ],
        )
        .await;
        cli::code(&o, 2, "no reason");
        assert_eq!(
            stored(&s.engine).await.override_by.as_deref(),
            Some("cli:alice"),
            "[{b}]"
        );

        // An unknown resource: the not-found code, naming the ones there are.
        for args in [
            &[
                "resources",
                "set",
                "nowhere",
                "--max-in-flight",
                "3",
                "--reason",
                "r",
                "--as",
                "bob",
            ][..],
            &[
                "resources",
                "reset",
                "nowhere",
                "--reason",
                "r",
                "--as",
                "bob",
            ][..],
        ] {
            let o = cli::sagaflow(url, args).await;
            cli::code(&o, 3, &args.join(" "));
            assert!(
                cli::stderr(&o).contains("no resource `nowhere`; the resources are partner, quiet"),
                "[{b}] {}",
                cli::stderr(&o)
            );
        }

        // Reset: the code's limits again.
        let reset = cli::json(
            url,
            &[
                "resources",
                "reset",
                "partner",
                "--reason",
                "season over",
                "--as",
                "alice",
            ],
        )
        .await;
        assert_eq!(
            (
                &reset["resource"]["limits"],
                &reset["resource"]["override_limits"],
                reset["actor"].as_str()
            ),
            (
                &json!({ "max_in_flight": 1 }),
                &Value::Null,
                Some("cli:alice")
            ),
            "[{b}] {reset}"
        );
        let now = stored(&s.engine).await;
        assert_eq!(
            (now.limits, now.override_limits),
            (max_in_flight(1), None),
            "[{b}]"
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_console_lists_resources_and_sets_an_override() {
    for db in backends().await {
        let b = db.backend;
        let s = serve(&db).await;
        let http = console::http();
        let page_url = |p: &str| s.url(p);
        let login = |token: &'static str| {
            let http = http.clone();
            let url = page_url("/console/login");
            async move {
                let r = http
                    .post(url)
                    .form(&[("token", token)])
                    .send()
                    .await
                    .expect("login");
                assert_eq!(r.status(), StatusCode::SEE_OTHER);
                let set = r.headers()["set-cookie"]
                    .to_str()
                    .expect("ascii")
                    .to_owned();
                set.split(';').next().expect("pair").to_owned()
            }
        };
        let get = |path: &str, cookie: &str| {
            let r = http.get(page_url(path)).header("cookie", cookie).send();
            async move {
                let r = r.await.expect("get");
                (r.status(), r.text().await.expect("body"))
            }
        };
        let post = |path: &str, cookie: &str, form: Vec<(&'static str, String)>| {
            let r = http
                .post(page_url(path))
                .header("cookie", cookie)
                .form(&form)
                .send();
            async move {
                let r = r.await.expect("post");
                let status = r.status();
                let location = r
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .map(str::to_owned);
                (status, location, r.text().await.expect("body"))
            }
        };
        let action = "/console/resources/partner/limits";

        // Without a session: the login form.
        let r = http
            .get(s.url("/console/resources"))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "[{b}]");

        // An override whose reason carries markup, and some load.
        s.engine
            .operator()
            .on_behalf_of("api:ops", format!("reason {XSS}"))
            .set_resource_limits("partner", Some(max_in_flight(2)))
            .await
            .expect("override");
        start_calls(&s.engine, 3).await;
        until_load(&s.engine, 2, 1, b).await;

        let ops = login(OPS).await;
        let (status, page) = get("/console/resources", &ops).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {page}");
        assert!(
            page.contains(r#"href="/console/resources""#),
            "[{b}] no nav link"
        );
        assert!(
            page.contains("2 in flight") && page.contains("code's: 1 in flight"),
            "[{b}] {page}"
        );
        assert!(
            !page.contains("<script>document") && !page.contains("<img src=x"),
            "[{b}] unescaped: {page}"
        );
        assert!(
            page.contains("&lt;script&gt;document.title"),
            "[{b}] {page}"
        );
        let row_at = page
            .find(r#"data-resource="partner""#)
            .expect("partner row");
        let row = &page[row_at..];
        let row = &row[..row.find("</tr>").expect("row end")];
        assert!(
            row.contains(r#"<td class="num in-flight">2</td>"#)
                && row.contains(r#"<td class="num waiting">1</td>"#),
            "[{b}] {row}"
        );
        assert!(row.contains("api:ops"), "[{b}] {row}");
        assert!(row.contains(r#"data-action="set-limits""#), "[{b}] {row}");
        let csrf = console::csrf_of(&page);

        // A read-only token sees no form and is refused.
        let viewer = login(VIEW).await;
        let (_, view_page) = get("/console/resources", &viewer).await;
        assert!(view_page.contains("partner"), "[{b}]");
        assert!(
            !view_page.contains("data-action="),
            "[{b}] forms shown to read-only"
        );
        let view_csrf = console::csrf_of(&view_page);
        let form = |csrf: &str, op: &str, limits: &str, reason: &str| {
            vec![
                ("csrf", csrf.to_owned()),
                ("op", op.to_owned()),
                ("limits", limits.to_owned()),
                ("reason", reason.to_owned()),
            ]
        };
        let (status, _, _) = post(action, &viewer, form(&view_csrf, "clear", "", "r")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        // Without the session's CSRF token: refused.
        let (status, _, _) = post(action, &ops, form(&view_csrf, "clear", "", "r")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        // Not valid, not readable, no reason, unknown resource: said on the page.
        for (limits, reason, status, says) in [
            (
                r#"{"max_in_flight": 0}"#,
                "r",
                StatusCode::BAD_REQUEST,
                "must be at least 1",
            ),
            (
                r#"{"max_inflight": 4}"#,
                "r",
                StatusCode::BAD_REQUEST,
                "unknown field `max_inflight`",
            ),
            ("four", "r", StatusCode::BAD_REQUEST, "cannot be read"),
            (
                r#"{"max_in_flight": 4}"#,
                " ",
                StatusCode::BAD_REQUEST,
                "needs a reason",
            ),
        ] {
            let (got, _, body) = post(action, &ops, form(&csrf, "set", limits, reason)).await;
            assert_eq!(got, status, "[{b}] {limits}: {body}");
            assert!(body.contains(says), "[{b}] {limits}: {body}");
        }
        let (status, _, _) = post(
            "/console/resources/nowhere/limits",
            &ops,
            form(&csrf, "set", r#"{"max_in_flight": 4}"#, "r"),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "[{b}]");
        assert_eq!(
            stored(&s.engine).await.limits,
            max_in_flight(2),
            "[{b}] changed"
        );

        // Set, then clear.
        let (status, location, _) = post(
            action,
            &ops,
            form(
                &csrf,
                "set",
                r#"{"max_in_flight": 3, "max_in_flight_per_key": 3}"#,
                "more room",
            ),
        )
        .await;
        assert_eq!(
            (status, location.as_deref()),
            (
                StatusCode::SEE_OTHER,
                Some("/console/resources?done=set&resource=partner")
            ),
            "[{b}]"
        );
        let now = stored(&s.engine).await;
        assert_eq!(
            (
                now.limits.max_in_flight,
                now.limits.max_in_flight_per_key,
                now.override_by.as_deref(),
                now.override_reason.as_deref()
            ),
            (Some(3), Some(3), Some("console:ops"), Some("more room")),
            "[{b}]"
        );
        until_load(&s.engine, 3, 0, b).await;
        let (_, page) = get("/console/resources?done=set&resource=partner", &ops).await;
        assert!(
            page.contains("3 in flight, 3 per key") && page.contains("overridden"),
            "[{b}] {page}"
        );
        // A link's notice names only a resource there is.
        let (_, page) = get("/console/resources?done=set&resource=elsewhere", &ops).await;
        assert!(!page.contains("Done:"), "[{b}] {page}");
        let (status, location, _) = post(action, &ops, form(&csrf, "clear", "", "done")).await;
        assert_eq!(
            (status, location.as_deref()),
            (
                StatusCode::SEE_OTHER,
                Some("/console/resources?done=cleared&resource=partner")
            ),
            "[{b}]"
        );
        let now = stored(&s.engine).await;
        assert_eq!(
            (now.limits, now.override_limits),
            (max_in_flight(1), None),
            "[{b}]"
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_console_operator_overrides_limits_in_the_browser() {
    let Some(driver) = console::chromedriver() else {
        return;
    };
    let _turn = crate::fixtures::timing_turn().await;
    let db = sqlite_db();
    let s = serve(&db).await;
    start_calls(&s.engine, 2).await;
    until_load(&s.engine, 1, 1, "sqlite").await;
    let driver = console::Driver::start(&driver).await;
    let b = driver.browser().await;
    let walked = AssertUnwindSafe(override_in_browser(&b, &s))
        .catch_unwind()
        .await;
    let _ = b.close().await;
    drop(driver);
    s.stop().await;
    if let Err(panic) = walked {
        std::panic::resume_unwind(panic);
    }
}

async fn override_in_browser(b: &fantoccini::Client, s: &Served) {
    b.goto(&s.url("/console/login")).await.expect("open");
    let field = console::wait_css(b, "input[name=token]").await;
    field.send_keys(OPS).await.expect("type");
    console::click(b, "button[type=submit]").await;
    console::wait_css(b, "#active, p.muted").await;

    // From the navigation to the resources page: partner with its load.
    console::click(b, "header nav a[href='/console/resources']").await;
    let row = "#resources tr[data-resource=partner]";
    console::wait_css(b, row).await;
    assert_eq!(
        console::text_of(b, &format!("{row} td.limits")).await,
        "1 in flight"
    );
    assert_eq!(
        console::text_of(b, &format!("{row} td.in-flight")).await,
        "1"
    );
    assert_eq!(console::text_of(b, &format!("{row} td.waiting")).await, "1");

    // Override: the form starts from the limits in force.
    let form = format!("{row} details[data-action=set-limits]");
    console::click(b, &format!("{form} summary")).await;
    let limits = console::wait_css(b, &format!("{form} textarea[name=limits]")).await;
    let current = limits
        .prop("value")
        .await
        .expect("value")
        .unwrap_or_default();
    let current: Value = serde_json::from_str(&current).expect("JSON in the form");
    assert_eq!(current, json!({ "max_in_flight": 1 }));
    limits.clear().await.expect("clear");
    limits
        .send_keys(
            r#"{"max_in_flight": 3, "rate": {"limit": 20, "period_ms": 1000},
                "compensation_share": {"in_flight": 1}}"#,
        )
        .await
        .expect("type");
    let reason = console::wait_css(b, &format!("{form} textarea[name=reason]")).await;
    reason
        .send_keys("partner raised our quota")
        .await
        .expect("type");
    console::screenshot(b, "console-resources-form.png").await;
    console::click(b, &format!("{form} button.confirm")).await;

    console::wait_css(b, "#notice .flash.ok").await;
    assert_eq!(
        console::text_of(b, &format!("{row} td.limits")).await,
        "3 in flight, 20/s burst 1, kept for compensations: 1 in flight\ncode's: 1 in flight"
    );
    let over = console::text_of(b, &format!("{row} td.override")).await;
    assert!(
        over.contains("console:ops") && over.contains("partner raised our quota"),
        "{over}"
    );
    console::screenshot(b, "console-resources.png").await;
    let now = stored(&s.engine).await;
    assert_eq!(
        (now.limits.max_in_flight, now.override_by.as_deref()),
        (Some(3), Some("console:ops"))
    );
    assert_eq!(
        now.limits.compensation_share,
        Some(CompensationShare {
            in_flight: 1,
            rate: 0
        })
    );
    // Two slots for forward attempts: both calls run.
    until_load(&s.engine, 2, 0, "sqlite").await;

    // Clear it.
    let clear = format!("{row} details[data-action=clear-limits]");
    console::click(b, &format!("{clear} summary")).await;
    let reason = console::wait_css(b, &format!("{clear} textarea[name=reason]")).await;
    reason.send_keys("back to normal").await.expect("type");
    console::click(b, &format!("{clear} button.confirm")).await;
    console::wait_css(b, "#notice .flash.ok").await;
    assert_eq!(
        console::text_of(b, &format!("{row} td.limits")).await,
        "1 in flight"
    );
    assert_eq!(stored(&s.engine).await.override_limits, None);
}
