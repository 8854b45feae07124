//! # svnic-backend: the svnic host daemon as a library
//!
//! - [`engine`]: the communications engine (workers polling channels, delivery, channel creation and
//!   teardown).
//! - [`frame_handler`]: svnic frames from guests (control requests, doorbells) to the engine, and
//!   its responses and wakes back.
//! - [`pool`]: guest pools, where every connecting process becomes a guest of its own.
//! - [`uplink`]: the attachment to a host interface and the protocol between engines.
//!
//! The binaries around it stay thin.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod admin;
pub mod config;
mod counter_set;
pub mod daemon;
mod debug_fields;
pub mod engine;
pub mod frame_handler;
pub mod net;
pub mod pool;
pub mod sockets;
pub mod uplink;

pub use engine::{
    allowed_cpus, pin_to_cpu, ChannelInfo, ChannelStats, Engine, EngineConfig, EngineError,
    GuestWaker, Placement, RunState,
};
