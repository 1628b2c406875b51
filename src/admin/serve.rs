//! Serving the HTTP API on an address of its own ([`EngineBuilder::with_admin`]).

use std::net::SocketAddr;

use sagaflow_engine::Error;

use super::AdminConfig;
use crate::{Engine, EngineBuilder};

/// Refuses to expose the API beyond this machine without a token: on a loopback address an
/// API without tokens answers only `/healthz`; on any other address it is a mistake.
pub(crate) fn check_address(addr: SocketAddr, config: &AdminConfig) -> Result<(), Error> {
    if addr.ip().is_loopback() || config.has_tokens() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "the admin API would listen on {addr}, beyond this machine, without a token: set \
             SAGAFLOW_ADMIN_TOKEN (or add a token to its AdminConfig), or listen on 127.0.0.1"
        )))
    }
}

impl EngineBuilder {
    /// Serves the HTTP API ([`Engine::admin_router`]) on `addr` once the engine starts, until
    /// it shuts down. The start fails if `addr` is not a loopback address and `config` has no
    /// token, or if nothing can listen on it. Port 0 picks a free port:
    /// [`Engine::admin_addr`] tells which.
    pub fn with_admin(mut self, addr: SocketAddr, config: AdminConfig) -> Self {
        self.admin = Some((addr, config));
        self
    }
}

/// Binds the API's address (before the engine starts, so that a taken port fails the start).
pub(crate) async fn bind(
    addr: SocketAddr,
    config: &AdminConfig,
) -> Result<tokio::net::TcpListener, Error> {
    check_address(addr, config)?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("the admin API cannot listen on {addr}: {e}")))
}

impl Engine {
    /// Where the API started with [`EngineBuilder::with_admin`] listens, if it does.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.inner.admin_addr.get().copied()
    }

    /// Serves the API on `listener` until the engine shuts down.
    pub(crate) fn serve_admin(&self, listener: tokio::net::TcpListener, config: AdminConfig) {
        if let Ok(addr) = listener.local_addr() {
            let _ = self.inner.admin_addr.set(addr);
            tracing::info!(%addr, tokens = config.has_tokens(), "admin API listening");
        }
        let app = self.admin_router(config);
        let cancel = self.inner.cancel.clone();
        self.inner.tracker.spawn(async move {
            // With each connection's peer address: failed authentications are counted per
            // client (see `AdminLimits`).
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { cancel.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "admin API stopped");
            }
        });
    }
}

/// Completes on Ctrl-C, or on SIGTERM where there is one: what a process serving the console
/// and API until it is told to stop waits for (`sagaflow serve`, the demo's `--serve`).
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Without a SIGTERM handler (it could not be installed), Ctrl-C alone stops it.
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::check_address;
    use crate::admin::{AdminConfig, AdminToken, Role};

    #[test]
    fn only_loopback_goes_without_a_token() {
        let none = AdminConfig::new();
        let some = AdminConfig::new().with_token(
            AdminToken::new("ops", "a-long-enough-secret", Role::Operator).expect("token"),
        );
        for ok in ["127.0.0.1:8080", "[::1]:8080"] {
            assert!(
                check_address(ok.parse().expect("addr"), &none).is_ok(),
                "{ok}"
            );
        }
        let open = "0.0.0.0:8080".parse().expect("addr");
        let e = check_address(open, &none).expect_err("refused");
        assert!(e.to_string().contains("without a token"), "{e}");
        assert!(check_address(open, &some).is_ok());
    }
}
