use super::*;

#[test]
fn slot_offsets_match_the_kernels_tpacket_v2_layout() {
    assert_eq!(HDR_LEN, 52);
    assert_eq!(SLL_OFFSET, 32);
    // netoff = TPACKET_ALIGN(52 + 16) = 80, macoff = 80 - 14.
    assert_eq!(RX_FRAME_OFFSET, 66);
    assert_eq!(TX_FRAME_OFFSET, 32);
}

#[test]
fn layouts_hold_the_requested_slots_in_page_multiple_blocks() {
    for (frame_size, frames, page) in [
        (1584, 1024, 4096),
        (1584, 1, 4096),
        (1584, 8, 4096),
        (2048, 256, 4096),
        (9296, 100, 4096),
        (16, 3, 4096),
        (65_552, 5, 65_536),
    ] {
        let l = RingLayout::new(frame_size, frames, page).expect("valid layout");
        assert!(l.frames() >= frames, "{l:?}");
        assert_eq!(l.block_size % page, 0, "{l:?}");
        assert!(l.frames_per_block * l.frame_size <= l.block_size, "{l:?}");
        // Rounding up adds less than one block of slots.
        assert!(l.frames() - frames < l.frames_per_block, "{l:?}");
        let req = l.request();
        assert_eq!(
            req.tp_frame_nr as usize,
            req.tp_block_nr as usize * l.frames_per_block
        );
        let mut last_end = 0;
        for slot in 0..l.frames() {
            let at = l.slot_offset(slot);
            assert_eq!(at % SLOT_ALIGN, 0);
            assert!(at >= last_end, "slots overlap: {l:?} slot {slot}");
            // A slot never straddles two blocks.
            assert_eq!(at / l.block_size, (at + l.frame_size - 1) / l.block_size);
            last_end = at + l.frame_size;
        }
        assert!(last_end <= l.bytes());
    }
}

#[test]
fn impossible_layouts_are_refused() {
    assert_eq!(RingLayout::new(0, 16, 4096), None);
    assert_eq!(RingLayout::new(1580, 16, 4096), None);
    assert_eq!(RingLayout::new(1584, 0, 4096), None);
    assert_eq!(RingLayout::new(1584, 16, 0), None);
    assert_eq!(RingLayout::new(1 << 40, 16, 4096), None);
    assert_eq!(RingLayout::new(2048, usize::MAX / 2, 4096), None);
}
