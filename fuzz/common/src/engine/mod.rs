//! `engine_hostile_rings`: the running engine fed with a hostile guest's channel memory.

mod guests;
pub mod harness;
mod hostile;
pub mod input;
pub mod seeds;

pub use harness::run;
pub use input::Script;
