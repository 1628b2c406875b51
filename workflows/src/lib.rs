//! The example sagas and the simulated remote services they talk to: the order saga
//! (inventory, payments, shipping) and the travel saga (flights, hotels, payments, mailer).

pub mod database;
pub mod order;
mod remote_step;
pub mod services;
pub mod travel;
