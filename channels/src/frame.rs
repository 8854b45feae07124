//! svnic Ethernet frames (to be written).
