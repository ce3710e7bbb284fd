//! Progress on stderr for long work: an `indicatif` bar on a terminal, plain
//! lines every few seconds otherwise (logs, CI, a launcher forwarding a rank).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a plain progress line is written.
const LINE_EVERY: Duration = Duration::from_secs(2);
/// Loading shows progress only once it has taken this long.
const LOAD_QUIET_FOR: Duration = Duration::from_secs(1);

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

enum Sink {
    Bar(ProgressBar),
    Lines { last: Option<Instant> },
}

/// Bytes done out of an expected total, with the rate.
pub struct ByteProgress {
    label: &'static str,
    total: u64,
    start: Instant,
    sink: Mutex<Sink>,
}

impl ByteProgress {
    pub fn new(label: &'static str, total: u64) -> ByteProgress {
        let sink = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "shardlm: {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_message(label);
            Sink::Bar(bar)
        } else {
            Sink::Lines { last: None }
        };
        ByteProgress { label, total, start: Instant::now(), sink: Mutex::new(sink) }
    }

    fn rate(&self, done: u64) -> f64 {
        mb(done) / self.start.elapsed().as_secs_f64().max(1e-3)
    }

    pub fn set(&self, done: u64) {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *sink {
            Sink::Bar(bar) => bar.set_position(done),
            Sink::Lines { last } => {
                if done > 0 && last.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
                    *last = Some(Instant::now());
                    let (rate, total) = (self.rate(done), mb(self.total));
                    eprintln!("shardlm: {} {:.1} MB of about {total:.1} MB ({rate:.1} MB/s)", self.label, mb(done));
                }
            }
        }
    }

    pub fn finish(&self, done: u64) {
        let sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Sink::Bar(bar) = &*sink {
            bar.finish_and_clear();
        }
        let secs = self.start.elapsed().as_secs_f64();
        eprintln!("shardlm: {} {:.1} MB in {secs:.1} s ({:.1} MB/s)", self.label, mb(done), self.rate(done));
    }

    pub fn abandon(&self) {
        if let Sink::Bar(bar) = &*self.sink.lock().unwrap_or_else(|e| e.into_inner()) {
            bar.abandon();
        }
    }
}

/// A model-loading reporter: silent for the first second, then a bar (or
/// lines) of layers loaded, labelled with the rank in a world of several.
pub fn load_progress(rank: Option<usize>) -> model::LoadProgress {
    let who = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
    let start = Instant::now();
    let state: Arc<Mutex<Option<Sink>>> = Arc::new(Mutex::new(None));
    model::LoadProgress::new(move |done, total| {
        let elapsed = start.elapsed();
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            if elapsed < LOAD_QUIET_FOR || done >= total {
                return;
            }
            *state = Some(if std::io::stderr().is_terminal() {
                let bar = ProgressBar::new(total as u64);
                bar.set_style(
                    ProgressStyle::with_template("shardlm: {msg}[{bar:30}] {pos}/{len} layers {elapsed}")
                        .expect("valid template")
                        .progress_chars("=> "),
                );
                bar.set_message(format!("{who}loading "));
                Sink::Bar(bar)
            } else {
                Sink::Lines { last: None }
            });
        }
        match state.as_mut().expect("set above") {
            Sink::Bar(bar) => {
                bar.set_position(done as u64);
                if done >= total {
                    bar.finish_and_clear();
                    eprintln!("shardlm: {who}loaded {total} layers in {:.1} s", elapsed.as_secs_f64());
                }
            }
            Sink::Lines { last } => {
                if done >= total {
                    eprintln!("shardlm: {who}loaded {total} layers in {:.1} s", elapsed.as_secs_f64());
                } else if last.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
                    *last = Some(Instant::now());
                    eprintln!("shardlm: {who}loading {done}/{total} layers ({:.1} s)", elapsed.as_secs_f64());
                }
            }
        }
    })
}
