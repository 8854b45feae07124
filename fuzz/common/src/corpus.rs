//! The committed seed corpus, `fuzz/corpus/<target>/seed-*`.

use std::fmt::Debug;
use std::path::PathBuf;

use arbitrary::Arbitrary;

use crate::encode::{decode, Encode};

/// `fuzz/corpus/<target>`.
pub fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target)
}

/// The committed seeds of `target` (`seed-*`), with their file names, sorted by name. Panics if
/// there are none.
pub fn committed(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir(target))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    name.starts_with("seed-")
                        .then(|| Some((name, std::fs::read(e.path()).ok()?)))?
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !seeds.is_empty(),
        "no committed seeds in {}",
        dir(target).display()
    );
    seeds.sort();
    seeds
}

/// Checks seeds written as values: each encodes to bytes that decode back into it, and the
/// committed files of `target` hold those bytes (see [`stale`]). Panics otherwise.
pub fn check_values<T>(target: &str, seeds: &[(&str, T)])
where
    T: Encode + for<'a> Arbitrary<'a> + PartialEq + Debug,
{
    let files: Vec<(&str, Vec<u8>)> = seeds
        .iter()
        .map(|(name, value)| {
            let bytes = value.to_bytes();
            assert_eq!(decode::<T>(&bytes).as_ref(), Ok(value), "{name}");
            (*name, bytes)
        })
        .collect();
    let stale = stale(target, &files);
    assert!(
        stale.is_empty(),
        "{stale:?} stale: rerun with SVNIC_FUZZ_WRITE_SEEDS=1"
    );
}

/// For the seeds written as values: the names of `files` whose committed copy differs from the
/// bytes given (missing ones included). With `SVNIC_FUZZ_WRITE_SEEDS` set in the environment it
/// first writes every file, so that the answer is empty unless writing failed.
pub fn stale(target: &str, files: &[(&str, Vec<u8>)]) -> Vec<String> {
    let dir = dir(target);
    if std::env::var_os("SVNIC_FUZZ_WRITE_SEEDS").is_some() {
        let _ = std::fs::create_dir_all(&dir);
        for (name, bytes) in files {
            let _ = std::fs::write(dir.join(name), bytes);
        }
    }
    files
        .iter()
        .filter(|(name, bytes)| std::fs::read(dir.join(name)).ok().as_ref() != Some(bytes))
        .map(|(name, _)| (*name).to_string())
        .collect()
}

/// Decodes every committed seed of `target` and passes it to `run`, then `count` inputs decoded
/// from `len` [`pseudo_random`] bytes each (from `seed`); the number of committed seeds. Panics
/// if a seed does not decode.
pub fn replay<T>(
    target: &str,
    seed: u64,
    count: usize,
    len: usize,
    mut run: impl FnMut(&T),
) -> usize
where
    T: for<'a> Arbitrary<'a>,
{
    let committed = committed(target);
    for (name, bytes) in &committed {
        run(&decode(bytes).unwrap_or_else(|e| panic!("{name} does not decode: {e}")));
    }
    for bytes in pseudo_random(seed, count, len) {
        // Any bytes decode (missing ones read as zero).
        if let Ok(input) = decode(&bytes) {
            run(&input);
        }
    }
    committed.len()
}

/// `count` inputs of `len` pseudo-random bytes (xorshift64 from `seed`, which must not be 0):
/// for replaying more than the seeds through a harness where libFuzzer is missing.
pub fn pseudo_random(seed: u64, count: usize, len: usize) -> Vec<Vec<u8>> {
    let mut x = seed;
    let mut byte = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x.to_le_bytes()[0]
    };
    (0..count)
        .map(|_| (0..len).map(|_| byte()).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::input::MAX_OPS;
    use crate::vhost_user::input::MAX_MESSAGES;

    #[test]
    fn seeds_written_as_values_round_trip_are_committed_and_fit_the_harness_limits() {
        let engine = crate::engine::seeds::seeds();
        check_values("engine_hostile_rings", &engine);
        for (name, script) in engine {
            assert!((1..=MAX_OPS).contains(&script.ops.len()), "{name}");
        }
        let vhost_user = crate::vhost_user::seeds::seeds();
        check_values("vhost_user_sequences", &vhost_user);
        for (name, input) in vhost_user {
            assert!((1..=MAX_MESSAGES).contains(&input.messages.len()), "{name}");
        }
    }

    #[test]
    fn pseudo_random_bytes_are_deterministic_and_vary() {
        let a = pseudo_random(1, 2, 64);
        assert_eq!(a, pseudo_random(1, 2, 64));
        assert_ne!(a[0], a[1]);
        assert!(a[0].iter().any(|b| *b != a[0][0]));
    }
}
