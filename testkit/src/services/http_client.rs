//! HTTP clients implementing the service traits against [`serve`](super::serve).

use std::collections::BTreeMap;
use std::error::Error as _;
use std::sync::Arc;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::ServiceError;
use super::fault_plan::FaultCounts;
use super::http_server::{IDEMPOTENCY_KEY_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER};
use super::inventory::{InventoryApi, ReleaseRequest, Released, Reservation, ReserveRequest};
use super::ledger::EffectRecord;
use super::operation::Service;
use super::payments::{Charge, ChargeRequest, PaymentsApi, Refund, RefundRequest};
use super::report::LedgerReport;
use super::shipping::{ShipRequest, Shipment, ShippingApi};

/// A `reqwest` client bound to a base URL.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base_url: String,
}

impl Http {
    /// A client of the server at `base_url`, without a trailing slash.
    pub(crate) fn new(base_url: impl Into<String>, client: reqwest::Client) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_owned();
        Self { client, base_url }
    }

    /// The base URL requests go to.
    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `POST {path}` with `key` in the idempotency header and `request` as JSON; the answer
    /// classified by [`decode`].
    pub(crate) async fn post<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        request: &Req,
    ) -> Result<Resp, ServiceError> {
        self.post_traced(path, key, None, request).await
    }

    /// [`post`](Self::post) with the W3C trace context of the calling step attempt
    /// (`traceparent`, and `tracestate` when there is one).
    pub(crate) async fn post_traced<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        trace: Option<(&str, Option<&str>)>,
        request: &Req,
    ) -> Result<Resp, ServiceError> {
        let mut builder = self
            .client
            .post(self.url(path))
            .header(IDEMPOTENCY_KEY_HEADER, key);
        if let Some((parent, state)) = trace {
            builder = builder.header(TRACEPARENT_HEADER, parent);
            if let Some(state) = state {
                builder = builder.header(TRACESTATE_HEADER, state);
            }
        }
        let response = builder.json(request).send().await.map_err(from_reqwest)?;
        decode(response).await
    }

    async fn get<Resp: DeserializeOwned>(&self, path: &str) -> Result<Resp, ServiceError> {
        let response = self
            .client
            .get(self.url(path))
            .send()
            .await
            .map_err(from_reqwest)?;
        decode(response).await
    }
}

/// 2xx → body. The statuses our services document as answered before acting: 503 and 408
/// → `Transient`, 429 → `Busy` (with `Retry-After`), 409 → `Conflict`, 422 and other 4xx →
/// `Permanent`. Any other status (502, 504, 500…) may come from after the effect was
/// applied: `Transport`, outcome unknown.
async fn decode<Resp: DeserializeOwned>(response: reqwest::Response) -> Result<Resp, ServiceError> {
    let status = response.status();
    if status.is_success() {
        return response.json().await.map_err(from_reqwest);
    }
    let retry_after_ms = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| secs.saturating_mul(1000));
    let body = response.text().await.map_err(from_reqwest)?;
    let message = match serde_json::from_str::<ServiceError>(&body) {
        Ok(e) => e.message(),
        Err(_) => format!("HTTP {status}: {body}"),
    };
    Err(match status {
        // 408: the server gave up waiting for the request itself, so it did not act on it.
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT => {
            ServiceError::Transient(message)
        }
        StatusCode::TOO_MANY_REQUESTS => ServiceError::Busy {
            message,
            retry_after_ms,
        },
        StatusCode::CONFLICT => ServiceError::Conflict(message),
        s if s.is_client_error() => ServiceError::Permanent(message),
        _ => ServiceError::Transport(format!("HTTP {status}: {message}")),
    })
}

