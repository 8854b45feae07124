//! svnic completion statuses as libfabric errors (`fi_cq_err_entry.err`, positive) and their
//! strings (`fi_cq_strerror`).

use std::ffi::CStr;
use std::os::raw::c_int;

use svnic_channels::CompletionStatus;

use crate::ffi::errno::*;

/// `prov_errno` of an error the provider itself produced (not an engine status): the channel
/// of the endpoint failed.
pub const PROV_CHANNEL_FAILED: c_int = 1000;
/// `prov_errno` of a truncated receive.
pub const PROV_TRUNCATED: c_int = 1001;
/// `prov_errno` of a cancelled receive.
pub const PROV_CANCELED: c_int = 1002;
/// `prov_errno` of an `FI_PEEK` that found no message.
pub const PROV_NO_MESSAGE: c_int = 1003;
/// `prov_errno` of a receive whose message in parts arrived incomplete or out of order.
pub const PROV_PARTS: c_int = 1004;

/// What a send that completed with `status` reports: `None` for success, else the errno.
/// `NoBuffer` and `RingFull` are only reported after the provider's own retries (see ep.rs).
pub fn send_error(status: CompletionStatus) -> Option<c_int> {
    use CompletionStatus::*;
    match status {
        Ok => None,
        NoRoute | PeerUnreachable => Some(FI_EHOSTUNREACH),
        DestinationGone => Some(FI_ECONNRESET),
        NoBuffer | RingFull => Some(FI_ENORX),
        BufferTooSmall => Some(FI_EMSGSIZE),
        DestinationFaulted => Some(FI_ECONNABORTED),
        UplinkError => Some(FI_ENETDOWN),
        AddressOutOfRange | BadMessage | BadPostBuffer => Some(FI_EOTHER),
    }
}

/// Who reads an endpoint's send completions, which decides what a failed send reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The application: every failure is an error completion ([`send_error`]).
    Direct,
    /// A reliable utility provider layered on the DGRAM core (ofi_rxd): a send the network lost
    /// is its business (it retransmits, and gives a peer up on its own), and an error completion
    /// would stall its queue to that peer. Sends that failed for the peer's or the path's sake
    /// complete as successful, dropped datagrams; the provider's own faults are still errors.
    UnderReliableLayer,
}

/// What a send that completed with `status` reports to `delivery`'s reader: `None` for success
/// (or a datagram dropped on the way, under a reliable layer), else the errno.
pub fn send_outcome(status: CompletionStatus, delivery: Delivery) -> Option<c_int> {
    use CompletionStatus::*;
    match (delivery, status) {
        (
            Delivery::UnderReliableLayer,
            NoRoute | DestinationGone | NoBuffer | RingFull | DestinationFaulted | UplinkError
            | PeerUnreachable,
        ) => None,
        _ => send_error(status),
    }
}

/// The string of a `prov_errno` (a svnic completion status or one of the `PROV_*` codes).
pub fn prov_strerror(prov_errno: c_int) -> &'static CStr {
    match prov_errno {
        PROV_CHANNEL_FAILED => c"svnic: the endpoint's channel failed",
        PROV_TRUNCATED => c"svnic: message larger than the posted receive (truncated)",
        PROV_CANCELED => c"svnic: receive cancelled",
        PROV_NO_MESSAGE => c"svnic: no matching message (peek)",
        PROV_PARTS => c"svnic: parts of the message missing or out of order",
        0 => c"svnic: delivered",
        1 => c"svnic: no route to destination",
        2 => c"svnic: destination channel gone",
        3 => c"svnic: no receive buffer posted by destination within the wait",
        4 => c"svnic: destination RX ring full for the whole wait",
        5 => c"svnic: DMA address outside the channel's data area",
        6 => c"svnic: destination's posted buffer too small",
        7 => c"svnic: malformed message",
        8 => c"svnic: destination channel faulted",
        9 => c"svnic: posted receive buffer refused",
        10 => c"svnic: uplink error",
        11 => c"svnic: peer engine did not acknowledge within the peer timeout",
        _ => c"svnic: unknown provider error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_maps_and_has_its_own_string() {
        for &s in CompletionStatus::ALL {
            let e = send_error(s);
            assert_eq!(e.is_none(), s == CompletionStatus::Ok, "{s:?}");
            let text = prov_strerror(c_int::from(s.code())).to_str().unwrap();
            assert!(text.contains(s.describe()), "{s:?}: {text}");
        }
        assert_eq!(send_error(CompletionStatus::NoRoute), Some(FI_EHOSTUNREACH));
        assert!(prov_strerror(-5).to_str().unwrap().contains("unknown"));
    }

    #[test]
    fn under_a_reliable_layer_only_the_providers_own_faults_are_errors() {
        for &s in CompletionStatus::ALL {
            assert_eq!(send_outcome(s, Delivery::Direct), send_error(s), "{s:?}");
            let own_fault = matches!(
                s,
                CompletionStatus::AddressOutOfRange
                    | CompletionStatus::BadMessage
                    | CompletionStatus::BadPostBuffer
                    | CompletionStatus::BufferTooSmall
            );
            assert_eq!(
                send_outcome(s, Delivery::UnderReliableLayer).is_some(),
                own_fault,
                "{s:?}"
            );
        }
    }
}
