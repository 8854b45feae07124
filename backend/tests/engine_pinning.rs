//! Worker pinning respects the CPUs the engine's caller may use. Its own test binary: it reads
//! the affinity of every engine worker thread of the process, so no other engine may run
//! alongside.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use svnic_tests::wait::wait_until;

const T: Duration = Duration::from_secs(30);

#[test]
fn pinned_workers_stay_within_the_callers_cpus() {
    // As under `taskset -c <last>`: the engine must pin its workers to CPUs the caller may use,
    // not to CPUs 0..n.
    let all = svnic_backend::allowed_cpus();
    let last = *all.last().unwrap();
    let (cpus, inside) = std::thread::spawn(move || {
        svnic_backend::pin_to_cpu(last);
        assert_eq!(svnic_backend::allowed_cpus(), vec![last]);
        let engine = svnic_backend::Engine::new(svnic_backend::EngineConfig {
            workers: 2,
            pin_workers: true,
            ..Default::default()
        })
        .unwrap();
        let cpus: Vec<Option<u32>> = engine.worker_stats().iter().map(|w| w.cpu).collect();
        // Once a worker has slept it has long pinned itself (first thing it does): then read
        // each worker thread's own mask from /proc.
        wait_until(T, || {
            engine.worker_stats().iter().all(|w| w.counts.sleeps > 0)
        });
        let inside = worker_masks();
        drop(engine);
        (cpus, inside)
    })
    .join()
    .unwrap();
    assert_eq!(cpus, vec![Some(last), Some(last)]);
    assert_eq!(inside.len(), 2, "two worker threads found: {inside:?}");
    for mask in inside {
        assert_eq!(
            mask,
            last.to_string(),
            "a worker runs outside the caller's CPUs"
        );
    }
}

/// `Cpus_allowed_list` of every `svnic-worker-*` thread of this process.
fn worker_masks() -> Vec<String> {
    let mut masks = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("svnic-worker-") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        if let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            masks.push(line.split(':').nth(1).unwrap().trim().to_string());
        }
    }
    masks
}
