//! The DMA-data copy loop: 256-bit loads and stores, used instead of `memcpy` on CPUs with AVX2.
//!
//! glibc copies large buffers with `rep movsb` on CPUs with ERMS/FSRM, and on some CPUs (AMD
//! EPYC among them) that instruction is markedly slower for some pairs of source and destination
//! pages, reproducibly within a process; the engine's DMA rate would then depend on where a
//! guest's posted buffer happens to sit. This loop does not have that weakness and is no slower
//! than `memcpy` at ordinary placements (figures in docs/performance.md, History). Without AVX2
//! the caller falls back to `memcpy`.

/// Copies `len` bytes from `src` to `dst` with AVX2 loads and stores. Returns false, having
/// copied nothing, if the CPU lacks AVX2 (or is not x86-64).
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the two ranges must not
/// overlap. (Guest memory may change under the copy, as under `memcpy`: the bytes copied are then
/// some mix of old and new, which is the guest's own doing.)
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above); the caller guarantees the ranges.
            unsafe { copy_avx2(src, dst, len) };
            return true;
        }
    }
    let _ = (src, dst, len);
    false
}

/// Bytes per iteration of [`copy_avx2`]: four 32-byte registers, two cache lines.
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 128;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_setzero_si256, _mm256_storeu_si256,
    };
    const LANE: usize = 32;
    let mut i = 0;
    while i + BLOCK <= len {
        // All four loads come before the stores; correct since the ranges do not overlap.
        let mut regs = [_mm256_setzero_si256(); BLOCK / LANE];
        for (k, r) in regs.iter_mut().enumerate() {
            let p = src.wrapping_add(i + k * LANE).cast::<__m256i>();
            // SAFETY: `i + BLOCK <= len`, so these 32 bytes lie inside `src`'s `len` bytes,
            // which the caller guarantees readable; the unaligned load needs no alignment.
            *r = unsafe { _mm256_loadu_si256(p) };
        }
        for (k, r) in regs.iter().enumerate() {
            let p = dst.wrapping_add(i + k * LANE).cast::<__m256i>();
            // SAFETY: as above, inside `dst`'s `len` bytes, which the caller guarantees writable.
            unsafe { _mm256_storeu_si256(p, *r) };
        }
        i += BLOCK;
    }
    // A whole number of blocks (every posted buffer of a multiple of 128 bytes) needs no tail:
    // skip the call into memcpy for nothing.
    if i < len {
        // SAFETY: the last `len - i` (< BLOCK) bytes of both ranges, which do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.wrapping_add(i), dst.wrapping_add(i), len - i) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_exactly_and_nothing_more() {
        let pattern: Vec<u8> = (0..10_100u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for len in [
            0usize, 1, 31, 127, 128, 129, 255, 256, 1000, 4096, 4097, 9_999,
        ] {
            for (so, dof) in [(0usize, 0usize), (1, 0), (0, 3), (17, 45)] {
                let mut dst = vec![0xeeu8; len + dof + 64];
                let src = &pattern[so..so + len];
                let to = dst[dof..].as_mut_ptr();
                // SAFETY: `src` has `len` bytes and `dst` has `len` bytes from `dof`; two
                // different allocations.
                let copied = unsafe { copy(src.as_ptr(), to, len) };
                if !copied {
                    return; // No AVX2 here: the caller's memcpy fallback is tested elsewhere.
                }
                assert_eq!(&dst[dof..dof + len], src, "len {len}, offsets {so}/{dof}");
                assert!(
                    dst[..dof].iter().all(|b| *b == 0xee),
                    "wrote before the start"
                );
                assert!(
                    dst[dof + len..].iter().all(|b| *b == 0xee),
                    "wrote past the end"
                );
            }
        }
    }
}
