//! The disk tier of the prefix cache (`serve --kv-disk DIR`): full KV blocks
//! are kept as files, so a conversation's prompt survives a restart, a
//! reload, or a long idle time with other users, and a later prefix hit
//! loads the blocks back instead of recomputing them.
//!
//! # Keys
//! A file is named by its block's chained 128-bit hash
//! ([`crate::serving::blocks::BlockHash`]: the token history up to the block's end)
//! inside a per-rank namespace directory. The namespace is a BLAKE3 hash of
//! everything else the bytes depend on: the model's fingerprint (BLAKE3 of
//! every byte of its files, cached by path, size and modification time), the
//! model config as loaded (`--context` and rope changes included), this
//! rank's shard (layers, tensor-parallel slice), the KV type, the block
//! size and row widths, and the shardlm version.
//!
//! # When blocks are written
//! Write-through: a block is written when it becomes *cached* (full, hashed,
//! no longer used by a running sequence), not when RAM evicts it. So the
//! disk holds what RAM holds and more, a clean or unclean restart loses
//! nothing already finished, and RAM eviction never waits for the disk.
//!
//! # In a cluster
//! Rank 0 decides: it keeps the index ([`index::DiskIndex`]) and sends every
//! rank the same operations ([`DiskOp`], `OP_DISK`) in step order; each rank
//! writes and reads its own shard of each block in its own directory (the
//! same `DIR` path on each host). A load is checked on every rank: rank 0
//! uses the longest prefix of blocks every rank loaded, and recomputes the
//! rest.
//!
//! # Why our own files
//! LMCache and llama.cpp's slot files are tied to their engines; what is
//! stored here is our pool's block layout, so the format is ours: a header
//! with the namespace, the key, the length and a BLAKE3 checksum
//! ([`store`]), written under a temporary name and renamed.

pub mod index;
pub mod store;

pub use crate::serving::blocks::BlockHash;
pub use store::{DiskStore, Kind};

use std::io::Read;
use std::path::{Path, PathBuf};

/// Process-wide counters for `/metrics` (this process's share: rank 0's in a
/// cluster).
pub mod counters {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static WRITTEN: AtomicU64 = AtomicU64::new(0);
    static READ: AtomicU64 = AtomicU64::new(0);
    static CORRUPT: AtomicU64 = AtomicU64::new(0);

    pub(crate) fn add_written(n: u64) {
        WRITTEN.fetch_add(n, Relaxed);
    }
    pub(crate) fn add_read(n: u64) {
        READ.fetch_add(n, Relaxed);
    }
    pub(crate) fn add_corrupt() {
        CORRUPT.fetch_add(1, Relaxed);
    }
    /// (bytes written, bytes read, unusable files found).
    pub fn get() -> (u64, u64, u64) {
        (WRITTEN.load(Relaxed), READ.load(Relaxed), CORRUPT.load(Relaxed))
    }
}

/// What `serve --kv-disk` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvDiskConfig {
    pub dir: PathBuf,
    /// Bound on each rank's block files, in bytes.
    pub max_bytes: u64,
}

/// A rank's disk tier: the model it loaded (for the fingerprint) and, once
/// rank 0 opened the tier, its store.
#[derive(Debug, Default)]
pub struct DiskSlot {
    pub model_path: Option<PathBuf>,
    pub store: Option<DiskStore>,
}

impl DiskSlot {
    pub fn for_model(path: &Path) -> DiskSlot {
        DiskSlot { model_path: Some(path.to_path_buf()), store: None }
    }
}

/// One operation rank 0 sends every rank, run in step order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskOp {
    /// Open the tier under this directory; reply with the block file size
    /// and the keys present.
    Init(PathBuf),
    /// Write this rank's part of pool block `block` as `key`.
    Save {
        block: u32,
        key: BlockHash,
    },
    Delete(BlockHash),
    /// Read `key` into pool block `block`.
    Load {
        block: u32,
        key: BlockHash,
    },
    /// Write recurrent-state slot `slot` as `key` (a hybrid model's snapshot).
    SaveState {
        slot: u32,
        key: BlockHash,
    },
    /// Read `key` into state slot `slot`, which then stands at position `pos`.
    LoadState {
        slot: u32,
        key: BlockHash,
        pos: u32,
    },
    /// Reply with whether each load since the last report succeeded.
    Report,
    /// Delete every file except these keys.
    Prune(Vec<BlockHash>),
}

