//! Replays inputs of the two harnesses with a running engine or daemon through them on stable
//! Rust: the committed seeds, then inputs decoded from pseudo-random bytes. Each must uphold the
//! harness's invariants. One test, one after the other: the vhost-user harness counts the
//! process's open fds, which must not change under it.

use svnic_fuzz_common::corpus;
use svnic_fuzz_common::engine::{self, Script};
use svnic_fuzz_common::vhost_user::{self, Input};

#[test]
fn seeds_and_pseudo_random_inputs_uphold_the_invariants() {
    let seed = 0x9e37_79b9_7f4a_7c15;
    let run = |s: &Script| engine::run(s);
    let replayed = corpus::replay("engine_hostile_rings", seed, 24, 600, run);
    assert_eq!(replayed, engine::seeds::seeds().len(), "engine seed files");

    let run = |i: &Input| vhost_user::run(i);
    let replayed = corpus::replay("vhost_user_sequences", seed, 16, 400, run);
    assert_eq!(
        replayed,
        vhost_user::seeds::seeds().len(),
        "vhost-user seed files"
    );
    vhost_user::probe();
}
