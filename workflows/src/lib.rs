//! The order-processing saga and the simulated remote services it talks to: inventory, payments, shipping.

pub mod machine;
pub mod measure;
pub mod order;
mod remote_step;
pub mod services;
