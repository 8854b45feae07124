use std::ffi::CStr;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::*;

const PAGE: usize = 4096;
const BASE: u64 = 0x10_0000;
const WAIT: Duration = Duration::from_secs(10);
/// Selects what the test binary does when run as a child by a test of this module.
const CHILD_MODE: &str = "SVNIC_SIGBUS_GUARD_CHILD";

fn memfd(name: &CStr, len: u64, flags: libc::c_uint) -> Option<File> {
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).ok()?;
    Some(file)
}

fn table_of(file: &File, len: usize) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges_with_files(&[(
        GuestAddress(BASE),
        len,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )])
    .unwrap()
}

/// Guards every region of `table` in pages of `page`; faults go to the returned receiver.
fn guard_table(
    table: &GuestMemoryMmap,
    page: usize,
    token: u64,
) -> Result<mpsc::Receiver<GuestMemoryFault>, GuardError> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let owner = FaultOwner::new(token, move |f| {
        let _ = tx.lock().unwrap().send(f);
    });
    guard_regions(table.iter().map(|r| (r, page)), &owner)?;
    Ok(rx)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mapped_in_this_process(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains(name)
}

fn no_core_dump() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads one rlimit that lives for the call.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

#[test]
fn a_truncated_memfd_reads_zeros_and_its_owner_is_told() {
    let file = memfd(c"svnic-guard-truncated", 16 * PAGE as u64, 0).unwrap();
    let table = table_of(&file, 16 * PAGE);
    for at in [0x3010, 0x8000] {
        table
            .write_obj(0xdead_beef_u32, GuestAddress(BASE + at))
            .unwrap();
    }
    let faults = guard_table(&table, PAGE, 0x7001).unwrap();
    let before = recovered_faults();

    file.set_len(0).unwrap();
    let read: u32 = table.read_obj(GuestAddress(BASE + 0x3010)).unwrap();
    assert_eq!(read, 0, "the page vanished: zero memory stands in");
    let read: u32 = table.read_obj(GuestAddress(BASE + 0x8000)).unwrap();
    assert_eq!(read, 0, "for the whole region");
    table
        .write_slice(&[0x5a; 64], GuestAddress(BASE + 0x5000))
        .unwrap();
    let mut back = [0u8; 64];
    table
        .read_slice(&mut back, GuestAddress(BASE + 0x5000))
        .unwrap();
    assert_eq!(back, [0x5a; 64], "the stand-in memory takes writes");

    let first = faults.recv_timeout(WAIT).expect("the owner was not told");
    assert_eq!(first.token, 0x7001);
    assert_eq!(first.gpa, BASE + 0x3010, "{first:x?}");
    assert!(recovered_faults() > before);
}

#[test]
fn a_region_stays_guarded_until_its_last_user_drops_it() {
    let name = "svnic-guard-lifetime";
    let file = memfd(c"svnic-guard-lifetime", 4 * PAGE as u64, 0).unwrap();
    let table = Arc::new(table_of(&file, 4 * PAGE));
    drop(file);
    let _faults = guard_table(&table, PAGE, 0x7002).unwrap();
    let user = Arc::clone(&table);

    drop(table);
    release_unused();
    assert_eq!(guarded_regions_of(0x7002), 1, "another user still holds it");
    assert!(mapped_in_this_process(name));
    user.write_obj(1u8, GuestAddress(BASE)).unwrap();

    drop(user);
    release_unused();
    assert_eq!(guarded_regions_of(0x7002), 0, "the slot is free again");
    assert!(!mapped_in_this_process(name), "and the mapping is gone");
}

#[test]
fn the_guard_thread_releases_a_dropped_table_by_itself() {
    let file = memfd(c"svnic-guard-sweep", 4 * PAGE as u64, 0).unwrap();
    let table = table_of(&file, 4 * PAGE);
    let _faults = guard_table(&table, PAGE, 0x7003).unwrap();
    assert_eq!(guarded_regions_of(0x7003), 1);
    drop(table);
    wait_until("the sweep released the region", || {
        guarded_regions_of(0x7003) == 0
    });
}

