//! Large buffers on transparent huge pages.
//!
//! Decode streams every weight once per token. On 4 KiB pages that is one
//! TLB miss per page (23,000 per token for a 92 MB model), and in a virtual
//! machine each miss walks two page tables. Linux gives anonymous memory
//! 2 MiB pages where asked (`MADV_HUGEPAGE`; most distributions ship THP in
//! `madvise` mode, so nothing is on huge pages unless it asks). The buffers
//! the loader writes itself (weights repacked for the decode kernels) ask
//! before their first touch. `SHARDLM_THP=0` turns it off (A/B runs).

/// A zeroed buffer of `len` bytes, on huge pages where the system allows.
pub fn zeroed(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    advise(&mut v);
    v
}

/// Asks for huge pages under `buf` (whole 2 MiB-aligned spans only: the
/// kernel maps those on first touch); a no-op below 2 MiB, off Linux, or with
/// `SHARDLM_THP=0`.
pub fn advise(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if buf.len() < HUGE || std::env::var("SHARDLM_THP").is_ok_and(|v| v == "0") {
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