fn push_key(d: &mut Vec<u32>, k: BlockHash) {
    d.extend((0..4).map(|i| (k >> (32 * i)) as u32));
}

fn key_at(d: &[u32]) -> BlockHash {
    d.iter().take(4).enumerate().fold(0, |k, (i, &w)| k | (w as u128) << (32 * i))
}

pub fn encode(ops: &[DiskOp]) -> Vec<u32> {
    let mut d = Vec::new();
    for op in ops {
        match op {
            DiskOp::Init(dir) => {
                let b = dir.to_string_lossy().into_owned().into_bytes();
                d.extend([1, b.len() as u32]);
                d.extend(b.chunks(4).map(|c| {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    u32::from_le_bytes(w)
                }));
            }
            DiskOp::Save { block, key } => {
                d.extend([2, *block]);
                push_key(&mut d, *key);
            }
            DiskOp::Delete(key) => {
                d.push(3);
                push_key(&mut d, *key);
            }
            DiskOp::Load { block, key } => {
                d.extend([4, *block]);
                push_key(&mut d, *key);
            }
            DiskOp::Report => d.push(5),
            DiskOp::Prune(keys) => {
                d.extend([6, keys.len() as u32]);
                keys.iter().for_each(|&k| push_key(&mut d, k));
            }
            DiskOp::SaveState { slot, key } => {
                d.extend([7, *slot]);
                push_key(&mut d, *key);
            }
            DiskOp::LoadState { slot, key, pos } => {
                d.extend([8, *slot, *pos]);
                push_key(&mut d, *key);
            }
        }
    }
    d
}

pub fn decode(d: &[u32]) -> Option<Vec<DiskOp>> {
    let mut ops = Vec::new();
    let mut at = 0;
    while at < d.len() {
        let rest = &d[at..];
        let (op, used) = match rest[0] {
            1 => {
                let n = *rest.get(1)? as usize;
                let words = rest.get(2..2 + n.div_ceil(4))?;
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take(n).collect();
                (DiskOp::Init(PathBuf::from(String::from_utf8(bytes).ok()?)), 2 + n.div_ceil(4))
            }
            2 => (DiskOp::Save { block: *rest.get(1)?, key: key_at(rest.get(2..6)?) }, 6),
            3 => (DiskOp::Delete(key_at(rest.get(1..5)?)), 5),
            4 => (DiskOp::Load { block: *rest.get(1)?, key: key_at(rest.get(2..6)?) }, 6),
            5 => (DiskOp::Report, 1),
            6 => {
                let n = *rest.get(1)? as usize;
                let keys = rest.get(2..2 + 4 * n)?.chunks(4).map(key_at).collect();
                (DiskOp::Prune(keys), 2 + 4 * n)
            }
            7 => (DiskOp::SaveState { slot: *rest.get(1)?, key: key_at(rest.get(2..6)?) }, 6),
            8 => (DiskOp::LoadState { slot: *rest.get(1)?, pos: *rest.get(2)?, key: key_at(rest.get(3..7)?) }, 7),
            _ => return None,
        };
        ops.push(op);
        at += used;
    }
    Some(ops)
}

/// What a rank answers to [`DiskOp::Init`]: its block and state file sizes
/// and the keys its directory holds, oldest first, each with its kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitReply {
    pub file_bytes: u64,
    pub state_file_bytes: u64,
    pub keys: Vec<(BlockHash, Kind)>,
}

