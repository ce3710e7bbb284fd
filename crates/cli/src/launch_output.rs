//! What `launch` shows of its ranks: rank 0's output passed through, the
//! others' lines prefixed or kept back as a tail, and how a rank ended.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::thread::JoinHandle;

use crate::launch::{Tail, MAX_LINE, TAIL_LINES};

pub(crate) fn write_out(to_stdout: bool, bytes: &[u8]) -> std::io::Result<()> {
    if to_stdout {
        let mut o = std::io::stdout().lock();
        o.write_all(bytes)?;
        o.flush()
    } else {
        let mut e = std::io::stderr().lock();
        e.write_all(bytes)?;
        e.flush()
    }
}

/// Copies bytes as they come (rank 0: stdout verbatim, stderr unprefixed).
pub(crate) fn forward_raw(mut src: impl Read + Send + 'static, to_stdout: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut open = true;
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            // Keep draining after our side closed so the rank never blocks on a full pipe.
            open = open && write_out(to_stdout, &buf[..n]).is_ok();
        }
    })
}

/// Forwards lines to stderr prefixed `[rank i] `, or keeps the last ones in `tail`.
pub(crate) fn forward_lines(src: impl Read + Send + 'static, rank: usize, tail: Option<Tail>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            match &tail {
                None => {
                    let _ = write_out(false, format!("[rank {rank}] {text}\n").as_bytes());
                }
                Some(t) => {
                    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(text.to_string());
                }
            }
        }
    })
}

pub(crate) fn describe(status: ExitStatus, remote: bool) -> String {
    if let Some(code) = status.code() {
        let hint = if remote && code == 255 { " (ssh could not reach the host?)" } else { "" };
        return format!("exited with status {code}{hint}");
    }
    const NAMES: [(i32, &str); 6] = [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGBUS, "SIGBUS"),
    ];
    match status.signal() {
        Some(sig) => match NAMES.iter().find(|(s, _)| *s == sig) {
            Some((_, name)) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        None => format!("ended with {status}"),
    }
}