#[test]
fn a_region_guarded_again_moves_to_its_new_owner() {
    let file = memfd(c"svnic-guard-owner", 4 * PAGE as u64, 0).unwrap();
    let table = table_of(&file, 4 * PAGE);
    let _old = guard_table(&table, PAGE, 0x7004).unwrap();
    let new = guard_table(&table.clone(), PAGE, 0x7005).unwrap();
    assert_eq!(guarded_regions_of(0x7004), 0);
    assert_eq!(guarded_regions_of(0x7005), 1, "one slot, not two");

    file.set_len(0).unwrap();
    table.write_obj(7u8, GuestAddress(BASE + 0x1000)).unwrap();
    assert_eq!(new.recv_timeout(WAIT).unwrap().token, 0x7005);
}

#[test]
fn a_page_size_the_mapping_is_not_aligned_to_is_refused() {
    let file = memfd(c"svnic-guard-granularity", 4 * PAGE as u64, 0).unwrap();
    let table = table_of(&file, 4 * PAGE);
    for page in [3000, 1 << 40] {
        assert!(matches!(
            guard_table(&table, page, 0x7006),
            Err(GuardError::BadGranularity { gpa: BASE, .. })
        ));
    }
    assert_eq!(guarded_regions_of(0x7006), 0);
}

/// Runs this test binary as a child in `mode` (see [`child_process`]).
fn run_child(mode: &str) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "net::sigbus_guard::tests::child_process",
            "--exact",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_MODE, mode)
        .status()
        .unwrap()
}

#[test]
fn a_sigbus_outside_guarded_memory_still_kills_the_process() {
    let status = run_child("unguarded-fault");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}");
}

#[test]
fn a_full_guard_refuses_a_table_until_room_is_made() {
    let status = run_child("fill");
    assert!(status.success(), "{status:?}");
}

/// The body of the child-process tests; does nothing in a normal run.
#[test]
fn child_process() {
    match std::env::var(CHILD_MODE).as_deref() {
        Ok("unguarded-fault") => child_unguarded_fault(),
        Ok("fill") => child_fill(),
        _ => {}
    }
}

fn child_unguarded_fault() {
    no_core_dump();
    let guarded = memfd(c"svnic-guard-child-guarded", PAGE as u64, 0).unwrap();
    let guarded = table_of(&guarded, PAGE);
    let _faults = guard_table(&guarded, PAGE, 0x7100).unwrap();
    let unguarded = memfd(c"svnic-guard-child-unguarded", PAGE as u64, 0).unwrap();
    let table = table_of(&unguarded, PAGE);
    unguarded.set_len(0).unwrap();
    let _ = table.read_obj::<u8>(GuestAddress(BASE));
    eprintln!("survived a SIGBUS outside guarded memory");
    std::process::exit(0);
}

/// `count` one-page regions, all mapping the start of `file` (one descriptor for every mapping:
/// a child's fd limit may be lower than the slot count).
fn regions_of(file: &Arc<File>, first: u64, count: usize) -> GuestMemoryMmap {
    let ranges: Vec<_> = (0..count as u64)
        .map(|i| {
            let f = FileOffset::from_arc(Arc::clone(file), 0);
            (GuestAddress((first + i) * PAGE as u64), PAGE, Some(f))
        })
        .collect();
    GuestMemoryMmap::from_ranges_with_files(&ranges).unwrap()
}

