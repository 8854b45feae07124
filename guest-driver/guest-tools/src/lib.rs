//! # svnic-guest-tools: measuring svnic
//!
//! - [`measure`]: round trips and streaming over a channel (user-data, DMA-data), virtio-net
//!   frames and kernel UDP;
//! - [`cli`]: the `svnic-guest` command (in a VM through the agent, or as a host-process guest);
//! - [`demo`]: `svnic demo`, the daemon and two host-process guests in one process.

pub mod cli;
pub mod demo;
pub mod measure;
