//! Shared-memory transport: ranks on one host, linked through `/dev/shm`.
//!
//! One segment holds a header and, for every ordered pair of ranks, a
//! single-producer single-consumer byte ring: the sender copies into it and
//! publishes by advancing `head`; the receiver copies out and advances `tail`.
//! No locks, no system calls on the fast path: a small message costs two
//! `memcpy`s and a few cache-line transfers, which is why this is the
//! lowest-latency transport.
//!
//! A waiting rank spins for `spin`, then parks on a futex (the other side
//! wakes it only when it sees the sleeping flag, so the fast path never makes
//! a system call). Parking uses short timeouts so liveness is checked often.
//!
//! Liveness: every rank holds an open-file-description lock on one byte of the
//! segment file. The kernel drops it when the process dies, however it dies,
//! so a parked rank that finds its peer's lock gone knows the peer is dead. It
//! then writes the dead rank into the segment's abort word, where every other
//! waiting rank sees it: all survivors fail within milliseconds, naming the
//! rank that died. A rank failing for another reason publishes its reason.
//!
//! Bootstrap: rank 0 creates the segment afresh (removing a stale one),
//! initialises it and marks it ready; the others open it once it is ready and
//! rank 0's lock is held (which tells a live segment from a crashed run's).
//! Every pair of ranks then runs the same authenticated handshake as TCP over
//! its rings. Once rank 0 has shaken hands with everyone it unlinks the file,
//! so nothing is left in `/dev/shm` whatever happens later.

use super::{validate_ops, BusyGuard, RecvOp, SendOp, Transport};
use crate::error::{CommError, PeerId, Result};
use crate::handshake::{handshake, HandshakeIo, Hello, PROTOCOL_VERSION};
use memmap2::MmapRaw;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAGIC: u64 = 0x5348_4152_444c_4d31; // "SHARDLM1": segment layout version 1
const HEADER_BYTES: usize = 4096;
const CTRL_BYTES: usize = 512;
const MAX_RANKS: usize = 256;
const REASON_AT: usize = 2048;
const FRAME_HEADER: usize = 8;
/// Publish at most this much at once so the receiver can start copying early.
const PUBLISH_CHUNK: usize = 64 << 10;
const PARK: Duration = Duration::from_millis(5);
/// Busy-wait without yielding for this long before yielding between polls.
const PURE_SPIN: Duration = Duration::from_micros(5);
const ABORT_CLAIM: u32 = u32::MAX;
const ABORT_DEAD: u32 = 1;
const ABORT_FAILED: u32 = 2;

/// Everything needed to join a shared-memory world.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// Segment name; the file is `dir/shardlm-<name>`. All ranks use the same.
    pub name: String,
    pub rank: usize,
    pub size: usize,
    pub secret: Vec<u8>,
    pub fingerprint: u64,
    /// Bytes per ring (one per ordered pair of ranks); a power of two ≥ 4 KiB.
    pub ring_bytes: usize,
    pub connect_timeout: Duration,
    /// Fail an operation when a peer made no progress for this long (`None`:
    /// wait forever; dead peers are detected regardless).
    pub op_timeout: Option<Duration>,
    /// Busy-wait this long before parking.
    pub spin: Duration,
    pub max_message_bytes: usize,
    /// Directory of the segment file (`/dev/shm`).
    pub dir: PathBuf,
    #[doc(hidden)]
    pub protocol_version: u32,
}

impl ShmConfig {
    pub fn new(
        name: impl Into<String>,
        rank: usize,
        size: usize,
        secret: impl Into<Vec<u8>>,
        fingerprint: u64,
    ) -> Self {
        ShmConfig {
            name: name.into(),
            rank,
            size,
            secret: secret.into(),
            fingerprint,
            ring_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(30),
            op_timeout: None,
            spin: Duration::from_micros(200),
            max_message_bytes: 1 << 30,
            dir: PathBuf::from("/dev/shm"),
            protocol_version: PROTOCOL_VERSION,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("shardlm-{}", self.name))
    }

    fn total_bytes(&self) -> usize {
        HEADER_BYTES + self.size * self.size * (CTRL_BYTES + self.ring_bytes)
    }
}

