//! Seed inputs of `vhost_user_sequences`: the polite orders real frontends use, and a few
//! hostile turns on them, written as values.

use svnic_tests::raw_frontend::protocol::{CONFIG, CONFIGURE_MEM_SLOTS, REPLY_ACK, RESET_DEVICE};
use svnic_tests::raw_frontend::{config_body, req};

use super::input::{Addr, Attach, Body, Flags, Input, Message, Region, Request};

/// The guest memory of the seeds: 8 MiB.
const MEM: u32 = 8 << 20;
const QUEUE_SIZE: u32 = 256;
/// Ring areas (guest offsets) of ring 0 and ring 1.
const RING_AT: [u32; 2] = [0x1_0000, 0x2_0000];

/// VIRTIO_F_VERSION_1, VHOST_USER_F_PROTOCOL_FEATURES, RING_EVENT_IDX, RING_INDIRECT_DESC,
/// NET_MRG_RXBUF: what svnic offers, less MAC and STATUS (QEMU acks those as the device's).
const ACKED_FEATURES: u64 = (1 << 32) | (1 << 30) | (1 << 29) | (1 << 28) | (1 << 15);

fn msg(code: u32, flags: Flags, body: Body, fds: Vec<Attach>) -> Message {
    Message {
        truncate_before: false,
        request: Request::of(code),
        flags,
        body,
        size: None,
        fds,
    }
}

fn plain(code: u32, body: Body) -> Message {
    msg(code, Flags::Version1, body, Vec::new())
}

fn sealed_memory() -> Attach {
    Attach::Memfd {
        size: MEM,
        sealed: true,
    }
}

/// One region over the whole memory, at guest address 0.
fn whole_memory() -> Region {
    Region::Pages {
        gpa_page: 0,
        pages: (MEM / 4096) as u16,
        user_page: 0,
        offset_page: 0,
    }
}

fn mem_table(fd: Attach) -> Message {
    msg(
        req::SET_MEM_TABLE,
        Flags::NeedReply,
        Body::MemTable {
            regions: vec![whole_memory()],
            claimed: None,
        },
        vec![fd],
    )
}

fn vring_fd(code: u32, ring: u8, fd: Attach) -> Message {
    msg(
        code,
        Flags::Version1,
        Body::VringFd {
            index: ring,
            no_fd: false,
        },
        vec![fd],
    )
}

fn vring_state(code: u32, ring: u32, num: u32) -> Message {
    plain(code, Body::VringState { index: ring, num })
}

fn vring_addr(ring: u32) -> Message {
    let at = |off: u32| Addr::InRegion {
        region: 0,
        offset: RING_AT[ring as usize] + off,
    };
    plain(
        req::SET_VRING_ADDR,
        Body::VringAddr {
            index: ring,
            flags: 0,
            desc: at(0),
            avail: at(16 * QUEUE_SIZE),
            used: at(0x3000),
            log: 0,
        },
    )
}

/// QEMU 7.2's vhost-user-net start, as measured: protocol features, owner, call fds, both rings
/// enabled *before* SET_FEATURES, features, memory table, then each ring.
fn qemu_7_2(memory: Attach) -> Vec<Message> {
    let mut m = vec![
        plain(req::GET_FEATURES, Body::Empty),
        plain(req::GET_PROTOCOL_FEATURES, Body::Empty),
        plain(
            req::SET_PROTOCOL_FEATURES,
            Body::U64(REPLY_ACK | RESET_DEVICE),
        ),
        plain(req::SET_OWNER, Body::Empty),
        vring_fd(req::SET_VRING_CALL, 0, Attach::EventFd),
        vring_fd(req::SET_VRING_CALL, 1, Attach::EventFd),
        vring_state(req::SET_VRING_ENABLE, 0, 1),
        vring_state(req::SET_VRING_ENABLE, 1, 1),
        plain(req::SET_FEATURES, Body::U64(ACKED_FEATURES)),
        mem_table(memory),
    ];
    for ring in 0..2u8 {
        let r = u32::from(ring);
        m.push(vring_state(req::SET_VRING_NUM, r, QUEUE_SIZE));
        m.push(vring_state(req::SET_VRING_BASE, r, 0));
        m.push(vring_addr(r));
        m.push(vring_fd(req::SET_VRING_KICK, ring, Attach::EventFd));
        m.push(vring_fd(req::SET_VRING_CALL, ring, Attach::EventFd));
    }
    m
}

