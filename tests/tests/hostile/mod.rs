//! The attacks, by the layer they hit.

mod channels;
mod descriptors;
mod engine;
mod host;
mod protocol;
mod rings;
