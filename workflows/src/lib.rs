//! The order-processing saga and the simulated remote services it talks to: inventory, payments, shipping.

pub mod order;
pub mod services;
