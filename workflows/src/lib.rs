//! The example sagas: the order saga (inventory, payments, shipping) and the travel saga
//! (flights, hotels, payments, mailer). The simulated remote services they talk to live in
//! the test kit ([`sagaflow_testkit::services`]).

pub mod database;
mod error;
pub mod order;
pub mod remote_step;
pub mod travel;

pub use error::Error;