impl InitReply {
    pub fn to_words(&self) -> Vec<u32> {
        let (f, s) = (self.file_bytes, self.state_file_bytes);
        let mut d = vec![f as u32, (f >> 32) as u32, s as u32, (s >> 32) as u32, self.keys.len() as u32];
        for &(k, kind) in &self.keys {
            push_key(&mut d, k);
            d.push(u32::from(kind == Kind::State));
        }
        d
    }
    pub fn from_words(d: &[u32]) -> Option<InitReply> {
        let n = *d.get(4)? as usize;
        let kind = |w: u32| if w == 1 { Kind::State } else { Kind::Block };
        let keys = d.get(5..5 + 5 * n)?.chunks(5).map(|c| (key_at(c), kind(c[4]))).collect();
        let u64_at = |i: usize| d[i] as u64 | (d[i + 1] as u64) << 32;
        Some(InitReply { file_bytes: u64_at(0), state_file_bytes: u64_at(2), keys })
    }
}

/// The disk key of the state snapshot after the prefix whose last block is
/// `block_key` (distinct from every block key).
pub fn state_key(block_key: BlockHash) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(b"shardlm state snapshot");
    h.update(&block_key.to_le_bytes());
    u128::from_le_bytes(h.finalize().as_bytes()[..16].try_into().expect("16 bytes"))
}

/// BLAKE3 of every byte of the model at `path` (a file, or a directory's
/// regular files in name order), cached under `cache_dir` by path, size and
/// modification time so that a restart does not read the model again.
pub fn model_fingerprint(path: &Path, cache_dir: &Path) -> std::io::Result<u128> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> =
            std::fs::read_dir(path)?.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut id = blake3::Hasher::new();
    for f in &files {
        let m = std::fs::metadata(f)?;
        let mtime = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        let abs = std::fs::canonicalize(f)?;
        id.update(format!("{}|{}|{:?}\n", abs.display(), m.len(), mtime).as_bytes());
    }
    let cache = cache_dir.join("fingerprints").join(id.finalize().to_hex().as_str());
    if let Some(v) = std::fs::read_to_string(&cache).ok().and_then(|s| u128::from_str_radix(s.trim(), 16).ok()) {
        return Ok(v);
    }
    let started = std::time::Instant::now();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        h.update(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        let mut r = std::fs::File::open(f)?;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    let v = u128::from_le_bytes(h.finalize().as_bytes()[..16].try_into().expect("16 bytes"));
    tracing::info!("kv disk: hashed the model's files in {:.1} s", started.elapsed().as_secs_f64());
    std::fs::create_dir_all(cache.parent().expect("has a parent"))?;
    std::fs::write(&cache, format!("{v:032x}\n"))?;
    Ok(v)
}

/// The namespace of this rank's block files (see the module docs).
pub fn namespace(fingerprint: u128, model: &model::Model, pool: &model::KvPool) -> u128 {
    let text = format!(
        "shardlm-kv-disk v1 {}|{fingerprint:032x}|{:?}|{:?}|{}|{}|{}|{}|{:?}",
        env!("CARGO_PKG_VERSION"),
        model.config,
        model.shard,
        pool.kv_type().name(),
        pool.block,
        pool.kv_width,
        pool.v_width,
        pool.window_layers,
    );
    u128::from_le_bytes(blake3::hash(text.as_bytes()).as_bytes()[..16].try_into().expect("16 bytes"))
}