/// A request that could not be built is a bug on our side (e.g. a key that is not a
/// valid header value): permanent. A connection that could not be made never carried the
/// request: transient, not applied. Anything else on the wire (a reset after sending, a
/// timeout, a body cut short) leaves the outcome unknown: transport.
fn from_reqwest(err: reqwest::Error) -> ServiceError {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    if err.is_builder() {
        ServiceError::Permanent(message)
    } else if err.is_connect() {
        ServiceError::Transient(message)
    } else {
        ServiceError::Transport(message)
    }
}

/// [`InventoryApi`] over HTTP.
#[derive(Debug, Clone)]
pub struct HttpInventory {
    http: Http,
}

#[async_trait]
impl InventoryApi for HttpInventory {
    async fn reserve(&self, key: &str, req: ReserveRequest) -> Result<Reservation, ServiceError> {
        self.http.post("/inventory/reserve", key, &req).await
    }

    async fn release(&self, key: &str, req: ReleaseRequest) -> Result<Released, ServiceError> {
        self.http.post("/inventory/release", key, &req).await
    }
}

/// [`PaymentsApi`] over HTTP.
#[derive(Debug, Clone)]
pub struct HttpPayments {
    http: Http,
}

#[async_trait]
impl PaymentsApi for HttpPayments {
    async fn charge(&self, key: &str, req: ChargeRequest) -> Result<Charge, ServiceError> {
        self.http.post("/payments/charge", key, &req).await
    }

    async fn refund(&self, key: &str, req: RefundRequest) -> Result<Refund, ServiceError> {
        self.http.post("/payments/refund", key, &req).await
    }
}

/// [`ShippingApi`] over HTTP.
#[derive(Debug, Clone)]
pub struct HttpShipping {
    http: Http,
}

#[async_trait]
impl ShippingApi for HttpShipping {
    async fn ship(&self, key: &str, req: ShipRequest) -> Result<Shipment, ServiceError> {
        self.http.post("/shipping/ship", key, &req).await
    }
}

/// HTTP clients of the three services sharing one `reqwest::Client`; the HTTP twin
/// of [`Services`](super::Services).
#[derive(Debug, Clone)]
pub struct HttpServices {
    http: Http,
    inventory: Arc<HttpInventory>,
    payments: Arc<HttpPayments>,
    shipping: Arc<HttpShipping>,
}

impl HttpServices {
    /// Clients of the server at `base_url` (e.g. `http://127.0.0.1:4000`), with no
    /// request timeout: the caller bounds each call (dropping the future cancels it).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::with_client(base_url, reqwest::Client::new())
    }

    /// Like [`new`](Self::new) with a caller-configured client (timeouts, pool...).
    pub fn with_client(base_url: impl Into<String>, client: reqwest::Client) -> Self {
        let http = Http::new(base_url, client);
        Self {
            inventory: Arc::new(HttpInventory { http: http.clone() }),
            payments: Arc::new(HttpPayments { http: http.clone() }),
            shipping: Arc::new(HttpShipping { http: http.clone() }),
            http,
        }
    }

    /// The base URL requests go to.
    pub fn base_url(&self) -> &str {
        self.http.base_url()
    }

    /// The inventory client.
    pub fn inventory(&self) -> Arc<dyn InventoryApi> {
        self.inventory.clone()
    }

    /// The payments client.
    pub fn payments(&self) -> Arc<dyn PaymentsApi> {
        self.payments.clone()
    }

    /// The shipping client.
    pub fn shipping(&self) -> Arc<dyn ShippingApi> {
        self.shipping.clone()
    }

    /// `GET /ledger`: every effect the server applied.
    pub async fn ledger_records(&self) -> Result<Vec<EffectRecord>, ServiceError> {
        self.http.get("/ledger").await
    }

    /// `GET /ledger/report`: the server's check of all orders.
    pub async fn report(&self) -> Result<LedgerReport, ServiceError> {
        self.http.get("/ledger/report").await
    }

    /// `GET /faults`: faults the server injected, per service.
    pub async fn fault_counts(&self) -> Result<BTreeMap<Service, FaultCounts>, ServiceError> {
        self.http.get("/faults").await
    }
}
