//! In-process transport: ranks are threads, linked by unbounded channels.
//!
//! Used by unit tests and by anyone who wants to run several ranks in one
//! process. Sends never block, so `exchange` simply sends everything and then
//! receives in order. A rank whose transport is dropped (its thread ended or
//! panicked) is reported as gone to everyone waiting on it.

use super::{validate_ops, BusyGuard, RecvOp, SendOp, Transport};
use crate::error::{CommError, PeerId, Result};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

type Inbox = Mutex<Receiver<Vec<u8>>>;

/// One rank of an in-process world. Create a world with [`LocalTransport::world`].
pub struct LocalTransport {
    rank: usize,
    size: usize,
    /// `to[p]` sends to rank `p` (None for ourselves).
    to: Vec<Option<Sender<Vec<u8>>>>,
    /// `from[p]` receives from rank `p`.
    from: Vec<Option<Inbox>>,
    timeout: Option<Duration>,
    busy: AtomicBool,
    failed: Mutex<Option<CommError>>,
}

impl LocalTransport {
    /// Creates the `size` ranks of one world, index = rank.
    pub fn world(size: usize) -> Vec<LocalTransport> {
        Self::world_with_timeout(size, None)
    }

    /// Like [`LocalTransport::world`], with a limit on how long a receive waits.
    pub fn world_with_timeout(size: usize, timeout: Option<Duration>) -> Vec<LocalTransport> {
        let mut senders: Vec<Vec<Option<Sender<Vec<u8>>>>> = (0..size).map(|_| vec![None; size]).collect();
        let mut receivers: Vec<Vec<Option<Inbox>>> = (0..size).map(|_| (0..size).map(|_| None).collect()).collect();
        for src in 0..size {
            for dst in 0..size {
                if src != dst {
                    let (tx, rx) = channel();
                    senders[src][dst] = Some(tx);
                    receivers[dst][src] = Some(Mutex::new(rx));
                }
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| LocalTransport {
                rank,
                size,
                to,
                from,
                timeout,
                busy: AtomicBool::new(false),
                failed: Mutex::new(None),
            })
            .collect()
    }

    fn peer(&self, rank: usize) -> PeerId {
        PeerId::new(rank, self.peer_addr(rank))
    }

    fn run(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        for s in sends {
            let tx = self.to[s.peer].as_ref().expect("validated peer");
            tx.send(s.data.to_vec()).map_err(|_| self.peer(s.peer).lost("its thread ended"))?;
        }
        for r in recvs.iter_mut() {
            let rx = self.from[r.peer].as_ref().expect("validated peer").lock().unwrap_or_else(|e| e.into_inner());
            let msg = match self.timeout {
                None => rx.recv().map_err(|_| self.peer(r.peer).lost("its thread ended"))?,
                Some(t) => rx.recv_timeout(t).map_err(|e| match e {
                    RecvTimeoutError::Timeout => self.peer(r.peer).timeout(t, "waiting for a message"),
                    RecvTimeoutError::Disconnected => self.peer(r.peer).lost("its thread ended"),
                })?,
            };
            if msg.len() != r.buf.len() {
                return Err(self.peer(r.peer).protocol(format!(
                    "it sent {} bytes where {} were expected",
                    msg.len(),
                    r.buf.len()
                )));
            }
            r.buf.copy_from_slice(&msg);
        }
        Ok(())
    }
}

impl Transport for LocalTransport {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn peer_addr(&self, peer: usize) -> String {
        format!("local:{peer}")
    }

    fn exchange(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        validate_ops(self, sends, recvs, usize::MAX)?;
        let _busy = BusyGuard::enter(&self.busy)?;
        if let Some(err) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(err);
        }
        let result = self.run(sends, recvs);
        if let Err(err) = &result {
            *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(err.clone());
        }
        result
    }
}