/// One rank of a shared-memory world. Build it with [`ShmTransport::connect`].
pub struct ShmTransport {
    rank: usize,
    size: usize,
    label: String,
    map: MmapRaw,
    /// Holds our liveness lock for as long as we live.
    file: File,
    ring: usize,
    spin: Duration,
    op_timeout: Option<Duration>,
    max_message: usize,
    busy: AtomicBool,
    failed: Mutex<Option<CommError>>,
}

/// The control words and data of one ring.
struct Chan<'a> {
    head: &'a AtomicU64,
    data_seq: &'a AtomicU32,
    tail: &'a AtomicU64,
    space_seq: &'a AtomicU32,
    consumer_sleeping: &'a AtomicU32,
    producer_sleeping: &'a AtomicU32,
    data: *mut u8,
    mask: usize,
}

struct SendJob<'a> {
    peer: usize,
    header: [u8; FRAME_HEADER],
    framed: bool,
    data: &'a [u8],
    done: usize,
}

struct RecvJob<'a> {
    peer: usize,
    header: [u8; FRAME_HEADER],
    framed: bool,
    buf: &'a mut [u8],
    done: usize,
}

impl SendJob<'_> {
    fn total(&self) -> usize {
        (if self.framed { FRAME_HEADER } else { 0 }) + self.data.len()
    }
}

impl RecvJob<'_> {
    fn total(&self) -> usize {
        (if self.framed { FRAME_HEADER } else { 0 }) + self.buf.len()
    }
}

/// What the pump does while a peer has not joined yet.
#[derive(Clone, Copy)]
enum Phase {
    Joining(Instant),
    Running,
}

