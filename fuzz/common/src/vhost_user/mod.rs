//! `vhost_user_sequences`: hostile vhost-user message sequences against a real port.

pub mod harness;
pub mod input;
pub mod seeds;

pub use harness::{probe, run};
pub use input::Input;
