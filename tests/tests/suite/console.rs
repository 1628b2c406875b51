//! The web console (`/console/`): sessions, cookies, CSRF, roles and escaping over plain HTTP
//! on both backends, then an operator's walk through it in headless Chromium (SQLite; the
//! console reads through the same engine API on either backend).
//!
//! The browser test needs Debian's `chromium` and `chromium-driver`. Without them it skips
//! with a printed line, unless `CI=true` or `SAGAFLOW_REQUIRE_BROWSER=1`, where it fails.
//! Its screenshots go to `SAGAFLOW_SCREENSHOTS` (default: `console-screenshots` under the
//! target directory).

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt as _;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use sagaflow::{Engine, HistoryKind, RetryPolicy, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder, sqlite_db};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use uuid::Uuid;

const OPS: &str = "ops-console-secret-0123456789";
const VIEW: &str = "view-console-secret-0123456789";

/// A payload that would run if anything rendered it unescaped.
pub(crate) const XSS: &str = "<script>document.title='pwned';window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";

/// What the test controls in the `shipment` workflow.
#[derive(Clone)]
struct Controls {
    /// While false, `notify` fails for good (the run stops in `Error`).
    fixed: Arc<AtomicBool>,
    /// Once fixed, `notify` waits here before it succeeds.
    gate: Arc<Semaphore>,
    /// The single step of `held` waits here (never opened: its runs stay running).
    hold: Arc<Semaphore>,
}

impl Controls {
    fn new() -> Self {
        Self {
            fixed: Arc::new(AtomicBool::new(false)),
            gate: Arc::new(Semaphore::new(0)),
            hold: Arc::new(Semaphore::new(0)),
        }
    }
}

/// `shipment@1`: reserve (compensatable) → charge (pivot) → pack and label (in parallel) →
/// notify (retriable, fails for good until fixed).
fn shipment(c: &Controls) -> Workflow {
    let fixed = c.fixed.clone();
    Workflow::builder("shipment", 1)
        .step("reserve", |_ctx: StepContext| async {
            Ok::<_, StepError>("r-1")
        })
        .compensate(|_ctx: StepContext| async { Ok::<_, StepError>(()) })
        .step("charge", |_ctx: StepContext| async {
            Ok::<_, StepError>("ch-1")
        })
        .after(["reserve"])
        .pivot()
        .step("pack", |_ctx: StepContext| async {
            Ok::<_, StepError>("box")
        })
        .after(["charge"])
        .retriable()
        .step("label", |_ctx: StepContext| async {
            Ok::<_, StepError>("lbl")
        })
        .after(["charge"])
        .retriable()
        .step_using(
            "notify",
            (fixed, c.gate.clone()),
            |(fixed, gate), _ctx: StepContext| async move {
                if !fixed.load(Ordering::SeqCst) {
                    return Err(StepError::terminal_unknown(
                        "bad_address",
                        "mailbox <b>does not</b> exist",
                    ));
                }
                let _pass = gate
                    .acquire()
                    .await
                    .map_err(|_| StepError::refused("gate", "closed"))?;
                Ok("sent")
            },
        )
        .after(["pack", "label"])
        .retriable()
        .retry(RetryPolicy::default().with_max_failures(1))
        .build()
        .expect("valid")
}

/// `echo@1`: one step that returns its input (any JSON).
fn echo() -> Workflow {
    Workflow::builder("echo", 1)
        .step("echo", |ctx: StepContext| async move {
            let input: Value = ctx.input()?;
            Ok::<_, StepError>(input)
        })
        .build()
        .expect("valid")
}

/// The input of `typed@1`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct Parcel {
    /// The parcel's tracking number.
    tracking_number: String,
}

/// `typed@1`: a workflow with a declared input type (its schema is published).
fn typed() -> Workflow {
    Workflow::builder("typed", 1)
        .input::<Parcel>()
        .step("track", |_ctx: StepContext| async {
            Ok::<_, StepError>(())
        })
        .build()
        .expect("valid")
}

/// `held@1`: one step that waits for a gate the test never opens.
fn held(c: &Controls) -> Workflow {
    Workflow::builder("held", 1)
        .step_using(
            "wait",
            c.hold.clone(),
            |hold, _ctx: StepContext| async move {
                let _pass = hold
                    .acquire()
                    .await
                    .map_err(|_| StepError::refused("gate", "closed"))?;
                Ok::<_, StepError>(())
            },
        )
        .build()
        .expect("valid")
}

