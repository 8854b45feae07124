//! The reliability protocol between engines, as a state machine without I/O: a sender keeps a
//! bounded window of data frames per session and retransmits go-back-N; a receiver accepts frames
//! in order only and acknowledges cumulatively. docs/wire.md is the normative description.