impl ShmTransport {
    /// Creates (rank 0) or opens (others) the segment and shakes hands with every rank.
    pub fn connect(cfg: &ShmConfig) -> Result<ShmTransport> {
        if cfg.size == 0 || cfg.rank >= cfg.size || cfg.size > MAX_RANKS {
            return Err(CommError::invalid(format!(
                "rank {} in a world of {} (shared memory supports 1..={MAX_RANKS} ranks)",
                cfg.rank, cfg.size
            )));
        }
        if !cfg.ring_bytes.is_power_of_two() || cfg.ring_bytes < 4096 {
            return Err(CommError::invalid("ring_bytes must be a power of two of at least 4096"));
        }
        let deadline = Instant::now() + cfg.connect_timeout;
        let (file, map) = if cfg.rank == 0 { create(cfg)? } else { open(cfg, deadline)? };
        let t = ShmTransport {
            rank: cfg.rank,
            size: cfg.size,
            label: format!("shm:{}", cfg.name),
            map,
            file,
            ring: cfg.ring_bytes,
            spin: cfg.spin,
            op_timeout: cfg.op_timeout,
            max_message: cfg.max_message_bytes,
            busy: AtomicBool::new(false),
            failed: Mutex::new(None),
        };
        if !lock_byte(&t.file, cfg.rank, true) {
            return Err(CommError::invalid(format!(
                "rank {} already joined segment {} (two processes with the same rank?)",
                cfg.rank,
                cfg.path().display()
            )));
        }
        t.joined(cfg.rank).store(1, Ordering::Release);
        if cfg.rank == 0 {
            t.word(24).store(1, Ordering::Release);
        }
        for peer in (0..cfg.size).filter(|&p| p != cfg.rank) {
            let ours = Hello::new(cfg.protocol_version, cfg.rank, cfg.size, 0, 1, cfg.fingerprint)?;
            let id = t.peer(peer);
            let mut io = ShmHandshake { t: &t, peer, deadline };
            let result = handshake(&mut io, &ours, &cfg.secret, &|_| Ok(id.clone()));
            if let Err(e) = result {
                if cfg.rank == 0 {
                    let _ = std::fs::remove_file(cfg.path());
                }
                return Err(t.fail(e));
            }
        }
        if cfg.rank == 0 {
            let _ = std::fs::remove_file(cfg.path());
        }
        Ok(t)
    }

    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset is 4-aligned inside the mapped header; the mapping lives as long as `self`.
        unsafe { &*(self.base().add(offset) as *const AtomicU32) }
    }

    fn abort_word(&self) -> &AtomicU32 {
        self.word(28)
    }

    fn joined(&self, rank: usize) -> &AtomicU32 {
        self.word(64 + 4 * rank)
    }

    fn chan(&self, src: usize, dst: usize) -> Chan<'_> {
        let off = HEADER_BYTES + (src * self.size + dst) * (CTRL_BYTES + self.ring);
        // SAFETY: each channel's control block is 512 bytes, 8-aligned, inside the mapping,
        // followed by `ring` bytes of data; the mapping lives as long as `self`.
        unsafe {
            let c = self.base().add(off);
            Chan {
                head: &*(c as *const AtomicU64),
                data_seq: &*(c.add(64) as *const AtomicU32),
                tail: &*(c.add(128) as *const AtomicU64),
                space_seq: &*(c.add(192) as *const AtomicU32),
                consumer_sleeping: &*(c.add(256) as *const AtomicU32),
                producer_sleeping: &*(c.add(320) as *const AtomicU32),
                data: c.add(CTRL_BYTES),
                mask: self.ring - 1,
            }
        }
    }

    fn peer(&self, rank: usize) -> PeerId {
        PeerId::new(rank, self.label.clone())
    }

    /// Publishes a failure in the segment so every waiting rank stops.
    fn raise(&self, kind: u32, rank: usize, reason: &str) {
        let abort = self.abort_word();
        if abort.compare_exchange(0, ABORT_CLAIM, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let bytes = &reason.as_bytes()[..reason.len().min(HEADER_BYTES - REASON_AT - 4)];
            // SAFETY: the reason area lies inside the header; we own it after winning the claim.
            unsafe {
                let at = self.base().add(REASON_AT);
                std::ptr::copy_nonoverlapping((bytes.len() as u32).to_le_bytes().as_ptr(), at, 4);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.add(4), bytes.len());
            }
            abort.store((kind << 24) | (rank as u32 + 1), Ordering::Release);
        }
    }

    /// The failure another rank published, if any.
    fn aborted(&self) -> Option<CommError> {
        let mut v = self.abort_word().load(Ordering::Acquire);
        if v == 0 {
            return None;
        }
        let start = Instant::now();
        while v == ABORT_CLAIM && start.elapsed() < Duration::from_millis(100) {
            std::thread::yield_now();
            v = self.abort_word().load(Ordering::Acquire);
        }
        if v == ABORT_CLAIM {
            return Some(CommError::invalid("another rank failed without saying why"));
        }
        let (kind, rank) = (v >> 24, (v & 0xff_ffff) as usize - 1);
        // SAFETY: the reason was written before the abort word was released.
        let reason = unsafe {
            let at = self.base().add(REASON_AT);
            let mut len = [0u8; 4];
            std::ptr::copy_nonoverlapping(at, len.as_mut_ptr(), 4);
            let len = (u32::from_le_bytes(len) as usize).min(HEADER_BYTES - REASON_AT - 4);
            String::from_utf8_lossy(std::slice::from_raw_parts(at.add(4), len)).into_owned()
        };
        Some(match kind {
            ABORT_DEAD => self.peer(rank).lost(reason),
            _ => self.peer(rank).aborted(reason),
        })
    }

    /// Whether `peer` joined and has since exited or closed its group (its
    /// lock is gone). Everything it wrote before that is visible.
    fn peer_exited(&self, peer: usize) -> bool {
        self.joined(peer).load(Ordering::Acquire) != 0 && !lock_byte(&self.file, peer, false)
    }

    /// Fails if `peer` died or any rank published a failure. `exited` is the
    /// caller's [`ShmTransport::peer_exited`] reading, taken *before* its last
    /// drain of the rings: reading it again here could see a peer that wrote
    /// its last message and exited after that drain, and call it lost.
    fn check_peer(&self, peer: usize, phase: Phase, exited: bool) -> Result<()> {
        if let Some(err) = self.aborted() {
            return Err(err);
        }
        let joined = self.joined(peer).load(Ordering::Acquire) != 0;
        if exited {
            let why = "its process exited or closed its group";
            self.raise(ABORT_DEAD, peer, why);
            return Err(self.aborted().unwrap_or_else(|| self.peer(peer).lost(why)));
        }
        if let Phase::Joining(deadline) = phase {
            if Instant::now() >= deadline {
                return Err(CommError::Connect {
                    rank: peer,
                    addr: self.label.clone(),
                    waited: Duration::ZERO,
                    detail: if joined {
                        "handshake did not finish".into()
                    } else {
                        "it never joined the segment".into()
                    },
                });
            }
        }
        Ok(())
    }

    fn fail(&self, err: CommError) -> CommError {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_none() {
            *failed = Some(err.clone());
            if self.aborted().is_none() {
                self.raise(ABORT_FAILED, self.rank, &err.to_string());
            }
        }
        err
    }

    /// Copies as much of `job` into its ring as fits. Returns whether bytes moved.
    fn try_send(&self, job: &mut SendJob<'_>) -> bool {
        let ch = self.chan(self.rank, job.peer);
        let head = ch.head.load(Ordering::Relaxed);
        let tail = ch.tail.load(Ordering::Acquire);
        let free = self.ring - (head - tail) as usize;
        let n = free.min(job.total() - job.done).min(PUBLISH_CHUNK);
        if n == 0 {
            return false;
        }
        let hdr = if job.framed { FRAME_HEADER } else { 0 };
        let mut pos = head as usize;
        let mut copied = 0;
        while copied < n {
            let at = job.done + copied;
            let src: &[u8] = if at < hdr { &job.header[at..hdr] } else { &job.data[at - hdr..] };
            let idx = pos & ch.mask;
            let k = src.len().min(n - copied).min(self.ring - idx);
            // SAFETY: `idx + k <= ring`; the consumer does not read past `head`, which we publish after.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ch.data.add(idx), k) };
            copied += k;
            pos += k;
        }
        job.done += n;
        ch.head.store(head + n as u64, Ordering::Release);
        fence(Ordering::SeqCst);
        if ch.consumer_sleeping.load(Ordering::Relaxed) != 0 {
            ch.data_seq.fetch_add(1, Ordering::Release);
            futex_wake(ch.data_seq);
        }
        true
    }

    /// Copies whatever has arrived for `job` out of its ring.
    fn try_recv(&self, job: &mut RecvJob<'_>) -> Result<bool> {
        let ch = self.chan(job.peer, self.rank);
        let tail = ch.tail.load(Ordering::Relaxed);
        let head = ch.head.load(Ordering::Acquire);
        let n = ((head - tail) as usize).min(job.total() - job.done);
        if n == 0 {
            return Ok(false);
        }
        let hdr = if job.framed { FRAME_HEADER } else { 0 };
        let mut pos = tail as usize;
        let mut copied = 0;
        while copied < n {
            let at = job.done + copied;
            let dst: &mut [u8] = if at < hdr { &mut job.header[at..hdr] } else { &mut job.buf[at - hdr..] };
            let idx = pos & ch.mask;
            let k = dst.len().min(n - copied).min(self.ring - idx);
            // SAFETY: bytes below `head` were published by the producer (Acquire above).
            unsafe { std::ptr::copy_nonoverlapping(ch.data.add(idx), dst.as_mut_ptr(), k) };
            copied += k;
            pos += k;
            if job.framed && job.done + copied == hdr {
                let len = u64::from_le_bytes(job.header) as usize;
                if len != job.buf.len() {
                    return Err(self.peer(job.peer).protocol(format!(
                        "it sent a message of {len} bytes where {} were expected (were collectives called in a different order?)",
                        job.buf.len()
                    )));
                }
            }
        }
        job.done += n;
        ch.tail.store(tail + n as u64, Ordering::Release);
        fence(Ordering::SeqCst);
        if ch.producer_sleeping.load(Ordering::Relaxed) != 0 {
            ch.space_seq.fetch_add(1, Ordering::Release);
            futex_wake(ch.space_seq);
        }
        Ok(true)
    }

    fn pass(&self, sends: &mut [SendJob<'_>], recvs: &mut [RecvJob<'_>]) -> Result<(bool, bool)> {
        let (mut progress, mut pending) = (false, false);
        for i in 0..sends.len() {
            let p = sends[i].peer;
            if sends[i].done == sends[i].total() || sends[..i].iter().any(|j| j.peer == p && j.done < j.total()) {
                pending |= sends[i].done < sends[i].total();
                continue;
            }
            while sends[i].done < sends[i].total() && self.try_send(&mut sends[i]) {
                progress = true;
            }
            pending |= sends[i].done < sends[i].total();
        }
        for i in 0..recvs.len() {
            let p = recvs[i].peer;
            if recvs[i].done == recvs[i].total() || recvs[..i].iter().any(|j| j.peer == p && j.done < j.total()) {
                pending |= recvs[i].done < recvs[i].total();
                continue;
            }
            while recvs[i].done < recvs[i].total() && self.try_recv(&mut recvs[i])? {
                progress = true;
            }
            pending |= recvs[i].done < recvs[i].total();
        }
        Ok((progress, pending))
    }

    fn pump(&self, sends: &mut [SendJob<'_>], recvs: &mut [RecvJob<'_>], phase: Phase) -> Result<()> {
        let mut last_progress = Instant::now();
        let mut spins = 0u32;
        loop {
            let (progress, pending) = self.pass(sends, recvs)?;
            if !pending {
                return Ok(());
            }
            if progress {
                last_progress = Instant::now();
                spins = 0;
                continue;
            }
            // Spin briefly, then keep polling but yield the core between polls
            // (on an oversubscribed host the peer may be waiting for it), then park.
            spins = spins.wrapping_add(1);
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            let idle = last_progress.elapsed();
            if idle < PURE_SPIN.min(self.spin) {
                std::hint::spin_loop();
                continue;
            }
            if idle < self.spin {
                std::thread::yield_now();
                continue;
            }
            // Park on the first blocked operation (a receive if there is one).
            let (peer, seq, flag) = match recvs.iter().find(|r| r.done < r.total()) {
                Some(r) => {
                    let ch = self.chan(r.peer, self.rank);
                    (r.peer, ch.data_seq, ch.consumer_sleeping)
                }
                None => {
                    let s = sends.iter().find(|s| s.done < s.total()).expect("a pending job");
                    let ch = self.chan(self.rank, s.peer);
                    (s.peer, ch.space_seq, ch.producer_sleeping)
                }
            };
            // A peer may write its last bytes and exit between our pass and
            // this check (a barrier's final message, then process exit): read
            // its liveness once, drain what it left, and only then call it
            // lost, on that same reading.
            let exited = self.peer_exited(peer);
            if exited {
                let (progress, pending) = self.pass(sends, recvs)?;
                if !pending {
                    return Ok(());
                }
                if progress {
                    last_progress = Instant::now();
                    spins = 0;
                    continue;
                }
            }
            self.check_peer(peer, phase, exited)?;
            if let (Some(limit), Phase::Running) = (self.op_timeout, phase) {
                let idle = last_progress.elapsed();
                if idle >= limit {
                    return Err(self.peer(peer).timeout(idle, "waiting for a message"));
                }
            }
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let observed = seq.load(Ordering::Acquire);
            let (progress, _) = self.pass(sends, recvs)?;
            if !progress {
                futex_wait(seq, observed, PARK);
            } else {
                last_progress = Instant::now();
            }
            flag.store(0, Ordering::Relaxed);
        }
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> &'static str {
        "shm"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn peer_addr(&self, _peer: usize) -> String {
        self.label.clone()
    }

    fn exchange(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        validate_ops(self, sends, recvs, self.max_message)?;
        let _busy = BusyGuard::enter(&self.busy)?;
        if let Some(err) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(err);
        }
        let mut sj: Vec<SendJob> = sends
            .iter()
            .map(|s| SendJob {
                peer: s.peer,
                header: (s.data.len() as u64).to_le_bytes(),
                framed: true,
                data: s.data,
                done: 0,
            })
            .collect();
        let mut rj: Vec<RecvJob> = recvs
            .iter_mut()
            .map(|r| RecvJob { peer: r.peer, header: [0; FRAME_HEADER], framed: true, buf: r.buf, done: 0 })
            .collect();
        self.pump(&mut sj, &mut rj, Phase::Running).map_err(|e| self.fail(e))
    }
}