struct Served {
    engine: Engine,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        self.engine.shutdown().await;
        self.server.abort();
    }
}

async fn serve(db: &TestDb, c: &Controls) -> Served {
    let engine = fast_builder(db)
        .with_workflow(shipment(c))
        .with_workflow(echo())
        .with_workflow(held(c))
        .with_workflow(typed())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let (addr, server) =
        crate::fixtures::serve_admin(&engine, crate::fixtures::admin_tokens(OPS, VIEW)).await;
    Served {
        engine,
        addr,
        server,
    }
}

/// A client that shows redirects instead of following them.
pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Logs in with `token`; returns the `Cookie` header value of the session.
async fn login(http: &reqwest::Client, s: &Served, token: &str) -> String {
    let r = http
        .post(s.url("/console/login"))
        .form(&[("token", token)])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r.headers()[SET_COOKIE].to_str().expect("ascii").to_owned();
    set.split(';').next().expect("pair").to_owned()
}

async fn get(http: &reqwest::Client, s: &Served, path: &str, cookie: &str) -> (StatusCode, String) {
    let r = http
        .get(s.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .expect("get");
    let status = r.status();
    (status, r.text().await.expect("body"))
}

async fn post(
    http: &reqwest::Client,
    s: &Served,
    path: &str,
    cookie: &str,
    form: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let r = http
        .post(s.url(path))
        .header("cookie", cookie)
        .form(form)
        .send()
        .await
        .expect("post");
    let (status, headers) = (r.status(), r.headers().clone());
    (status, headers, r.text().await.expect("body"))
}

/// The CSRF token in a page's forms.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page
        .find(r#"name="csrf" value=""#)
        .unwrap_or_else(|| panic!("no CSRF field in {page}"));
    let rest = &page[at + r#"name="csrf" value=""#.len()..];
    rest[..rest.find('"').expect("end")].to_owned()
}

fn operator_events(history: &[sagaflow::HistoryEvent]) -> usize {
    history
        .iter()
        .filter(|h| h.actor.starts_with("console:"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cookies_csrf_roles_and_escaping() {
    for db in backends().await {
        let b = db.backend;
        let c = Controls::new();
        let s = serve(&db, &c).await;
        let http = http();

        // Without a session: pages redirect to the login form, live endpoints answer 401,
        // and the API still wants its bearer token.
        for path in [
            "/console/",
            "/console/runs",
            "/console/alerts",
            "/console/definitions",
            "/console/nope",
        ] {
            let r = http.get(s.url(path)).send().await.expect("get");
            assert_eq!(r.status(), StatusCode::SEE_OTHER, "[{b}] {path}");
            assert_eq!(r.headers()[LOCATION], "/console/login", "[{b}] {path}");
        }
        for path in [
            "/console/fragments/overview",
            "/console/events",
            "/console/events?run=00000000-0000-0000-0000-000000000000",
        ] {
            let r = http.get(s.url(path)).send().await.expect("get");
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "[{b}] {path}");
        }
        let r = http.get(s.url("/api/v1/stats")).send().await.expect("get");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "[{b}]");

        // The login form, with the console's headers.
        let r = http.get(s.url("/console/login")).send().await.expect("get");
        assert_eq!(r.status(), StatusCode::OK, "[{b}]");
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().expect("csp");
        assert!(
            csp.contains("default-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["referrer-policy"], "no-referrer");
        let r = http
            .get(s.url("/console/assets/console.js"))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers()["cache-control"]
                .to_str()
                .expect("cc")
                .contains("max-age")
        );

        // A wrong token: refused with words that do not say what was wrong, nothing set.
        for wrong in ["", "nope", &OPS[..OPS.len() - 1], &format!("{OPS}x")] {
            let r = http
                .post(s.url("/console/login"))
                .form(&[("token", wrong)])
                .send()
                .await
                .expect("post");
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "[{b}] {wrong}");
            assert!(r.headers().get(SET_COOKIE).is_none());
            let body = r.text().await.expect("body");
            assert!(body.contains("That token is not valid."), "{body}");
            assert!(
                wrong.is_empty() || !body.contains(wrong),
                "[{b}] echoed the token"
            );
        }

        // A good token: a session cookie that scripts cannot read, sent only to the console.
        let r = http
            .post(s.url("/console/login"))
            .form(&[("token", OPS)])
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[LOCATION], "/console/");
        let set = r.headers()[SET_COOKIE].to_str().expect("cookie").to_owned();
        let id = set
            .strip_prefix("sagaflow_session=")
            .and_then(|v| v.split(';').next())
            .expect("session cookie");
        assert_eq!(id.len(), 64, "{set}");
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
            assert!(set.contains(attr), "{set}");
        }
        assert!(!set.contains("Secure"), "{set}");
        let ops = format!("sagaflow_session={id}");
        // Behind an HTTPS proxy, the cookie is also Secure.
        let r = http
            .post(s.url("/console/login"))
            .header("x-forwarded-proto", "https")
            .form(&[("token", OPS)])
            .send()
            .await
            .expect("post");
        assert!(
            r.headers()[SET_COOKIE]
                .to_str()
                .expect("c")
                .contains("; Secure")
        );

        // A run whose input, business key, output carry markup: shown as text.
        let input = json!({ "note": XSS });
        let started = s
            .engine
            .start_with(
                "echo",
                &input,
                sagaflow::StartOptions {
                    business_key: Some(format!("key-{XSS}")),
                    ..Default::default()
                },
            )
            .await
            .expect("start");
        expect_state(&s.engine, started.id, RunState::Completed, b).await;
        let held_id = s.engine.start("held", &json!({})).await.expect("start");
        let held_before = s.engine.run(held_id).await.expect("run").expect("some");

        let (status, overview) = get(&http, &s, "/console/", &ops).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {overview}");
        assert!(
            !overview.contains(OPS) && !overview.contains(VIEW),
            "[{b}] secret shown"
        );
        let csrf = csrf_of(&overview);
        for path in [
            format!("/console/runs/{}", started.id),
            "/console/runs".to_owned(),
            "/console/fragments/runs".to_owned(),
            format!("/console/fragments/runs/{}", started.id),
        ] {
            let (status, page) = get(&http, &s, &path, &ops).await;
            assert_eq!(status, StatusCode::OK, "[{b}] {path}");
            assert!(
                !page.contains("<script>document") && !page.contains("<img src=x"),
                "[{b}] {path} unescaped: {page}"
            );
            assert!(
                page.contains("&lt;script&gt;document.title"),
                "[{b}] {path}: {page}"
            );
        }
        // Unknown runs and pages: a page that says so.
        for path in [
            format!("/console/runs/{}", Uuid::now_v7()),
            "/console/runs/not-a-run".to_owned(),
            "/console/no-such-page".to_owned(),
        ] {
            let (status, page) = get(&http, &s, &path, &ops).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "[{b}] {path}");
            assert!(page.contains("Log out"), "[{b}] {path}: a console page");
        }

        // Pages of the runs list, linked by an opaque cursor; a made-up one is refused.
        let (status, first) = get(&http, &s, "/console/runs?limit=1", &ops).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        let at = first
            .find(r#"id="next-page""#)
            .unwrap_or_else(|| panic!("[{b}] no next page: {first}"));
        let href = &first[at..];
        let href = &href[href.find("href=\"").expect("href") + 6..];
        let next = href[..href.find('"').expect("end")].replace("&amp;", "&");
        assert!(
            next.starts_with("/console/runs?limit=1&cursor="),
            "[{b}] {next}"
        );
        let (status, second) = get(&http, &s, &next, &ops).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        let run_of = |page: &str| {
            let at = page.find("data-run=\"").expect("a run row") + 10;
            page[at..at + 36].to_owned()
        };
        assert_ne!(run_of(&first), run_of(&second), "[{b}]");
        let (status, page) = get(&http, &s, "/console/runs?cursor=made-up", &ops).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}]");
        assert!(page.contains("not valid any more"), "[{b}] {page}");

        let (_, defs) = get(&http, &s, "/console/definitions", &ops).await;
        assert!(
            defs.contains("shipment@1") && defs.contains("<svg"),
            "[{b}]"
        );
        // The input schema, pretty-printed.
        assert!(
            defs.contains("&quot;tracking_number&quot;: {"),
            "[{b}] no schema in {defs}"
        );

        // State-changing forms: without the CSRF token, or with another, refused and nothing
        // happens.
        let path = format!("/console/runs/{held_id}/actions/compensate");
        for bad in [None, Some("0".repeat(64)), Some(csrf[1..].to_owned())] {
            let mut form = vec![("reason", "testing")];
            if let Some(t) = &bad {
                form.push(("csrf", t));
            }
            let (status, _, _) = post(&http, &s, &path, &ops, &form).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {bad:?}");
        }
        let history = s.engine.history(held_id).await.expect("history");
        assert_eq!(operator_events(&history), 0, "[{b}]");
        let after = s.engine.run(held_id).await.expect("run").expect("some");
        assert_eq!(after.state, held_before.state, "[{b}]");

        // Read-only: no action on the page, and refused even with its own CSRF token.
        let viewer = login(&http, &s, VIEW).await;
        let (_, page) = get(&http, &s, &format!("/console/runs/{held_id}"), &viewer).await;
        assert!(
            !page.contains("data-action="),
            "[{b}] actions shown to read-only"
        );
        let view_csrf = csrf_of(&page);
        let (status, _, _) = post(
            &http,
            &s,
            &path,
            &viewer,
            &[("csrf", &view_csrf), ("reason", "x")],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        // Another session's token is not this session's.
        let (status, _, _) = post(
            &http,
            &s,
            &path,
            &ops,
            &[("csrf", &view_csrf), ("reason", "x")],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");

        // An action not allowed in the run's state is explained on the page.
        let (status, _, page) = post(
            &http,
            &s,
            &format!("/console/runs/{held_id}/actions/resume"),
            &ops,
            &[("csrf", &csrf), ("reason", "try")],
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "[{b}] {page}");
        assert!(page.contains("Not allowed"), "[{b}] {page}");
        // A reason is required.
        let (status, _, _) =
            post(&http, &s, &path, &ops, &[("csrf", &csrf), ("reason", "  ")]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}]");

        // With the token and a reason: done, recorded with who and why.
        let (status, headers, _) = post(
            &http,
            &s,
            &path,
            &ops,
            &[("csrf", &csrf), ("reason", "customer cancelled <b>now</b>")],
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "[{b}]");
        assert_eq!(
            headers[LOCATION],
            format!("/console/runs/{held_id}?done=compensate")
        );
        let history = s.engine.history(held_id).await.expect("history");
        let ev = history
            .iter()
            .find(|h| h.kind == HistoryKind::OperatorCompensate)
            .unwrap_or_else(|| panic!("[{b}] {history:?}"));
        assert_eq!(ev.actor, "console:ops");
        assert_eq!(
            ev.detail.as_ref().and_then(|d| d["reason"].as_str()),
            Some("customer cancelled <b>now</b>")
        );
        let (_, page) = get(&http, &s, &format!("/console/runs/{held_id}"), &ops).await;
        assert!(
            page.contains("customer cancelled &lt;b&gt;now&lt;/b&gt;"),
            "[{b}]"
        );

        // Resolving an alert: the CSRF token and the operator role, like every action.
        let failing = s.engine.start("shipment", &json!({})).await.expect("start");
        expect_state(&s.engine, failing, RunState::Error, b).await;
        let alert = s
            .engine
            .open_alerts()
            .await
            .expect("alerts")
            .into_iter()
            .find(|a| a.run_id == Some(failing))
            .unwrap_or_else(|| panic!("[{b}] no alert for {failing}"));
        let (status, page) = get(&http, &s, "/console/alerts", &ops).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        assert!(
            page.contains(&format!("/console/alerts/{}/resolve", alert.id)),
            "[{b}]"
        );
        let (_, page) = get(&http, &s, "/console/alerts", &viewer).await;
        assert!(
            !page.contains("/resolve"),
            "[{b}] resolve shown to read-only"
        );
        let resolve = format!("/console/alerts/{}/resolve", alert.id);
        for (cookie, form) in [
            (&ops, vec![]),
            (&ops, vec![("csrf", view_csrf.as_str())]),
            (&viewer, vec![("csrf", view_csrf.as_str())]),
        ] {
            let (status, _, _) = post(&http, &s, &resolve, cookie, &form).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {form:?}");
        }
        let still_open = |alerts: Vec<sagaflow::Alert>| alerts.iter().any(|a| a.id == alert.id);
        assert!(
            still_open(s.engine.open_alerts().await.expect("alerts")),
            "[{b}]"
        );
        // A reason is required, and stored with who resolved it.
        let (status, _, _) = post(&http, &s, &resolve, &ops, &[("csrf", &csrf)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] no reason");
        assert!(
            still_open(s.engine.open_alerts().await.expect("alerts")),
            "[{b}]"
        );
        let (status, _, _) = post(
            &http,
            &s,
            &resolve,
            &ops,
            &[("csrf", &csrf), ("reason", "shipper <i>paged</i>")],
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "[{b}]");
        assert!(
            !still_open(s.engine.open_alerts().await.expect("alerts")),
            "[{b}]"
        );
        let stored = s
            .engine
            .run_alerts(failing)
            .await
            .expect("alerts")
            .into_iter()
            .find(|a| a.id == alert.id)
            .unwrap_or_else(|| panic!("[{b}] the alert"));
        assert_eq!(
            (stored.resolved_by.as_deref(), stored.resolution.as_deref()),
            (Some("console:ops"), Some("shipper <i>paged</i>")),
            "[{b}]"
        );
        // The run's page shows who resolved it and why, escaped.
        let (_, page) = get(&http, &s, &format!("/console/runs/{failing}"), &ops).await;
        assert!(
            page.contains("console:ops") && page.contains("shipper &lt;i&gt;paged&lt;/i&gt;"),
            "[{b}] {page}"
        );
        assert!(!page.contains("<i>paged"), "[{b}] unescaped");

        // A notice a sink gave up on is listed, escaped, and can be sent again.
        let notice = sagaflow_testkit::eventually_some(
            Duration::from_secs(15),
            "the alert's notice to be delivered to the log",
            || async {
                s.engine
                    .deliveries(None, 50)
                    .await
                    .expect("deliveries")
                    .into_iter()
                    .find(|d| d.alert_id == Some(alert.id))
                    .map(|d| d.notice_id)
            },
        )
        .await;
        s.engine
            .store()
            .delivery_record(&sagaflow::internals::store::DeliveryTry {
                notice,
                sink: "gone-sink",
                attempt: 3,
                result: sagaflow::internals::store::DeliveryResult::Dead {
                    error: "<b>refused</b>".into(),
                },
                others: &[],
            })
            .await
            .expect("record");
        let redeliver = format!("/console/deliveries/{notice}/redeliver");
        let (_, page) = get(&http, &s, "/console/alerts", &ops).await;
        assert!(
            page.contains(&redeliver) && page.contains("&lt;b&gt;refused&lt;/b&gt;"),
            "[{b}] the dead letter is not listed"
        );
        let (_, page) = get(&http, &s, "/console/alerts", &viewer).await;
        assert!(
            !page.contains(&redeliver),
            "[{b}] redeliver shown to read-only"
        );
        let (status, _, _) = post(&http, &s, &redeliver, &ops, &[]).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "[{b}] without the CSRF token"
        );
        let (status, _, _) = post(&http, &s, &redeliver, &ops, &[("csrf", &csrf)]).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "[{b}]");
        assert!(
            s.engine
                .deliveries(Some(sagaflow::DeliveryState::Dead), 50)
                .await
                .expect("deliveries")
                .is_empty(),
            "[{b}] still dead after sending again"
        );

        // Logging out needs the token too; then the session is gone.
        let (status, _, _) = post(&http, &s, "/console/logout", &ops, &[]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        let (status, headers, _) =
            post(&http, &s, "/console/logout", &ops, &[("csrf", &csrf)]).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "[{b}]");
        assert!(
            headers[SET_COOKIE]
                .to_str()
                .expect("c")
                .contains("Max-Age=0")
        );
        let r = http
            .get(s.url("/console/"))
            .header("cookie", &ops)
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "[{b}]");

        s.stop().await;
    }
}

