//! What the fuzz targets share: the input model of `vhost_user_sequences` and its seeds.

pub mod vhost_user_input;
pub mod vhost_user_seeds;
