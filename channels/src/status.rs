//! Status codes that cross the guest/engine boundary: completion statuses on the data path,
//! failure reasons on the control path, fault codes in the channel header.
//!
//! Every code has a fixed `u16`/`u32` value (see docs/abi.md); decoding an unknown value is an error,
//! never a panic.

use crate::error::DecodeError;

/// A fieldless enum with a fixed on-the-wire code per variant (`code`, `from_code`), the list
/// of its values (`ALL`) and a short description per value (`describe`, `Display`). An unknown
/// code decodes to [`DecodeError::UnknownCode`] naming the enum, or the text after `as`.
macro_rules! wire_enum {
    (@what $name:ident) => { stringify!($name) };
    (@what $name:ident $what:literal) => { $what };
    ($(#[$m:meta])* $name:ident : $repr:ty $(as $what:literal)? { $($(#[$vm:meta])* $variant:ident = $val:expr => $text:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vm])* $variant = $val,)*
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The on-the-wire code.
            pub fn code(self) -> $repr {
                self as $repr
            }

            /// Decodes an on-the-wire code.
            pub fn from_code(code: $repr) -> Result<Self, DecodeError> {
                match code {
                    $($val => Ok($name::$variant),)*
                    other => Err(DecodeError::UnknownCode {
                        what: wire_enum!(@what $name $($what)?),
                        code: other as u64,
                    }),
                }
            }

            /// A short human description.
            pub fn describe(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.describe())
            }
        }
    };
}

pub(crate) use wire_enum;

wire_enum! {
    /// Status of a completion message (engine -> sender), echoed with the sender's cookie.
    CompletionStatus: u16 {
        /// Delivered (DMA-data copied and published COMPLETE; user-data published).
        Ok = 0 => "delivered",
        /// No channel is bound to the destination (MAC, endpoint).
        NoRoute = 1 => "no route to destination",
        /// The destination channel was destroyed while the message was in flight.
        DestinationGone = 2 => "destination channel gone",
        /// The destination posted no receive buffer within the backpressure wait.
        NoBuffer = 3 => "no receive buffer posted by destination within the wait",
        /// The destination's RX ring stayed full for the whole backpressure wait.
        RingFull = 4 => "destination RX ring full for the whole wait",
        /// A DMA-data address/length does not lie inside the sender's data area.
        AddressOutOfRange = 5 => "DMA address outside the channel's data area",
        /// The destination's next posted buffer is smaller than the data.
        BufferTooSmall = 6 => "destination's posted buffer too small",
        /// The message in the TX ring is malformed (kind, flags, length or reserved bytes).
        BadMessage = 7 => "malformed message",
        /// The destination channel is faulted.
        DestinationFaulted = 8 => "destination channel faulted",
        /// A posted receive buffer was refused (outside the data area, or zero length).
        BadPostBuffer = 9 => "posted receive buffer refused",
        /// The message could not be sent on the uplink (too large, or the uplink is down).
        UplinkError = 10 => "uplink error",
        /// The peer engine did not acknowledge within the peer timeout (docs/wire.md).
        PeerUnreachable = 11 => "peer engine did not acknowledge within the peer timeout",
    }
}

wire_enum! {
    /// Why a channel-create (or destroy) request failed. Sent in control responses.
    FailureReason: u16 {
        /// The guest already has as many channels as its policy allows.
        QuotaExceeded = 1 => "channel quota exceeded",
        /// The (MAC, endpoint) is already bound to a channel.
        EndpointTaken = 2 => "endpoint already bound",
        /// The endpoint is outside the guest's endpoint range.
        EndpointOutOfRange = 3 => "endpoint outside the guest's range",
        /// The MAC named in the request is not owned by the requesting guest.
        MacNotOwned = 4 => "MAC not owned by the requesting guest",
        /// The region is not inside the guest's memory.
        RegionOutsideMemory = 5 => "region outside guest memory",
        /// The region straddles two memory-table regions.
        RegionStraddles = 6 => "region straddles two guest memory regions",
        /// The ring size is not a power of two in 16..=4096.
        BadRingSize = 7 => "ring size not a power of two in 16..=4096",
        /// The region is too small for the header and rings.
        RegionTooSmall = 8 => "region too small for header and rings",
        /// The region is larger than the guest's policy (or the ABI) allows.
        RegionTooLarge = 9 => "region larger than allowed",
        /// The region address or length is not 4 KiB aligned.
        RegionMisaligned = 10 => "region address or length not 4 KiB aligned",
        /// The region overlaps a region of another live channel.
        RegionOverlaps = 11 => "region overlaps another channel's region",
        /// The guest is unknown to the engine (not configured, or disconnected).
        UnknownGuest = 12 => "unknown guest",
        /// No such channel (destroy of an id that does not exist or is not the guest's).
        NoSuchChannel = 13 => "no such channel",
        /// The engine is shutting down.
        ShuttingDown = 14 => "engine shutting down",
        /// The request was malformed.
        BadRequest = 15 => "malformed request",
        /// The guest sent create requests faster than its policy allows; it may retry later.
        RateLimited = 16 => "too many create requests; retry later",
    }
}

wire_enum! {
    /// Why the engine faulted a channel; written into the channel header's fault word.
    FaultReason: u32 {
        /// The guest wrote a TX producer index that is impossible (ahead by more than a ring, or backwards).
        TxIndex = 1 => "impossible TX producer index",
        /// The guest wrote an RX consumer index that is impossible.
        RxIndex = 2 => "impossible RX consumer index",
        /// The guest wrote an impossible posted-buffer producer index.
        PostIndex = 3 => "impossible posted-buffer producer index",
        /// The channel's memory became unreachable (memory table changed under it).
        MemoryGone = 4 => "channel memory no longer mapped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_fail() {
        for s in CompletionStatus::ALL {
            assert_eq!(CompletionStatus::from_code(s.code()).unwrap(), *s);
        }
        for r in FailureReason::ALL {
            assert_eq!(FailureReason::from_code(r.code()).unwrap(), *r);
        }
        for r in FaultReason::ALL {
            assert_eq!(FaultReason::from_code(r.code()).unwrap(), *r);
        }
        assert!(CompletionStatus::from_code(999).is_err());
        assert_eq!(
            CompletionStatus::from_code(11),
            Ok(CompletionStatus::PeerUnreachable)
        );
        assert!(CompletionStatus::from_code(12).is_err());
        assert!(FailureReason::from_code(0).is_err());
        // The highest code is the last one added; the next is unknown until it is defined.
        assert_eq!(FailureReason::from_code(16), Ok(FailureReason::RateLimited));
        assert!(FailureReason::from_code(17).is_err());
        assert!(FaultReason::from_code(0).is_err());
    }
}
