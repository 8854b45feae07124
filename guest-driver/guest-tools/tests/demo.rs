//! `svnic demo` end to end: the daemon and two host-process guests in one process, every
//! measurement run and reported.
#![allow(clippy::unwrap_used)]

#[test]
fn the_demo_runs_and_reports_every_measurement_as_json() {
    // Small counts: this checks that every path works and is reported; the numbers themselves
    // are for `svnic demo` in a release build (timings are never asserted).
    let report = svnic_guest_tools::demo::run_demo(&svnic_guest_tools::demo::DemoOptions {
        rounds: 50,
        messages: 20_000,
        workers: 1,
        pin: true,
        cpus: 0,
    })
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    for path in [
        "bypass_user_data_32",
        "bypass_dma_data_4096",
        "bypass_user_data_32_thread_per_guest",
        "virtio_net_32",
    ] {
        assert_eq!(v["round_trip"][path]["count"], 50, "{path}");
        assert!(
            v["round_trip"][path]["p50_us"].as_f64().unwrap() > 0.0,
            "{path}"
        );
    }
    assert_eq!(v["streaming"]["bypass_user_data"]["messages"], 20_000);
    assert_eq!(
        v["streaming"]["bypass_user_data_thread_per_guest"]["messages"],
        20_000
    );
    assert!(v["streaming"]["virtio_net"]["messages"].as_u64().unwrap() > 0);
    // Every streaming row is the median of STREAM_RUNS runs, all of which are reported.
    for path in [
        "bypass_user_data",
        "bypass_user_data_thread_per_guest",
        "virtio_net",
    ] {
        let runs = v["streaming"][path]["runs_messages_per_sec"]
            .as_array()
            .unwrap();
        assert_eq!(runs.len(), svnic_guest_tools::demo::STREAM_RUNS, "{path}");
        let mut rates: Vec<f64> = runs.iter().map(|r| r.as_f64().unwrap()).collect();
        rates.sort_by(f64::total_cmp);
        let median = v["streaming"][path]["messages_per_sec"].as_f64().unwrap();
        assert!(
            (median - rates[rates.len() / 2]).abs() < 1e-6 * median,
            "{path}: {median} is not the median of {rates:?}"
        );
    }
    assert_eq!(v["ring_slots"], svnic_guest_tools::demo::DEMO_RING_SLOTS);
    assert!(v["latency_ratio"].as_f64().unwrap() > 0.0);
    assert!(report.to_table().contains("virtio-net frames"));
}