// ---------------------------------------------------------------- the browser

/// Whether a missing browser fails the test instead of skipping it.
pub(crate) fn browser_required() -> bool {
    std::env::var("SAGAFLOW_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The chromedriver to drive Chromium with, when both are installed. Otherwise `None` after
/// saying the browser test is skipped, or a failure when the browser is required.
pub(crate) fn chromedriver() -> Option<PathBuf> {
    let (Some(driver), Some(_chromium)) = (
        find_program(&["chromedriver"]),
        find_program(&["chromium", "chromium-browser", "google-chrome"]),
    ) else {
        assert!(
            !browser_required(),
            "the console's browser test needs chromium and chromedriver (Debian: apt-get install \
             chromium chromium-driver); CI=true or SAGAFLOW_REQUIRE_BROWSER=1 makes this a failure"
        );
        println!("skipped: chromium or chromedriver not installed");
        return None;
    };
    Some(driver)
}

/// Logs `b` into the console served at `addr` with `token`, and waits for the overview.
pub(crate) async fn log_in(b: &fantoccini::Client, addr: std::net::SocketAddr, token: &str) {
    b.goto(&format!("http://{addr}/console/login"))
        .await
        .expect("login page");
    wait_css(b, "input[name=token]")
        .await
        .send_keys(token)
        .await
        .expect("type");
    click(b, "button[type=submit]").await;
    wait_css(b, "#active").await;
}

pub(crate) fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

fn screenshot_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SAGAFLOW_SCREENSHOTS") {
        return PathBuf::from(dir);
    }
    // tests/ sits beside the workspace's target directory.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("console-screenshots")
}

