//! `svnic-guest crash-test`: an application holding a channel is SIGKILLed; the test succeeds
//! once a channel can be created at the same endpoint again.

use std::time::{Duration, Instant};

use super::args::{CrashTestArgs, PathKind};
use super::transport::{Transport, TransportError, CONTROL_TIMEOUT};
use super::{CliError, Outcome, Report};

pub(super) fn crash_test(a: &CrashTestArgs) -> Result<Report, CliError> {
    let c = &a.common;
    if !matches!(c.path, PathKind::User | PathKind::Dma) {
        return Err(CliError::Usage(
            "crash-test needs a channel path (user or dma)".into(),
        ));
    }
    let wait = c.wait();
    let endpoint = c.endpoint.to_string();
    let mut args: Vec<String> = vec!["echo".into(), "--endpoint".into(), endpoint];
    match (&c.socket, &c.agent) {
        (Some(s), _) => args.extend(["--socket".into(), s.display().to_string()]),
        (None, Some(p)) => args.extend(["--agent".into(), p.display().to_string()]),
        (None, None) => {}
    }
    args.extend([
        "--count".into(),
        "1000000000".into(),
        "--wait".into(),
        "3600".into(),
    ]);
    let exe = std::env::current_exe().map_err(|e| CliError::failed("find this program", e))?;
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| CliError::failed("start the application to kill", e))?;
    let pid = child.id();
    let ready = wait_for_ready(&mut child, wait);
    let local = match ready {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    // SIGKILL: the application dies without destroying anything.
    let _ = child.kill();
    let _ = child.wait();
    let killed = Instant::now();
    let t = Transport::connect(c)?;
    let deadline = killed + wait;
    loop {
        let attempt = match &t {
            Transport::Host(g) => g
                .create_channel(c.endpoint, c.ring_size, CONTROL_TIMEOUT)
                .map_err(TransportError::from),
            Transport::Vm(ag) => ag
                .create_channel(c.endpoint, c.ring_size, CONTROL_TIMEOUT)
                .map_err(TransportError::from),
        };
        match attempt {
            Ok(ch) => {
                let after = killed.elapsed();
                t.release(ch);
                return Ok(c.report(
                    "crash-test",
                    (0, 1),
                    local,
                    None,
                    Outcome::Reclaimed { pid, after },
                ));
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(CliError::failed(
                    format!(
                        "endpoint {} still taken {wait:?} after the kill",
                        c.endpoint
                    ),
                    e,
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads the child's stderr until its "ready at ADDR" line; returns ADDR.
fn wait_for_ready(child: &mut std::process::Child, within: Duration) -> Result<String, CliError> {
    use std::io::BufRead;
    let Some(err) = child.stderr.take() else {
        return Err(CliError::failed(
            "start the application to kill",
            "no stderr",
        ));
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split(": ready at ").nth(1) {
                    return Ok(rest.split(' ').next().unwrap_or(rest).to_string());
                }
            }
            Err(_) => {
                return Err(CliError::failed(
                    "start the application to kill",
                    format!("it did not get a channel within {within:?}"),
                ))
            }
        }
    }
}
