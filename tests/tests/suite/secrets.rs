//! Secrets stay out of output: `Debug` of the builder, engine, store and errors, and every
//! log line at every level, show database URLs with the password masked.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sagaflow::{Engine, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::postgres_db;

const PASSWORD: &str = "s3cret-Pw0rd";

/// Collects everything written to it.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

fn workflow() -> Workflow {
    Workflow::builder("secretive", 1)
        .step("a", |_: StepContext| async { Ok::<_, StepError>(1) })
        .step("b", |_: StepContext| async {
            Err::<(), _>(StepError::refused("declined", "no"))
        })
        .after(["a"])
        .build()
        .expect("workflow")
}

// A current-thread runtime: every task of the engine runs on this thread, so the scoped
// subscriber below sees every log line they write.
#[tokio::test]
async fn passwords_never_reach_debug_output_or_logs() {
    let Some(db) = postgres_db().await else {
        return;
    };
    // The test server trusts local connections, so any password is accepted.
    let url = db.url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PASSWORD}@"),
        1,
    );
    assert!(
        url.contains(PASSWORD),
        "the URL carries the password: {url}"
    );
    let capture = Capture::default();
    let sink = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut shown = Vec::new();

    let builder = Engine::builder()
        .with_database_url(url.clone())
        .with_workflow(workflow());
    shown.push(format!("{builder:?}"));
    let engine = builder.start().await.expect("start");
    shown.push(format!("{engine:?}"));
    shown.push(format!("{:?}", engine.store()));
    let id = engine.start("secretive", &()).await.expect("run");
    let run = engine
        .wait(id, Duration::from_secs(20))
        .await
        .expect("finished");
    assert_eq!(run.state, RunState::Compensated);

    // Failures that name the database: a refused connection, a malformed URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    for bad in [
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/db"),
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:notaport/db"),
        format!("postgres://postgres@127.0.0.1:{port}/db?password={PASSWORD}"),
    ] {
        let e = Engine::builder()
            .with_database_url(bad)
            .with_workflow(workflow())
            .start()
            .await
            .expect_err("cannot start");
        shown.push(format!("{e}"));
        shown.push(format!("{e:?}"));
    }
    engine.shutdown().await;
    drop(_guard);

    let logs = capture.text();
    assert!(
        logs.lines().count() > 10,
        "logging at trace level was captured:\n{logs}"
    );
    for text in shown.iter().chain([&logs]) {
        assert!(!text.contains(PASSWORD), "a password leaked:\n{text}");
    }
    assert!(
        shown
            .iter()
            .any(|s| s.contains("postgres:***@") || s.contains("postgres://postgres@")),
        "the URLs are still shown, masked: {shown:#?}"
    );
}