/// A chromedriver process on a free loopback port, killed on drop.
pub(crate) struct Driver {
    child: tokio::process::Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Driver {
    pub(crate) async fn start(program: &PathBuf) -> Self {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let child = tokio::process::Command::new(program)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let status = format!("http://127.0.0.1:{port}/status");
        let probe = reqwest::Client::new();
        eventually(Duration::from_secs(15), "chromedriver answers", || {
            let r = probe.get(&status).send();
            async move { r.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
        Self {
            child,
            port,
            profile: tempfile::tempdir().expect("profile dir"),
        }
    }

    pub(crate) async fn browser(&self) -> fantoccini::Client {
        let mut caps = serde_json::Map::new();
        let profile = format!("--user-data-dir={}", self.profile.path().display());
        let mut options = json!({
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--hide-scrollbars", "--no-first-run",
                "--disable-extensions", profile,
            ]
        });
        if let Some(chromium) = find_program(&["chromium", "chromium-browser", "google-chrome"]) {
            options["binary"] = json!(chromium.display().to_string());
        }
        caps.insert("goog:chromeOptions".into(), options);
        fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

use fantoccini::Locator::Css;

const WAIT: Duration = Duration::from_secs(30);

pub(crate) async fn wait_css(b: &fantoccini::Client, css: &str) -> fantoccini::elements::Element {
    b.wait()
        .at_most(WAIT)
        .every(Duration::from_millis(50))
        .for_element(Css(css))
        .await
        .unwrap_or_else(|e| panic!("waiting for `{css}`: {e}"))
}

/// The text of the element `css` finds, found again if a live update replaced it meanwhile.
pub(crate) async fn text_of(b: &fantoccini::Client, css: &str) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(e) = b.find(Css(css)).await
            && let Ok(t) = e.text().await
        {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "no text at `{css}`");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` finds, found again if a live update replaced it meanwhile.
pub(crate) async fn click(b: &fantoccini::Client, css: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(e) = b.find(Css(css)).await
            && e.click().await.is_ok()
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "cannot click `{css}`"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn screenshot(b: &fantoccini::Client, name: &str) {
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let png = b.screenshot().await.expect("screenshot");
    let path = dir.join(name);
    std::fs::write(&path, png).expect("write screenshot");
    println!("screenshot: {}", path.display());
}

pub(crate) async fn js(b: &fantoccini::Client, script: &str) -> Value {
    b.execute(script, vec![]).await.expect("script")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_failed_step_in_the_browser_and_watches_it_complete() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let _turn = crate::fixtures::timing_turn().await;
    let db = sqlite_db();
    let c = Controls::new();
    let s = serve(&db, &c).await;
    let e = &s.engine;

    // Something to look at: completed runs, one that stops in Error, one with markup.
    for n in 0..3 {
        let id = e.start("echo", &json!({ "n": n })).await.expect("start");
        expect_state(e, id, RunState::Completed, "sqlite").await;
    }
    let failed = e
        .start_with(
            "shipment",
            &json!({ "order": "o-17" }),
            sagaflow::StartOptions {
                business_key: Some("order-17".into()),
                ..Default::default()
            },
        )
        .await
        .expect("start")
        .id;
    expect_state(e, failed, RunState::Error, "sqlite").await;
    let marked = e
        .start_with(
            "echo",
            &json!({ "note": XSS }),
            sagaflow::StartOptions {
                business_key: Some(XSS.into()),
                ..Default::default()
            },
        )
        .await
        .expect("start")
        .id;
    expect_state(e, marked, RunState::Completed, "sqlite").await;
    let held = e.start("held", &json!({})).await.expect("start");
    // Its only step waits at a gate that stays shut: the run stays unfinished.
    let held_state = e.run(held).await.expect("run").expect("some").state;

    let driver = Driver::start(&driver).await;
    let b = driver.browser().await;
    // The browser is closed whatever happens, so that no Chromium outlives a failed test.
    let walked = AssertUnwindSafe(walk(&b, &s, &c, failed, marked, (held, held_state)))
        .catch_unwind()
        .await;
    let _ = b.close().await;
    drop(driver);
    s.stop().await;
    if let Err(panic) = walked {
        std::panic::resume_unwind(panic);
    }
}

async fn walk(
    b: &fantoccini::Client,
    s: &Served,
    c: &Controls,
    failed: Uuid,
    marked: Uuid,
    (held, held_state): (Uuid, RunState),
) {
    let goto = |path: String| async move {
        b.goto(&s.url(&path))
            .await
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
    };

    // Without a session: the login form, which refuses a wrong token.
    goto("/console/runs".into()).await;
    let field = wait_css(b, "input[name=token]").await;
    let url = b.current_url().await.expect("url");
    assert_eq!(url.path(), "/console/login");
    field.send_keys("wrong").await.expect("type");
    click(b, "button[type=submit]").await;
    let refused = text_of(b, ".flash.error").await;
    assert!(refused.contains("not valid"), "{refused}");

    // Log in.
    let field = wait_css(b, "input[name=token]").await;
    field.send_keys(OPS).await.expect("type");
    click(b, "button[type=submit]").await;

    // The overview's counts: one shipment run in error, the held run unfinished, one alert.
    wait_css(b, "#active").await;
    assert_eq!(text_of(b, "#active td[data-state=error] a").await, "1");
    let held_cell = format!("#active td[data-state={held_state}] a");
    assert_eq!(text_of(b, &held_cell).await, "1");
    assert_eq!(text_of(b, "#open-alerts").await, "1");
    wait_css(b, "#throughput").await;
    wait_css(b, "#live-status.on").await;
    screenshot(b, "console-overview.png").await;

    // The alerts and the definitions.
    goto("/console/alerts".into()).await;
    wait_css(b, &format!("table.alerts a[href='/console/runs/{failed}']")).await;
    screenshot(b, "console-alerts.png").await;
    goto("/console/definitions".into()).await;
    wait_css(b, "svg.steps g.node.pivot[data-step=charge]").await;
    screenshot(b, "console-definitions.png").await;

    // The runs list shows markup in a business key as text.
    goto("/console/runs".into()).await;
    wait_css(b, "#runs").await;
    let keys = js(
        b,
        "return Array.from(document.querySelectorAll('#runs td.key')).map(e => e.textContent);",
    )
    .await;
    assert!(
        keys.as_array().is_some_and(|k| k.contains(&json!(XSS))),
        "business key not shown as text: {keys}"
    );
    screenshot(b, "console-runs.png").await;

    // From the overview's error count to the run in error.
    goto("/console/".into()).await;
    click(b, "#active td[data-state=error] a").await;
    let row = format!("#runs tr[data-run='{failed}'] a");
    wait_css(b, &row).await;
    let rows = js(
        b,
        "return document.querySelectorAll('#runs tbody tr').length;",
    )
    .await;
    assert_eq!(rows, json!(1), "filtered to the run in error");
    click(b, &row).await;
    wait_css(b, "#run-state[data-state=error]").await;
    wait_css(b, "svg.steps g.node.st-failed[data-step=notify]").await;
    wait_css(b, "svg.steps g.node.st-completed[data-step=charge]").await;

    // Before confirming an undo, its preview: a compensate undoes `reserve` only (the pivot
    // and the retriable steps after it stay, each with why); a cancel after the pivot
    // comes too late, and the run would go forward to its failed step and stop in error
    // again.
    let compensate = "details[data-action=compensate]";
    click(b, &format!("{compensate} summary")).await;
    wait_css(
        b,
        &format!(
            "{compensate} .undo-preview[data-outcome=compensated] li.undo-group[data-steps=reserve]"
        ),
    )
    .await;
    let kept = text_of(b, &format!("{compensate} .undo-kept")).await;
    assert!(
        kept.contains("charge (completed): a pivot")
            && kept.contains("pack (completed): after the pivot"),
        "{kept}"
    );
    assert_eq!(
        js(
            b,
            &format!("return document.querySelectorAll('{compensate} li.undo-group').length;"),
        )
        .await,
        json!(1)
    );
    wait_css(
        b,
        "details[data-action=cancel] .undo-preview[data-outcome=stops_in_error]",
    )
    .await;
    screenshot(b, "console-undo-preview.png").await;
    click(b, &format!("{compensate} summary")).await;

    // Retry the failed step, with a reason, after fixing its cause.
    c.fixed.store(true, Ordering::SeqCst);
    let retry = "details[data-action=retry][data-step=notify]";
    click(b, &format!("{retry} summary")).await;
    let reason = wait_css(b, &format!("{retry} textarea")).await;
    reason
        .send_keys("mailbox fixed by support")
        .await
        .expect("type");
    screenshot(b, "console-run.png").await;
    click(b, &format!("{retry} button.confirm")).await;
    wait_css(b, "#notice .flash.ok").await;
    wait_css(b, "#run-state[data-state=running]").await;
    wait_css(b, "#live-status.on").await;

    // The step waits at its gate; open it and watch the page change by itself.
    js(b, "window.__notReloaded = 42; return null;").await;
    c.gate.add_permits(1);
    wait_css(b, "#run-state[data-state=completed]").await;
    wait_css(b, "svg.steps g.node.st-completed[data-step=notify]").await;
    let same_page = js(b, "return window.__notReloaded === 42;").await;
    assert_eq!(same_page, json!(true), "the page was reloaded");
    let reason = text_of(b, "#history .reason").await;
    assert!(reason.contains("mailbox fixed by support"), "{reason}");

    // Markup in a run's input and business key is text, never code.
    goto(format!("/console/runs/{marked}")).await;
    let pre = text_of(b, "pre.json").await;
    assert!(pre.contains("<script>document.title='pwned'"), "{pre}");
    assert_eq!(text_of(b, "dd.key").await, XSS);
    let ran = js(b, "return [document.title, String(window.__pwned)];").await;
    assert_eq!(
        ran,
        json!([
            format!("Run …{} · sagaflow", &marked.simple().to_string()[20..]),
            "undefined"
        ])
    );

    // A form post without the CSRF token, with the browser's own session: refused, and the
    // run is untouched.
    let cookie = b
        .get_named_cookie("sagaflow_session")
        .await
        .expect("session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    let http = http();
    let session = format!("sagaflow_session={}", cookie.value());
    let (status, _, _) = post(
        &http,
        s,
        &format!("/console/runs/{held}/actions/compensate"),
        &session,
        &[("reason", "forged")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let run = s.engine.run(held).await.expect("run").expect("some");
    assert_eq!(run.state, held_state);
    assert_eq!(
        operator_events(&s.engine.history(held).await.expect("h")),
        0
    );

    // Readable on a phone: nothing wider than the screen but the tables and the graph,
    // which scroll in their own boxes.
    b.set_window_size(390, 844).await.expect("phone size");
    goto(format!("/console/runs/{failed}")).await;
    wait_css(b, "svg.steps").await;
    let overflow = js(
        b,
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
    )
    .await;
    assert_eq!(overflow, json!(0), "the page scrolls sideways on a phone");
    screenshot(b, "console-run-phone.png").await;

    // Without the session, pages go to the login form; the API without a token is 401.
    let r = http.get(s.url("/console/")).send().await.expect("get");
    assert_eq!(
        (r.status(), r.headers()[LOCATION].to_str().ok()),
        (StatusCode::SEE_OTHER, Some("/console/login"))
    );
    let r = http.get(s.url("/api/v1/alerts")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}
