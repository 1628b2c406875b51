//! `--serve ADDR`: after the runs, the engine stays up and serves its HTTP API and web
//! console, so a newcomer can look at the runs, the alerts and the published saga over HTTP
//! or in a browser.

use std::net::SocketAddr;

use sagaflow::Engine;
use sagaflow::admin::{ADMIN_TOKEN_ENV, AdminConfig, AdminToken, Role};

use super::text::rule;
use super::{DemoError, DemoResult};

/// Serves the API on `addr` until Ctrl-C (or SIGTERM). The operator token is
/// `SAGAFLOW_ADMIN_TOKEN`'s when set (then it is not printed), else a fresh one for this
/// session, printed so that it can be used.
pub(crate) async fn serve(engine: &Engine, addr: SocketAddr) -> DemoResult<()> {
    let (config, shown) = match std::env::var(ADMIN_TOKEN_ENV) {
        Ok(t) if !t.trim().is_empty() => (
            AdminConfig::from_env().map_err(|e| DemoError::Token(e.to_string()))?,
            format!("${ADMIN_TOKEN_ENV}"),
        ),
        _ => {
            // 32 hex characters: over the 16 a token needs.
            let token = uuid::Uuid::new_v4().simple().to_string();
            let config = AdminConfig::new().with_token(
                AdminToken::new("demo", token.clone(), Role::Operator)
                    .map_err(|e| DemoError::Token(e.to_string()))?,
            );
            (config, token)
        }
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!();
    println!("{}", rule("HTTP API"));
    println!("  listening on http://{addr}   (Ctrl-C stops)");
    println!("  token        {shown}");
    println!("  console      http://{addr}/console/   (log in with the token)");
    println!(
        "  try          curl -H \"Authorization: Bearer {shown}\" http://{addr}/api/v1/alerts"
    );
    println!(
        "               curl -H \"Authorization: Bearer {shown}\" http://{addr}/api/v1/definitions"
    );
    println!("               curl -H \"Authorization: Bearer {shown}\" http://{addr}/metrics");
    let app = engine.admin_router(config);
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(sagaflow::admin::stop_signal())
        .await?;
    Ok(())
}
