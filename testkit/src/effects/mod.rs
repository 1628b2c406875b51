//! A loopback HTTP effect service for any saga: register operations by name, point the
//! saga's steps at it, script its faults, and check its ledger.
//!
//! * [`EffectServer::builder`] registers each operation with a handler, a function of the
//!   JSON request that answers a JSON response or a [`Refusal`] (a business "no");
//!   [`EffectServerBuilder::start`] listens on `127.0.0.1` on a free port.
//! * Every call is `POST /{operation}` with an
//!   [`Idempotency-Key`](crate::services::IDEMPOTENCY_KEY_HEADER) header and a JSON body.
//!   The first call per operation and key runs the handler and records the effect in the
//!   [`EffectLedger`]; later calls with that key replay the stored response. A call without
//!   a key is answered 400 and applies nothing.
//! * [`EffectServer::script`] queues [`Scripted`](crate::services::Scripted) outcomes for the
//!   next calls of an operation: a 503 or 429 without applying, a refusal, a reply lost after
//!   applying (a reset connection, a 502 or a 504), or a hang that applies and never answers.
//! * [`EffectServer::calls`] lists every request received, with its W3C `traceparent` and
//!   `tracestate` headers ([`EffectClient::call_in`] sends the step attempt's).
//! * [`EffectClient::call`] is what a step body calls: it maps each answer to the
//!   [`StepError`](sagaflow::StepError) the engine expects (refused and not applied, retryable
//!   and not applied, or retryable with an unknown outcome).
//!
//! ```no_run
//! use sagaflow_testkit::effects::{EffectClient, EffectServer, Refusal};
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let server = EffectServer::builder()
//!     .operation("book_hotel", |req| match req["nights"].as_u64() {
//!         Some(n) if n <= 14 => Ok(json!({ "booking": "H-1", "nights": n })),
//!         _ => Err(Refusal::rejected("stays are 1 to 14 nights")),
//!     })
//!     .start()
//!     .await?;
//! let client = EffectClient::new(server.base_url());
//! let booked = client.call("run-1/hotel", "book_hotel", &json!({ "nights": 3 })).await?;
//! assert_eq!(booked["booking"], "H-1");
//! assert_eq!(server.ledger().applied("book_hotel"), 1);
//! server.shutdown().await?;
//! # Ok(())
//! # }
//! ```

mod client;
mod ledger;
mod refusal;
mod server;

#[cfg(test)]
mod tests;

pub use client::EffectClient;
pub use ledger::{Effect, EffectLedger, Pairs};
pub use refusal::Refusal;
pub use server::{Call, EffectError, EffectServer, EffectServerBuilder};