/// The `vhost` crate's frontend order (svnic-guest's host-process guests): owner, features,
/// protocol features, memory table, then each ring with SET_VRING_ENABLE; `call`/`kick` are the
/// fds given as each ring's call and kick.
fn vhost_crate(memory: Attach, call: Attach, kick: Attach) -> Vec<Message> {
    let mut m = vec![
        plain(req::SET_OWNER, Body::Empty),
        plain(req::GET_FEATURES, Body::Empty),
        plain(req::SET_FEATURES, Body::U64(ACKED_FEATURES)),
        plain(req::GET_PROTOCOL_FEATURES, Body::Empty),
        plain(
            req::SET_PROTOCOL_FEATURES,
            Body::U64(REPLY_ACK | CONFIG | RESET_DEVICE),
        ),
        mem_table(memory),
    ];
    m.extend(rings_up(call, kick));
    m
}

fn rings_up(call: Attach, kick: Attach) -> Vec<Message> {
    let mut m = Vec::new();
    for ring in 0..2u8 {
        let r = u32::from(ring);
        m.push(vring_state(req::SET_VRING_NUM, r, QUEUE_SIZE));
        m.push(vring_addr(r));
        m.push(vring_state(req::SET_VRING_BASE, r, 0));
        m.push(vring_fd(req::SET_VRING_CALL, ring, call));
        m.push(vring_fd(req::SET_VRING_KICK, ring, kick));
        m.push(msg(
            req::SET_VRING_ENABLE,
            Flags::NeedReply,
            Body::VringState { index: r, num: 1 },
            Vec::new(),
        ));
    }
    m
}

/// Every seed, with its file name.
pub fn seeds() -> Vec<(&'static str, Input)> {
    let polite = vhost_crate(sealed_memory(), Attach::EventFd, Attach::EventFd);

    let mut config_and_reset = polite.clone();
    // GET_CONFIG of the 10 bytes of the MAC and status.
    let get_config = config_body(0, &[0; 10]);
    config_and_reset.push(plain(req::GET_CONFIG, Body::Raw(get_config)));
    for ring in 0..2 {
        config_and_reset.push(vring_state(req::SET_VRING_ENABLE, ring, 0));
        config_and_reset.push(vring_state(req::GET_VRING_BASE, ring, 0));
    }
    config_and_reset.push(mem_table(sealed_memory()));
    config_and_reset.extend(rings_up(Attach::EventFd, Attach::EventFd));
    config_and_reset.push(plain(req::RESET_DEVICE, Body::Empty));

    // The memory goes away under the device: truncated once the rings point into it.
    let mut truncated = vhost_crate(
        Attach::MemfdTruncatedLater { size: MEM },
        Attach::EventFd,
        Attach::EventFd,
    );
    let first_addr = truncated
        .iter()
        .position(|m| m.request.code() == req::SET_VRING_ADDR)
        .unwrap_or(0);
    truncated[first_addr].truncate_before = true;

    // Distinct ring indices enabled before SET_FEATURES.
    let mut enable_flood = vec![plain(req::SET_OWNER, Body::Empty)];
    enable_flood.extend((0..40).map(|ring| vring_state(req::SET_VRING_ENABLE, 1000 + ring, 1)));
    enable_flood.extend(qemu_7_2(sealed_memory()));

    // A protocol feature svnic never offered (CONFIGURE_MEM_SLOTS), acked anyway, then regions added one by one.
    let mut mem_slots = polite.clone();
    mem_slots.insert(
        4,
        plain(
            req::SET_PROTOCOL_FEATURES,
            Body::U64(REPLY_ACK | CONFIGURE_MEM_SLOTS),
        ),
    );
    for i in 0..3u16 {
        mem_slots.push(msg(
            req::ADD_MEM_REG,
            Flags::NeedReply,
            Body::SingleRegion(Region::Pages {
                gpa_page: 0x1000 * (i + 1),
                pages: 16,
                user_page: 0x10_0000 * (u32::from(i) + 1),
                offset_page: 0,
            }),
            vec![Attach::Memfd {
                size: 16 * 4096,
                sealed: true,
            }],
        ));
    }

    vec![
        ("seed-qemu-7.2", qemu_7_2(sealed_memory())),
        ("seed-vhost-crate", polite),
        ("seed-config-stop-restart-reset", config_and_reset),
        (
            "seed-unsealed-memory",
            vhost_crate(
                Attach::Memfd {
                    size: MEM,
                    sealed: false,
                },
                Attach::EventFd,
                Attach::EventFd,
            ),
        ),
        ("seed-truncated-memory", truncated),
        (
            "seed-pipe-notifiers",
            vhost_crate(sealed_memory(), Attach::PipeWrite, Attach::PipeRead),
        ),
        ("seed-early-enable-flood", enable_flood),
        ("seed-unoffered-mem-slots", mem_slots),
    ]
    .into_iter()
    .map(|(name, messages)| (name, Input { messages }))
    .collect()
}
