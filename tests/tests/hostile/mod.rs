//! The attacks, by the layer they hit.

mod descriptors;
mod protocol;
mod rings;