/// The raw (unframed) ring pair to one peer, during the handshake.
struct ShmHandshake<'a> {
    t: &'a ShmTransport,
    peer: usize,
    deadline: Instant,
}

impl HandshakeIo for ShmHandshake<'_> {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        let job = SendJob { peer: self.peer, header: [0; FRAME_HEADER], framed: false, data, done: 0 };
        self.t.pump(&mut [job], &mut [], Phase::Joining(self.deadline))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        let job = RecvJob { peer: self.peer, header: [0; FRAME_HEADER], framed: false, buf, done: 0 };
        self.t.pump(&mut [], &mut [job], Phase::Joining(self.deadline))
    }
}

fn create(cfg: &ShmConfig) -> Result<(File, MmapRaw)> {
    let path = cfg.path();
    let _ = std::fs::remove_file(&path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| CommError::io(format!("creating {}", path.display()), e))?;
    file.set_len(cfg.total_bytes() as u64).map_err(|e| CommError::io(format!("sizing {}", path.display()), e))?;
    let map = MmapRaw::map_raw(&file).map_err(|e| CommError::io(format!("mapping {}", path.display()), e))?;
    // SAFETY: the fresh mapping is at least HEADER_BYTES long and nobody else uses it before `ready`.
    unsafe {
        let h = map.as_mut_ptr();
        std::ptr::copy_nonoverlapping(MAGIC.to_le_bytes().as_ptr(), h, 8);
        std::ptr::copy_nonoverlapping((cfg.size as u32).to_le_bytes().as_ptr(), h.add(12), 4);
        std::ptr::copy_nonoverlapping((cfg.ring_bytes as u64).to_le_bytes().as_ptr(), h.add(16), 8);
    }
    Ok((file, map))
}

