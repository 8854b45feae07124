//! Why a channel measurement stopped.

use std::time::Duration;

use svnic_channels::{ChannelAddr, CompletionStatus};
use svnic_client::channel::ChannelError;
use thiserror::Error;

/// Why a measurement over a channel stopped.
#[derive(Debug, Error)]
pub enum MeasureError {
    /// The channel itself failed (faulted by the engine, broken ring, invalid message).
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The engine returned a message with an error completion.
    #[error("{during}: {status}")]
    Completion {
        /// What was being done (e.g. `ping 3`, `stream`).
        during: String,
        /// The engine's completion status.
        status: CompletionStatus,
    },
    /// A ring had no free slot where the measurement needs one.
    #[error("{ring} ring full {during}")]
    RingFull {
        /// `TX` or `posted-buffer`.
        ring: &'static str,
        /// What was being done (e.g. `during ping`).
        during: &'static str,
    },
    /// Nothing, or not everything, arrived in time.
    #[error("{during}: nothing within {waited:?} ({progress})")]
    TimedOut {
        /// What was being waited for.
        during: &'static str,
        /// How long.
        waited: Duration,
        /// How far the measurement got (e.g. `12 of 100 received`).
        progress: String,
    },
    /// A message names a buffer the measurement never posted or sent.
    #[error("{during}: {what} for unknown buffer {cookie}")]
    UnknownBuffer {
        /// Which measurement.
        during: &'static str,
        /// A completion or data.
        what: &'static str,
        /// The cookie it carried.
        cookie: u64,
    },
    /// The peer did not answer a probe in time.
    #[error(
        "peer {peer} did not answer within {within:?} ({})",
        .last.map_or("no answer".to_string(), |s| format!("last probe: {s}"))
    )]
    NoAnswer {
        /// The peer probed.
        peer: ChannelAddr,
        /// How long it was probed.
        within: Duration,
        /// The completion status of the last probe the engine could not deliver, if any.
        last: Option<CompletionStatus>,
    },
    /// A DMA size the channel cannot carry (over a message's length field, or over the data area).
    #[error("DMA size {size} does not fit the data area ({data_len} bytes) or a message")]
    DmaSize {
        /// The size asked for.
        size: usize,
        /// The channel's data area.
        data_len: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use svnic_channels::MacAddr;

    #[test]
    fn errors_read_as_sentences_naming_what_and_why() {
        let peer = ChannelAddr::new(MacAddr([0x52, 0x54, 0, 0, 0, 2]), 1);
        let within = Duration::from_secs(1);
        let e = MeasureError::NoAnswer {
            peer,
            within,
            last: None,
        };
        assert_eq!(
            e.to_string(),
            format!("peer {peer} did not answer within 1s (no answer)")
        );
        let e = MeasureError::NoAnswer {
            peer,
            within,
            last: Some(CompletionStatus::NoRoute),
        };
        assert!(
            e.to_string()
                .ends_with("(last probe: no route to destination)"),
            "{e}"
        );
        let e = MeasureError::Completion {
            during: "ping 3".into(),
            status: CompletionStatus::NoRoute,
        };
        assert_eq!(e.to_string(), "ping 3: no route to destination");
        let e = MeasureError::RingFull {
            ring: "TX",
            during: "during ping",
        };
        assert_eq!(e.to_string(), "TX ring full during ping");
    }
}