fn child_fill() {
    let file = memfd(c"svnic-guard-child-fill", PAGE as u64, 0).unwrap();
    let file = Arc::new(file);
    // Every owner takes its whole share, until the table is full.
    let tables: Vec<_> = (0..SLOT_COUNT / OWNER_SHARE)
        .map(|k| {
            let table = regions_of(&file, (k * OWNER_SHARE) as u64, OWNER_SHARE);
            let guarded = guard_table(&table, PAGE, 0x7200 + k as u64).unwrap();
            (table, guarded)
        })
        .collect();
    let one = table_of(&file, PAGE);
    let newcomer = 0x7200 + tables.len() as u64;
    let refused = guard_table(&one, PAGE, newcomer);
    assert!(
        matches!(
            refused,
            Err(GuardError::Full {
                wanted: 1,
                capacity: SLOT_COUNT
            })
        ),
        "{refused:?}"
    );
    assert_eq!(guarded_regions_of(newcomer), 0);
    drop(tables);
    guard_table(&one, PAGE, newcomer).expect("the dropped tables made room");
    assert_eq!(guarded_regions_of(0x7200), 0);
    assert_eq!(guarded_regions_of(newcomer), 1);
}

#[test]
fn one_owner_cannot_take_more_than_its_share() {
    let file = Arc::new(memfd(c"svnic-guard-share", PAGE as u64, 0).unwrap());
    let share = regions_of(&file, 0, OWNER_SHARE);
    let _held = guard_table(&share, PAGE, 0x7300).unwrap();
    let one_more = table_of(&file, PAGE);
    let refused = guard_table(&one_more, PAGE, 0x7300);
    assert!(
        matches!(
            refused,
            Err(GuardError::OwnerFull { token: 0x7300, held, wanted: 1, share })
                if held == OWNER_SHARE && share == OWNER_SHARE
        ),
        "{refused:?}"
    );
    assert_eq!(guarded_regions_of(0x7300), OWNER_SHARE);
    let _other = guard_table(&one_more, PAGE, 0x7301).expect("another owner still has room");
    assert_eq!(guarded_regions_of(0x7301), 1);
}

/// Raises the hugepage pool for a test and puts the old size back.
struct HugepagePool {
    old: Option<String>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl HugepagePool {
    fn grow_by(pages: u64) -> Self {
        let old = std::fs::read_to_string(NR_HUGEPAGES).ok();
        let grown = old
            .as_deref()
            .and_then(|o| o.trim().parse::<u64>().ok())
            .map(|n| n + pages)
            .filter(|n| std::fs::write(NR_HUGEPAGES, n.to_string()).is_ok());
        HugepagePool {
            old: grown.and(old),
        }
    }
}

impl Drop for HugepagePool {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(NR_HUGEPAGES, old.trim());
        }
    }
}

fn free_hugepages() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("HugePages_Free:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn an_exhausted_hugepage_pool_faults_into_zero_hugepages() {
    const HUGE: usize = 2 << 20;
    let Some(file) = memfd(
        c"svnic-guard-huge",
        0,
        libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
    ) else {
        eprintln!("skipped: no 2 MiB hugetlbfs memfd on this machine");
        return;
    };
    // Some pages backed by the pool, and more than it has: the rest fault.
    let _pool = HugepagePool::grow_by(2);
    let Some(free) = free_hugepages() else {
        eprintln!("skipped: no HugePages_Free in /proc/meminfo");
        return;
    };
    let pages = usize::try_from(free).unwrap() + 2;
    file.set_len((pages * HUGE) as u64).unwrap();
    // vm-memory maps files MAP_SHARED | MAP_NORESERVE, as vhost-user-backend does.
    let table = table_of(&file, pages * HUGE);
    let faults = guard_table(&table, HUGE, 0x7300).unwrap();
    let before = recovered_faults();

    for page in 0..pages as u64 {
        let addr = GuestAddress(BASE + page * HUGE as u64 + 8);
        table.write_obj(page + 1, addr).unwrap();
        assert_eq!(table.read_obj::<u64>(addr).unwrap(), page + 1);
    }
    assert!(recovered_faults() > before, "the pool ran out");
    let fault = faults.recv_timeout(WAIT).expect("the owner was not told");
    assert_eq!(fault.token, 0x7300);
    assert_eq!((fault.gpa - BASE) % HUGE as u64, 8);
    drop(table);
    release_unused();
}