fn open(cfg: &ShmConfig, deadline: Instant) -> Result<(File, MmapRaw)> {
    let path = cfg.path();
    let mut why = String::from("it does not exist");
    loop {
        if let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) {
            let len = file.metadata().map(|m| m.len()).unwrap_or(0) as usize;
            if len == cfg.total_bytes() {
                let map =
                    MmapRaw::map_raw(&file).map_err(|e| CommError::io(format!("mapping {}", path.display()), e))?;
                // SAFETY: the mapping is at least HEADER_BYTES long; fields are read atomically or once ready.
                let (magic, size, ring, ready) = unsafe {
                    let h = map.as_mut_ptr();
                    let ready = (*(h.add(24) as *const AtomicU32)).load(Ordering::Acquire);
                    let mut b = [0u8; 24];
                    std::ptr::copy_nonoverlapping(h, b.as_mut_ptr(), 24);
                    (
                        u64::from_le_bytes(b[..8].try_into().unwrap()),
                        u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize,
                        u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize,
                        ready,
                    )
                };
                if ready == 1 && lock_byte(&file, 0, false) {
                    if magic != MAGIC || size != cfg.size || ring != cfg.ring_bytes {
                        return Err(CommError::Handshake {
                            rank: 0,
                            addr: format!("shm:{}", cfg.name),
                            detail: format!(
                                "its segment has layout {magic:#x}, {size} ranks, {ring}-byte rings; we expect {MAGIC:#x}, {} ranks, {}-byte rings",
                                cfg.size, cfg.ring_bytes
                            ),
                        });
                    }
                    return Ok((file, map));
                }
                why = "it is not ready or belongs to a finished run".into();
            } else {
                why = format!("it has {len} bytes, we expect {}", cfg.total_bytes());
            }
        }
        if Instant::now() >= deadline {
            return Err(CommError::Connect {
                rank: 0,
                addr: format!("shm:{}", cfg.name),
                waited: cfg.connect_timeout,
                detail: format!("segment {}: {why}", path.display()),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Takes (`take`) or tests the open-file-description lock on byte `rank`.
/// Taking returns whether we got it; testing returns whether someone holds it.
fn lock_byte(file: &File, rank: usize, take: bool) -> bool {
    // SAFETY: a zeroed flock is a valid value; fcntl reads/writes only that struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = rank as _;
    fl.l_len = 1;
    let cmd = if take { libc::F_OFD_SETLK } else { libc::F_OFD_GETLK };
    // SAFETY: `fl` is valid for the call; the fd is open.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    if take {
        rc == 0
    } else {
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`; it lives in our mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, 0, 0);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0, 0, 0);
    }
}
