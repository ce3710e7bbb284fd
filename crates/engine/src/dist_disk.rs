//! `OP_DISK`: the prefix cache's disk tier across a cluster ([`crate::kv_disk`]).
//!
//! Rank 0 sends a list of [`DiskOp`]s to the embedding stage, which passes it
//! down the pipeline like a step (so every rank sees it between the same two
//! steps), and runs its own part. Each rank answers rank 0 directly when the
//! list holds an `Init` or a `Report`: a length, then that many u32s. Rank 0
//! only sends such a list with no step in flight, so the answers are the next
//! thing each rank sends it.

use crate::dist::{comm_err, Header, StageRunner, OP_DISK};
use crate::generate::Engine;
use crate::kv_disk::{self, DiskOp};
use crate::EngineError;

fn wants_reply(ops: &[DiskOp]) -> bool {
    ops.iter().any(|o| matches!(o, DiskOp::Init(_) | DiskOp::Report))
}

fn disk_err(rank: usize, why: String) -> EngineError {
    EngineError::BadArgument(format!("kv disk tier on rank {rank}: {why}"))
}

impl StageRunner<'_> {
    /// Any rank but 0: one `OP_DISK` list arriving from `from`.
    pub(crate) fn handle_disk(&mut self, h: Header, from: usize) -> Result<(), EngineError> {
        let c = self.cluster;
        let mut words = vec![0u32; h.n as usize];
        c.world.recv(from, bytemuck::cast_slice_mut(&mut words)).map_err(comm_err)?;
        if let Some(to) = c.downstream().filter(|&to| to != 0) {
            c.send_header(to, h)?;
            c.world.send(to, bytemuck::cast_slice(&words)).map_err(comm_err)?;
        }
        let ops = kv_disk::decode(&words)
            .ok_or_else(|| EngineError::BadArgument(format!("rank {} got a malformed disk op list", c.rank())))?;
        kv_disk::store::flush_on_sigterm();
        let reply = match kv_disk::apply(self.disk, self.model, self.paged.as_mut(), &ops) {
            Ok(r) => r,
            // Tell rank 0 why (an empty key list, and a zero size it refuses).
            Err(why) => {
                tracing::warn!("rank {}: kv disk: {why}", c.rank());
                wants_reply(&ops).then(|| kv_disk::InitReply::default().to_words())
            }
        };
        if let Some(r) = reply {
            c.world.send(0, &(r.len() as u32).to_le_bytes()).map_err(comm_err)?;
            c.world.send(0, bytemuck::cast_slice(&r)).map_err(comm_err)?;
        }
        Ok(())
    }

    /// Rank 0: sends `ops` to every rank, runs its own part, and returns every
    /// rank's reply (rank 0's first) when the list asks for one.
    fn run_disk(&mut self, ops: &[DiskOp]) -> Result<Vec<Vec<u32>>, EngineError> {
        let c = self.cluster;
        let words = kv_disk::encode(ops);
        let h = Header { op: OP_DISK, n: words.len() as u32, ..Default::default() };
        for r in c.embed_stage_ranks() {
            c.send_header(r, h)?;
            c.world.send(r, bytemuck::cast_slice(&words)).map_err(comm_err)?;
        }
        let own = kv_disk::apply(self.disk, self.model, self.paged.as_mut(), ops).map_err(|w| disk_err(0, w))?;
        if !wants_reply(ops) {
            return Ok(Vec::new());
        }
        let mut all = vec![own.unwrap_or_default()];
        for r in 1..c.world.size() {
            let mut len = [0u8; 4];
            c.world.recv(r, &mut len).map_err(comm_err)?;
            let mut reply = vec![0u32; u32::from_le_bytes(len) as usize];
            c.world.recv(r, bytemuck::cast_slice_mut(&mut reply)).map_err(comm_err)?;
            all.push(reply);
        }
        Ok(all)
    }
}

impl Engine {
    /// Runs disk-tier operations on every rank (see [`kv_disk::DiskOp`]):
    /// rank 0's reply first, then each other rank's, when `ops` holds an
    /// `Init` or a `Report`; empty otherwise. With steps in flight only
    /// `Save`, `Delete` and `Prune` may be sent.
    pub fn disk_ops(&mut self, ops: &[DiskOp]) -> Result<Vec<Vec<u32>>, EngineError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(r) = self.with_runner(|r| r.run_disk(ops)) {
            return r;
        }
        let reply =
            kv_disk::apply(&mut self.disk, &self.model, self.paged.as_mut(), ops).map_err(|w| disk_err(0, w))?;
        Ok(if wants_reply(ops) { vec![reply.unwrap_or_default()] } else { Vec::new() })
    }

    /// Opens the disk tier under `dir` on every rank. Returns each rank's
    /// block file size and keys (rank 0's first).
    pub fn disk_open(&mut self, dir: &std::path::Path) -> Result<Vec<kv_disk::InitReply>, EngineError> {
        let replies = self.disk_ops(&[DiskOp::Init(dir.to_path_buf())])?;
        replies
            .iter()
            .enumerate()
            .map(|(r, w)| match kv_disk::InitReply::from_words(w) {
                Some(x) if x.file_bytes > 0 => Ok(x),
                _ => Err(disk_err(r, "could not open its directory (its log says why)".into())),
            })
            .collect()
    }

    /// Runs `loads` (`Load` and `LoadState` ops) on every rank; returns, for
    /// each, whether every rank loaded it.
    pub fn disk_load(&mut self, loads: &[DiskOp]) -> Result<Vec<bool>, EngineError> {
        let mut ops = loads.to_vec();
        ops.push(DiskOp::Report);
        let replies = self.disk_ops(&ops)?;
        let mut good = vec![true; loads.len()];
        for r in &replies {
            let n = r.first().copied().unwrap_or(0) as usize;
            let ok = r.get(1..1 + n).unwrap_or(&[]);
            for (i, g) in good.iter_mut().enumerate() {
                *g &= ok.get(i) == Some(&1);
            }
        }
        Ok(good)
    }
}
