//! # svnic-backend: the svnic host daemon as a library
//!
//! - [`engine`]: the communications engine (workers polling channels, delivery, control path).
//!
//! The binaries around it stay thin.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod admin;
pub mod config;
pub mod control_path;
pub mod daemon;
pub mod engine;
pub mod net;
pub mod sockets;

pub use engine::{
    allowed_cpus, pin_to_cpu, ChannelInfo, ChannelStats, Engine, EngineConfig, EngineError,
    GuestWaker, Placement, RunState,
};
