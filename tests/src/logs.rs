//! The library's log lines, captured in memory for the tests of one test binary (the logger is
//! process-wide: the first [`capture`] installs it).
#![allow(clippy::unwrap_used)]

use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// One captured line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The name of the thread that logged it.
    pub thread: Option<String>,
    /// Its level.
    pub level: log::Level,
    /// Its text.
    pub text: String,
}

#[derive(Debug)]
struct Capture {
    lines: Mutex<Vec<Line>>,
}

static CAPTURE: Capture = Capture {
    lines: Mutex::new(Vec::new()),
};

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }
    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = Line {
            thread: std::thread::current().name().map(str::to_owned),
            level: record.level(),
            text: record.args().to_string(),
        };
        if std::env::var_os("SVNIC_TEST_LOG").is_some() {
            eprintln!("{} {}", line.level, line.text);
        }
        self.lines.lock().unwrap().push(line);
    }
    fn flush(&self) {}
}

/// Captures every line up to `max` from now on (the first call of the process decides the
/// level). `SVNIC_TEST_LOG` set: the lines also go to stderr.
pub fn capture(max: log::LevelFilter) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if log::set_logger(&CAPTURE).is_ok() {
            log::set_max_level(max);
        }
    });
}

/// Every line captured so far.
pub fn lines() -> Vec<Line> {
    CAPTURE.lines.lock().unwrap().clone()
}

/// Lines logged on the calling thread (a test's own thread is named after the test).
pub fn of_this_thread() -> Vec<Line> {
    let name = std::thread::current().name().map(str::to_owned);
    lines().into_iter().filter(|l| l.thread == name).collect()
}

/// Captured lines (as "LEVEL text") containing every one of `words`.
pub fn with(words: &[&str]) -> Vec<String> {
    lines()
        .into_iter()
        .map(|l| format!("{} {}", l.level, l.text))
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect()
}

/// How long [`wait_for`] waits.
pub const WAIT: Duration = Duration::from_secs(5);

/// Waits up to [`WAIT`] for a line containing every one of `words` (as "LEVEL text"); panics if
/// none comes.
pub fn wait_for(words: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(l) = with(words).pop() {
            return l;
        }
        assert!(Instant::now() < deadline, "no log line with {words:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
