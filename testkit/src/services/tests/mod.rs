//! Behaviour tests of the simulated services, in-process and over HTTP.

mod http;
mod in_process;
mod saga;

use std::time::Duration;

use super::{ChargeRequest, RefundRequest, ReleaseRequest, ReserveRequest, ShipRequest};

/// How long a call must stay unanswered to count as hung.
const HANG_CHECK: Duration = Duration::from_millis(200);

/// Generous bound for a call that must answer (keeps a broken test from hanging).
const ANSWER_BOUND: Duration = Duration::from_secs(5);

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn reserve_req(order: &str) -> ReserveRequest {
    ReserveRequest {
        order_id: order.into(),
        sku: "SKU-1".into(),
        qty: 2,
    }
}

fn release_req(order: &str, reservation_id: &str) -> ReleaseRequest {
    ReleaseRequest {
        order_id: order.into(),
        reservation_id: reservation_id.into(),
    }
}

fn charge_req(order: &str) -> ChargeRequest {
    ChargeRequest {
        order_id: order.into(),
        amount_cents: 4_200,
    }
}

fn refund_req(order: &str, charge_id: &str) -> RefundRequest {
    RefundRequest {
        order_id: order.into(),
        charge_id: charge_id.into(),
    }
}

fn ship_req(order: &str) -> ShipRequest {
    ShipRequest {
        order_id: order.into(),
        address: "1 Main St".into(),
    }
}
