//! The input of `engine_hostile_rings`: a script of what the attacker guest writes into its two
//! channels, interleaved with what the honest victim and healthy guests do.

use crate::encode::structured;

/// Operations per input at most (the rest is ignored).
pub const MAX_OPS: usize = 200;
/// Messages of one [`Op::Burst`] at most (the rest is ignored).
pub const MAX_BURST: usize = 20;

structured! {
    /// One fuzz input.
    pub struct Script {
        /// Run in order (at most [`MAX_OPS`]).
        pub ops: Vec<Op>,
    }
}

structured! {
    /// One attacker channel.
    #[derive(Copy)]
    pub enum Attacker {
        A0,
        A1,
    }
}

structured! {
    /// One step of the script.
    pub enum Op {
        /// A u32 store into a header word of the attacker's channel.
        Store { chan: Attacker, word: HeaderWord, value: Value, },
        /// 64 raw bytes into any slot of any of its rings.
        RawSlot { chan: Attacker, ring: Ring, slot: u8, bytes: [u8; 64], },
        /// A (mostly) well-formed message at its own TX head, not yet published.
        Write { chan: Attacker, slot: Slot, },
        /// A posted buffer (often hostile) at its own post head, not yet published.
        Post { chan: Attacker, cookie: u16, buf: Span, },
        /// Publishes the TX and post heads as written (the honest move), and maybe rings.
        Publish { chan: Attacker, doorbell: bool, },
        /// A doorbell of any channel, even one that is not its own.
        Doorbell { chan: Attacker, target: Target, },
        /// A short wait (`units % 8` times 50 µs) so the worker gets to what was written.
        Wait { units: u8, },
        /// The victim drains its RX ring and re-posts its buffers.
        VictimDrain,
        /// The victim sends `(len + 1) * 32` bytes of DMA-data to an attacker channel.
        VictimDma { to: Attacker, len: u8, },
        /// The healthy channel sends user-data to an attacker channel.
        HealthyUser { to: Attacker, cookie: u8, want_completion: bool, },
        /// Publishes the TX or post head `delta` past what was written.
        Skew { chan: Attacker, head: Head, delta: u8, },
        /// Messages at the TX head (at most [`MAX_BURST`]), published at once, and a doorbell.
        Burst { chan: Attacker, slots: Vec<Slot>, },
    }
}

structured! {
    /// A header word: each field by name (those the guest writes, those only the engine should
    /// write, then the layout both read), or any aligned offset of the header block.
    #[derive(Copy)]
    pub enum HeaderWord {
        TxHead,
        RxTail,
        PostHead,
        GuestSleeping,
        TxTail,
        RxHead,
        PostTail,
        EngineSleeping,
        Fault,
        Ready,
        ChannelId,
        Worker,
        Cpu,
        Magic,
        Version,
        RingSize,
        RegionLen,
        DataOffset,
        TxRing,
        RxRing,
        PostRing,
        /// `(n % header::END) & !3`.
        Any(u32),
    }
}

structured! {
    /// The value of a [`Op::Store`].
    #[derive(Copy)]
    pub enum Value {
        /// The attacker's TX head plus `n`.
        TxHeadPlus(u8),
        /// The attacker's post head plus `n`.
        PostHeadPlus(u8),
        /// `n` times the ring size.
        RingTimes(u8),
        /// `u32::MAX - n`.
        NearMax(u8),
        Small(u8),
        Any(u32),
    }
}

structured! {
    /// One of the three rings.
    #[derive(Copy)]
    pub enum Ring {
        Tx,
        Rx,
        Post,
    }
}

structured! {
    /// A head the attacker publishes.
    #[derive(Copy)]
    pub enum Head {
        Tx,
        Post,
    }
}

structured! {
    /// Whose doorbell [`Op::Doorbell`] rings.
    #[derive(Copy)]
    pub enum Target {
        /// The attacker channel's own.
        Own,
        Victim,
        /// Any channel id.
        Any(u32),
        Healthy,
    }
}

structured! {
    /// A message the attacker writes into its TX ring.
    pub struct Slot {
        pub peer: Peer,
        pub cookie: u16,
        pub body: SlotBody,
        /// Flips bits of one byte of the encoded message.
        pub flip: Option<Flip>,
    }
}

structured! {
    /// What [`Slot`] holds.
    pub enum SlotBody {
        /// User-data of `len % 41` bytes, the first `first`, flags `flags & 3`.
        User { flags: u8, len: u8, first: u8, },
        /// DMA-data, flags `flags & 1`.
        Dma { flags: u8, data: Span, },
        /// A post-buffer message (which has no business in a TX ring).
        Post(Span),
        /// Any 64 bytes (peer and cookie unused).
        Raw([u8; 64]),
    }
}

structured! {
    /// Bits flipped in byte `at % 64`: `xor | 1`.
    #[derive(Copy)]
    pub struct Flip {
        pub at: u8,
        pub xor: u8,
    }
}

structured! {
    /// The peer address of a message.
    #[derive(Copy)]
    pub enum Peer {
        Victim,
        A0,
        A1,
        Healthy,
        /// The victim's MAC with an endpoint nobody has.
        VictimNoEndpoint,
        /// The engine's MAC.
        Engine,
        /// All zero.
        Zero,
    }
}

structured! {
    /// A DMA source or a posted buffer.
    #[derive(Copy)]
    pub struct Span {
        pub offset: Offset,
        pub len: Length,
    }
}

structured! {
    /// An offset in the attacker's channel region: inside or around its data area, at the edges
    /// of the region, or far away (where other memory, the victim's channel included, lies).
    #[derive(Copy)]
    pub enum Offset {
        /// `data_offset + 64 n`.
        Data(u8),
        /// `region_len - 64 n`.
        RegionEnd(u8),
        /// `64 n`: the header and rings.
        Start(u8),
        /// `data_offset - 64 n - 1`.
        BeforeData(u8),
        /// The victim's channel address plus `64 n`.
        Victim(u8),
        /// `u64::MAX - 64 n`.
        NearMax(u8),
        /// `data_offset + n % data_len`.
        InData(u32),
        Any(u64),
    }
}

structured! {
    /// A DMA or buffer length.
    #[derive(Copy)]
    pub enum Length {
        Zero,
        /// `n + 1`.
        Small(u8),
        /// The victim's posted-buffer size.
        Post,
        /// `n` KiB.
        Kib(u8),
        /// `u32::MAX - n`.
        NearMax(u8),
        Any(u32),
    }
}
