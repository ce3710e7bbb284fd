//! Weights on transparent huge pages.
//!
//! Decode streams every weight once per token. On 4 KiB pages that is one
//! TLB miss per page (23,000 per token for a 92 MB model), and in a virtual
//! machine each miss walks two page tables. Linux gives anonymous memory
//! 2 MiB pages where asked (`MADV_HUGEPAGE`; most distributions ship THP in
//! `madvise` mode, so nothing is on huge pages unless it asks). The buffers
//! the loader writes itself (weights repacked for the decode kernels) ask
//! before their first touch, from one arena ([`alloc`]) so that small
//! tensors share huge pages. `SHARDLM_THP=0` turns the advice off (A/B runs).

/// Whether weights go on huge pages: Linux with transparent huge pages
/// available (not `never`), and `SHARDLM_THP` not `0`.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        cfg!(target_os = "linux")
            && std::env::var("SHARDLM_THP").map_or(true, |v| v != "0")
            && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .is_ok_and(|s| !s.contains("[never]"))
    })
}

/// Asks for huge pages under `buf` (whole 2 MiB-aligned spans only: the
/// kernel maps those on first touch); a no-op below 2 MiB, off Linux, or with
/// `SHARDLM_THP=0`.
pub fn advise(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if buf.len() < HUGE || !enabled() {
            return;
        }
        let start = (buf.as_mut_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_mut_ptr() as usize + buf.len()) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`, which this thread owns;
            // MADV_HUGEPAGE changes only how its pages are backed, never their
            // contents (a failure leaves 4 KiB pages).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
}

/// Huge-page spans shared by many tensors: most per-layer weights are under
/// 2 MiB (SmolLM2's are 0.2–0.6 MB), so a buffer of their own never holds a
/// whole huge page. The loader carves them out of 64 MiB chunks instead
/// ([`Arena::alloc`]); a tensor of 16 MiB or more gets a chunk of its own.
/// Each chunk is 2 MiB-aligned, so all of it can be huge pages; its unused
/// tail is never touched (at most one huge page of it becomes resident,
/// ≤ 3% of a chunk). A chunk lives as long as a tensor in it: the arena
/// keeps only a weak handle, and [`start_load`] makes the next tensor start
/// a fresh chunk, so a model loaded again (a re-formed cluster) never keeps
/// the old one's memory alive.
pub struct Arena {
    current: Option<(std::sync::Weak<Chunk>, usize)>,
}

const CHUNK: usize = 64 << 20;
const OWN_CHUNK_FROM: usize = 16 << 20;
const HUGE_ALIGN: usize = 2 << 20;
/// Regions start on cache lines (the kernels' vector loads).
const REGION_ALIGN: usize = 64;

/// One zeroed allocation, 2 MiB-aligned. On Linux an anonymous mapping, so
/// pages that are never written (a chunk's unused tail) cost no memory: a
/// zeroing allocator would write every byte of it (Rust's `alloc_zeroed`
/// zeroes by hand above the platform's alignment).
struct Chunk {
    ptr: std::ptr::NonNull<u8>,
    /// What `Drop` gives back: the mapping (Linux) or the allocation.
    base: *mut u8,
    size: usize,
}

// SAFETY: the chunk is plain memory; regions hand out disjoint ranges of it
// (mutable only in a `RegionMut`, which no `Region` overlaps).
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    #[cfg(target_os = "linux")]
    fn new(len: usize) -> Chunk {
        let size = len.max(1) + HUGE_ALIGN;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(size, HUGE_ALIGN).expect("chunk size"));
        }
        let base = base as *mut u8;
        let start = (base as usize).next_multiple_of(HUGE_ALIGN) - base as usize;
        // SAFETY: `start + len ≤ size` bytes inside the mapping, owned here.
        let ptr = unsafe { std::ptr::NonNull::new_unchecked(base.add(start)) };
        advise(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) });
        Chunk { ptr, base, size }
    }

    #[cfg(not(target_os = "linux"))]
    fn new(len: usize) -> Chunk {
        let layout = std::alloc::Layout::from_size_align(len.max(1), HUGE_ALIGN).expect("chunk size overflows");
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(p) else { std::alloc::handle_alloc_error(layout) };
        Chunk { ptr, base: p, size: layout.size() }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `base`/`size` are what `Chunk::new` mapped or allocated.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.size);
        }
        #[cfg(not(target_os = "linux"))]
        unsafe {
            std::alloc::dealloc(self.base, std::alloc::Layout::from_size_align_unchecked(self.size, HUGE_ALIGN))
        }
    }
}

/// A read-only range of a chunk. Cloning is cheap (reference counted).
#[derive(Clone)]
pub struct Region {
    chunk: std::sync::Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl std::ops::Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: inside the chunk, which lives as long as `self`; no
        // `RegionMut` overlaps a `Region` (see `RegionMut::freeze`).
        unsafe { std::slice::from_raw_parts(self.chunk.ptr.as_ptr().add(self.offset), self.len) }
    }
}

/// A freshly carved range, writable until [`RegionMut::freeze`].
pub struct RegionMut(Region);

impl RegionMut {
    pub fn freeze(self) -> Region {
        self.0
    }
}

impl std::ops::Deref for RegionMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for RegionMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = &self.0;
        // SAFETY: the arena hands each range out once, as this `RegionMut`,
        // and nothing else reads it until `freeze` consumes it.
        unsafe { std::slice::from_raw_parts_mut(r.chunk.ptr.as_ptr().add(r.offset), r.len) }
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl Arena {
    pub const fn new() -> Arena {
        Arena { current: None }
    }

    /// `len` zeroed bytes on huge pages where the system allows.
    pub fn alloc(&mut self, len: usize) -> RegionMut {
        if len >= OWN_CHUNK_FROM {
            let chunk = std::sync::Arc::new(Chunk::new(len));
            return RegionMut(Region { chunk, offset: 0, len });
        }
        let room = self.current.as_ref().and_then(|(c, used)| {
            let offset = used.next_multiple_of(REGION_ALIGN);
            (offset + len <= CHUNK).then(|| c.upgrade()).flatten().map(|c| (c, offset))
        });
        let (chunk, offset) = room.unwrap_or_else(|| (std::sync::Arc::new(Chunk::new(CHUNK)), 0));
        self.current = Some((std::sync::Arc::downgrade(&chunk), offset + len));
        RegionMut(Region { chunk, offset, len })
    }

    /// The next allocation starts a fresh chunk.
    pub fn start_load(&mut self) {
        self.current = None;
    }
}

static ARENA: std::sync::Mutex<Arena> = std::sync::Mutex::new(Arena::new());

/// Marks the start of a model load (see [`Arena`]).
pub fn start_load() {
    ARENA.lock().unwrap_or_else(|e| e.into_inner()).start_load();
}

/// The loader's arena (one per process: chunks are freed when their last
/// tensor goes).
pub fn alloc(len: usize) -> RegionMut {
    ARENA.lock().unwrap_or_else(|e| e.into_inner()).alloc(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_disjoint_zeroed_and_aligned() {
        let mut a = Arena::new();
        let mut rs: Vec<RegionMut> = [100, 5000, 3 << 20, 17 << 20, 1].iter().map(|&n| a.alloc(n)).collect();
        for (i, r) in rs.iter_mut().enumerate() {
            assert!(r.iter().all(|&b| b == 0));
            assert_eq!(r.as_ptr() as usize % REGION_ALIGN, 0);
            r.fill(i as u8 + 1);
        }
        let frozen: Vec<Region> = rs.into_iter().map(RegionMut::freeze).collect();
        for (i, r) in frozen.iter().enumerate() {
            assert!(r.iter().all(|&b| b == i as u8 + 1), "region {i} was overwritten");
        }
        // Shared chunk: the small regions sit in one; a fresh load starts another.
        assert!(std::sync::Arc::ptr_eq(&frozen[0].chunk, &frozen[1].chunk));
        a.start_load();
        let next = a.alloc(10).freeze();
        assert!(!std::sync::Arc::ptr_eq(&next.chunk, &frozen[0].chunk));
        // Once its tensors are gone, a chunk is freed, not reused.
        let weak = std::sync::Arc::downgrade(&next.chunk);
        drop(next);
        assert!(weak.upgrade().is_none());
    }
}