/// This rank's part of `ops`: what it replies to rank 0 (for `Init` and
/// `Report`; `None` otherwise). Errors are the one-line reason the tier
/// cannot work on this rank.
pub fn apply(
    slot: &mut DiskSlot,
    model: &model::Model,
    pool: Option<&mut model::KvPool>,
    ops: &[DiskOp],
) -> Result<Option<Vec<u32>>, String> {
    let pool = pool.ok_or("disk tier before the KV pool")?;
    let mut reply = None;
    let mut loads: Vec<u32> = Vec::new();
    // Every load of the list is read at once, in parallel, before the list runs.
    let wanted: Vec<(BlockHash, Kind)> = ops
        .iter()
        .filter_map(|o| match o {
            DiskOp::Load { key, .. } => Some((*key, Kind::Block)),
            DiskOp::LoadState { key, .. } => Some((*key, Kind::State)),
            _ => None,
        })
        .collect();
    let mut read = match (&slot.store, wanted.is_empty()) {
        (Some(store), false) => store.read_many(&wanted).into_iter(),
        _ => Vec::new().into_iter(),
    };
    for op in ops {
        match op {
            DiskOp::Init(dir) => {
                let path = slot.model_path.clone().ok_or("no model path for the fingerprint")?;
                let fp = model_fingerprint(&path, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                let ns = namespace(fp, model, pool);
                slot.store = None; // finishes the old writer first
                let state_bytes = pool.states.as_ref().map_or(0, |s| s.slot_bytes());
                let store = DiskStore::open(dir, ns, pool.block_bytes(), state_bytes)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                let keys = store.scan().into_iter().map(|(k, kind, _)| (k, kind)).collect();
                let (file_bytes, state_file_bytes) = (store.file_bytes(Kind::Block), store.file_bytes(Kind::State));
                reply = Some(InitReply { file_bytes, state_file_bytes, keys }.to_words());
                slot.store = Some(store);
            }
            DiskOp::Save { block, key } => {
                let store = slot.store.as_ref().ok_or("disk op before Init")?;
                let mut buf = Vec::with_capacity(store.payload);
                model.copy_block_out(pool, *block as usize, &mut buf).map_err(|e| e.to_string())?;
                store.write(*key, Kind::Block, buf);
            }
            DiskOp::SaveState { slot: s, key } => {
                let store = slot.store.as_ref().ok_or("disk op before Init")?;
                let states = pool.states.as_ref().ok_or("a state snapshot on a model without states")?;
                let values = states.save(*s as usize).map_err(|e| e.to_string())?;
                store.write(*key, Kind::State, bytemuck::cast_slice(&values).to_vec());
            }
            DiskOp::LoadState { slot: s, pos, .. } => {
                slot.store.as_ref().ok_or("disk op before Init")?;
                let data = read.next().unwrap_or(Err(store::LoadError::Missing));
                let ok = match (data, pool.states.as_mut()) {
                    (Ok(bytes), Some(states)) if bytes.len() % 4 == 0 => {
                        let values: Vec<f32> =
                            bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                        states.load(*s as usize, &values, *pos as usize).is_ok()
                    }
                    _ => false,
                };
                loads.push(u32::from(ok));
            }
            DiskOp::Delete(key) => slot.store.as_ref().ok_or("disk op before Init")?.delete(*key),
            DiskOp::Load { block, .. } => {
                slot.store.as_ref().ok_or("disk op before Init")?;
                let data = read.next().unwrap_or(Err(store::LoadError::Missing));
                let ok = match data {
                    Ok(data) => model.copy_block_in(pool, *block as usize, &data).map_err(|e| e.to_string())?,
                    Err(_) => false,
                };
                loads.push(u32::from(ok));
            }
            DiskOp::Report => {
                let mut r = vec![loads.len() as u32];
                r.append(&mut loads);
                reply = Some(r);
            }
            DiskOp::Prune(keep) => {
                let store = slot.store.as_ref().ok_or("disk op before Init")?;
                store.prune(&keep.iter().copied().collect());
            }
        }
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip() {
        let k = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210u128;
        let ops = vec![
            DiskOp::Init(PathBuf::from("/tmp/kv dir/é")),
            DiskOp::Save { block: 3, key: k },
            DiskOp::Delete(k ^ 1),
            DiskOp::Load { block: 9, key: k },
            DiskOp::Report,
            DiskOp::Prune(vec![k, 5]),
            DiskOp::SaveState { slot: 2, key: k },
            DiskOp::LoadState { slot: 3, key: k ^ 7, pos: 128 },
        ];
        assert_eq!(decode(&encode(&ops)).unwrap(), ops);
        assert!(decode(&[7]).is_none());
        assert!(decode(&encode(&ops)[..3]).is_none());
        let r = InitReply { file_bytes: 5 << 33, state_file_bytes: 7, keys: vec![(k, Kind::Block), (1, Kind::State)] };
        assert_eq!(InitReply::from_words(&r.to_words()).unwrap(), r);
    }
}
