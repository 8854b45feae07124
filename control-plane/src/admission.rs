//! Admission of a create request against a guest's policy and its live channels: the checks of
//! [`crate::ControlPlane::begin_create`], as pure functions, in the order they are made.
//!
//! The region checks here are about the request itself (shape, policy, overflow, overlap with the
//! guest's other channels). Whether the region lies inside the guest's memory, and inside a single
//! memory-table entry, is the engine's check against its memory table, made after admission
//! (failing with `fail_create(RegionOutsideMemory | RegionStraddles)`).

use svnic_channels::layout::PAGE;
use svnic_channels::{ChannelAddr, ChannelLayout, FailureReason, LayoutError};

use crate::policy::GuestPolicy;
use crate::records::{ChannelRecord, CreateRequest};

/// The failure reason a guest is told for a layout the ABI refuses.
pub fn failure_reason_for_layout(err: &LayoutError) -> FailureReason {
    match err {
        LayoutError::BadRingSize(_) => FailureReason::BadRingSize,
        LayoutError::RegionTooSmall { .. } => FailureReason::RegionTooSmall,
        LayoutError::RegionTooLarge { .. } => FailureReason::RegionTooLarge,
        LayoutError::Misaligned(_) => FailureReason::RegionMisaligned,
        // Not produced by `ChannelLayout::new`; listed so that a new variant needs a decision here.
        LayoutError::MemoryTooShort { .. } | LayoutError::BadHeader(_) => FailureReason::BadRequest,
    }
}

/// Checks `req` from a guest with `policy` whose live channels are `live`; `endpoint_taken` says
/// whether a live channel (of any guest) holds an address. Returns the channel's layout, or the
/// first failed check's reason, in this order: MacNotOwned, EndpointOutOfRange, the ABI layout
/// (BadRingSize, RegionTooSmall, RegionTooLarge, RegionMisaligned), RegionTooLarge (policy),
/// RegionMisaligned (address), RegionOutsideMemory (address + length overflows), RegionOverlaps,
/// QuotaExceeded, EndpointTaken.
pub(crate) fn admit(
    policy: &GuestPolicy,
    req: &CreateRequest,
    live: &[&ChannelRecord],
    endpoint_taken: impl FnOnce(&ChannelAddr) -> bool,
) -> Result<ChannelLayout, FailureReason> {
    if !policy.owns_mac(&req.mac) {
        return Err(FailureReason::MacNotOwned);
    }
    if !policy.allows_endpoint(req.endpoint) {
        return Err(FailureReason::EndpointOutOfRange);
    }
    let layout = ChannelLayout::new(req.ring_size, req.region_len)
        .map_err(|e| failure_reason_for_layout(&e))?;
    if req.region_len > policy.max_region_len {
        return Err(FailureReason::RegionTooLarge);
    }
    if req.region_addr % PAGE != 0 {
        return Err(FailureReason::RegionMisaligned);
    }
    let Some(end) = req.region_addr.checked_add(req.region_len) else {
        return Err(FailureReason::RegionOutsideMemory);
    };
    if live
        .iter()
        .any(|c| req.region_addr < c.region_end() && c.region_addr < end)
    {
        return Err(FailureReason::RegionOverlaps);
    }
    if live.len() >= policy.max_channels as usize {
        return Err(FailureReason::QuotaExceeded);
    }
    if endpoint_taken(&req.addr()) {
        return Err(FailureReason::EndpointTaken);
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_error_maps_to_a_reason() {
        let cases = [
            (LayoutError::BadRingSize(3), FailureReason::BadRingSize),
            (
                LayoutError::RegionTooSmall { len: 1, need: 2 },
                FailureReason::RegionTooSmall,
            ),
            (
                LayoutError::RegionTooLarge { len: 2, max: 1 },
                FailureReason::RegionTooLarge,
            ),
            (LayoutError::Misaligned(5), FailureReason::RegionMisaligned),
            (
                LayoutError::MemoryTooShort { have: 1, need: 2 },
                FailureReason::BadRequest,
            ),
            (
                LayoutError::BadHeader(String::new()),
                FailureReason::BadRequest,
            ),
        ];
        for (err, reason) in cases {
            assert_eq!(failure_reason_for_layout(&err), reason, "{err}");
        }
    }
}
