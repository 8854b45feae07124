//! What the fuzz targets in `fuzz/fuzz_targets/` share: their structured inputs (types that
//! derive `Arbitrary`), the harnesses that run an input and check the invariants, and the seeds.
//!
//! | target | input | harness |
//! |--------|-------|---------|
//! | `message_decode` | [`codec::Slot`] | [`codec::check_message`] |
//! | `frame_decode` | any bytes | [`codec::check_frame`] |
//! | `reassembly` | [`codec::FrameStream`] | [`codec::check_reassembly`] |
//! | `engine_hostile_rings` | [`engine::Script`] | [`engine::run`] |
//! | `vhost_user_sequences` | [`vhost_user::Input`] | [`vhost_user::run`] |
//!
//! Every harness panics when an invariant does not hold, which is what libFuzzer reports. This
//! crate builds on stable Rust as a member of the project workspace, so its tests (each seed
//! decodes into its structured input; each seed replayed through its harness upholds the
//! invariants) run with the project's, where cargo-fuzz and nightly are missing too.

pub mod codec;
pub mod corpus;
pub mod encode;
pub mod engine;
pub mod vhost_user;

pub use encode::Encode;
