//! Worker CPU placement: the CPUs a thread may use, and pinning to one.

/// The CPUs the calling thread may run on (its affinity mask, as `taskset` or a cpuset left it),
/// in ascending order. Falls back to `0..available_parallelism` if the mask cannot be read.
pub fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is valid for writes of its size.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    let cpus: Vec<u32> = if r == 0 {
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET reads inside `set` for every index below CPU_SETSIZE.
            .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
            .map(|c| c as u32)
            .collect()
    } else {
        Vec::new()
    };
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        return (0..n).collect();
    }
    cpus
}

/// Pins the calling thread to `cpu` (modulo the CPU set size); logs a warning if refused.
pub fn pin_to_cpu(cpu: u32) {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within `set`; cpu is reduced modulo CPU_SETSIZE first.
    unsafe { libc::CPU_SET(cpu as usize % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: pid 0 is the calling thread; set is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        log::warn!(
            "could not pin worker to cpu {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}
