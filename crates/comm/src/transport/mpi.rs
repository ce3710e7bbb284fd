//! MPI transport (cargo feature `mpi`): ranks started by `mpirun` (or any
//! launcher of the system MPI), linked by MPI point-to-point messages.
//!
//! [`MpiTransport::connect`] initialises MPI (once per process, thread level
//! `MPI_THREAD_SERIALIZED`), duplicates `MPI_COMM_WORLD` so our traffic can
//! never match another library's, and switches that communicator to
//! `MPI_ERRORS_RETURN` so failures become [`CommError`]s instead of aborts.
//!
//! `exchange` posts one `MPI_Irecv` per receive (first, so eager messages land
//! in place) and one `MPI_Isend` per send, then `MPI_Waitall`s. Every message
//! carries [`DATA_TAG`]; receives name their source, and MPI's non-overtaking
//! rule keeps messages between one pair of ranks in order. Messages over
//! [`MAX_PIECE`] bytes (MPI counts are C `int`s) go as several pieces, in
//! order. Lengths are exact: a shorter message is caught by `MPI_Get_count`,
//! a longer one by `MPI_ERR_TRUNCATE`, and both are protocol errors.
//! Known gap: with OpenMPI 4 (3 ranks on 2 cores, TCP BTL) the receive of a
//! longer message sometimes never completes, so that error can hang instead of
//! being reported. Probing the size first (`MPI_Mprobe`) would avoid the
//! truncation path; the handshake's version and model checks make a
//! mismatched length a bug rather than something a user can trigger.
//!
//! Trust: MPI's launcher decides who is in the world, so there is no secret and
//! no HMAC handshake. Joining still all-gathers each rank's protocol version,
//! model fingerprint and host name, and refuses a world that disagrees.
//!
//! Lifetime: MPI cannot be initialised twice in a process, so it stays up
//! after the transport is dropped and is finalised when the process exits
//! with status 0 (on glibc; elsewhere at any exit). `MPI_Finalize` waits for
//! every rank, so a rank that exits with an error skips it: the launcher then
//! sees a rank die and ends the job, instead of everyone hanging. There is no
//! operation timeout: a dead rank is detected by the MPI launcher, which
//! terminates the whole job.

use super::{validate_ops, BusyGuard, RecvOp, SendOp, Transport};
use crate::error::{CommError, PeerId, Result};
use crate::group::Group;
use crate::handshake::PROTOCOL_VERSION;
use ::mpi::ffi;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

/// The tag of every data message (receives also name their source).
pub const DATA_TAG: c_int = 0x534c;

/// Largest single MPI message; longer ones are split into pieces of this size.
pub const MAX_PIECE: usize = 1 << 30;

/// Bytes of a host name in the join record.
const HOST_BYTES: usize = 256;

/// What each rank contributes when joining: version, fingerprint, host name.
const RECORD_BYTES: usize = 4 + 4 + 8 + HOST_BYTES;

/// `MPI_Comm` is a raw pointer (OpenMPI) or an integer handle (MPICH).
#[derive(Clone, Copy)]
struct Comm(ffi::MPI_Comm);

// SAFETY: a communicator handle is an opaque reference into the MPI library,
// which we initialise with MPI_THREAD_SERIALIZED (or better); `BusyGuard`
// makes sure only one thread at a time issues calls on it.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// One rank of an MPI world. Create it with [`MpiTransport::connect`] in every
/// process of the job (it is collective over `MPI_COMM_WORLD`).
pub struct MpiTransport {
    comm: Comm,
    rank: usize,
    size: usize,
    /// Host name of every rank, for messages.
    hosts: Vec<String>,
    busy: AtomicBool,
    failed: Mutex<Option<CommError>>,
}

/// Turns an MPI error code into its library's description.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters as required.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {code}");
    }
    let bytes: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// Maps an MPI return code to a result, naming the call.
fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(CommError::Io { context: what.to_string(), detail: error_string(rc) })
    }
}

/// Ends the whole job from a state we cannot safely return from (MPI may still
/// write into buffers the caller is about to free).
fn fatal(comm: Comm, msg: &str) -> ! {
    eprintln!("shardlm-comm: fatal MPI failure: {msg}; aborting the job");
    // SAFETY: plain FFI call; MPI_Abort does not return when it succeeds.
    unsafe { ffi::MPI_Abort(comm.0, 1) };
    std::process::abort()
}

/// Finalises MPI unless that already happened.
fn finalize() {
    if ::mpi::environment::is_initialized() && !::mpi::environment::is_finalized() {
        // SAFETY: MPI is initialised and not finalised; nothing else uses it at exit.
        unsafe { ffi::MPI_Finalize() };
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// glibc's exit hook that also receives the exit status.
    fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn finalize_on_exit(status: c_int, _: *mut c_void) {
    // A failing rank must not wait in MPI_Finalize for ranks that wait for it.
    if status == 0 {
        finalize();
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
extern "C" fn finalize_at_exit() {
    finalize();
}

fn register_finalize() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: registers a plain function pointer with no captured state.
    unsafe {
        on_exit(finalize_on_exit, std::ptr::null_mut());
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    // SAFETY: as above.
    unsafe {
        libc::atexit(finalize_at_exit);
    }
}

/// Initialises MPI once per process (or adopts an MPI someone else started).
fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        use ::mpi::Threading;
        if ::mpi::environment::is_finalized() {
            return Err(CommError::invalid("MPI was already finalised in this process"));
        }
        let provided = match ::mpi::initialize_with_threading(Threading::Serialized) {
            Some((universe, provided)) => {
                // Dropping the universe would finalise MPI; we do that at exit instead.
                std::mem::forget(universe);
                register_finalize();
                provided
            }
            None => {
                // Already initialised by the host program: use it, leave finalising to it.
                let mut level: c_int = 0;
                // SAFETY: MPI is initialised.
                check(unsafe { ffi::MPI_Query_thread(&mut level) }, "MPI_Query_thread")?;
                Threading::from(level)
            }
        };
        if provided < Threading::Serialized {
            return Err(CommError::invalid(format!(
                "the MPI library provides thread level {provided:?}; shardlm needs MPI_THREAD_SERIALIZED"
            )));
        }
        Ok(())
    })
    .clone()
}

/// This host's name as MPI reports it.
fn processor_name() -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_PROCESSOR_NAME as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_PROCESSOR_NAME characters as required.
    let rc = unsafe { ffi::MPI_Get_processor_name(buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return "?".into();
    }
    let bytes: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn encode_record(fingerprint: u64, host: &str) -> [u8; RECORD_BYTES] {
    let mut rec = [0u8; RECORD_BYTES];
    rec[..4].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    rec[8..16].copy_from_slice(&fingerprint.to_le_bytes());
    let name = host.as_bytes();
    let n = name.len().min(HOST_BYTES);
    rec[16..16 + n].copy_from_slice(&name[..n]);
    rec
}

/// (protocol version, fingerprint, host) of one join record.
fn decode_record(rec: &[u8]) -> (u32, u64, String) {
    let version = u32::from_le_bytes(rec[..4].try_into().expect("4 bytes"));
    let fingerprint = u64::from_le_bytes(rec[8..16].try_into().expect("8 bytes"));
    let host = &rec[16..];
    let end = host.iter().position(|&b| b == 0).unwrap_or(host.len());
    (version, fingerprint, String::from_utf8_lossy(&host[..end]).into_owned())
}

/// Checks the join records of all ranks, as seen by `rank`: every rank must
/// speak our protocol and serve the model of rank 0. All ranks reach the same
/// verdict (each names the first rank that differs, or rank 0).
fn verify_world(rank: usize, records: &[(u32, u64, String)], addr: impl Fn(usize) -> String) -> Result<()> {
    let (ours_v, ours_fp, _) = &records[rank];
    if let Some(p) = records.iter().position(|(v, _, _)| v != ours_v) {
        return Err(CommError::VersionMismatch { rank: p, addr: addr(p), theirs: records[p].0, ours: *ours_v });
    }
    let reference = records[0].1;
    let odd = records.iter().position(|(_, fp, _)| *fp != reference);
    match odd {
        None => Ok(()),
        Some(_) if *ours_fp != reference => {
            Err(CommError::FingerprintMismatch { rank: 0, addr: addr(0), theirs: reference, ours: *ours_fp })
        }
        Some(p) => Err(CommError::FingerprintMismatch { rank: p, addr: addr(p), theirs: records[p].1, ours: *ours_fp }),
    }
}

/// Byte ranges of the pieces of a message of `len` bytes (one empty piece for 0).
fn pieces(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let starts = if len == 0 { 0..1 } else { 0..len.div_ceil(MAX_PIECE) };
    starts.map(move |i| i * MAX_PIECE..((i + 1) * MAX_PIECE).min(len))
}

impl MpiTransport {
    /// Joins the world of all processes of this MPI job. Collective: every
    /// rank must call it. Fails when the ranks disagree on `fingerprint` (the
    /// model they serve) or on the protocol version.
    pub fn connect(fingerprint: u64) -> Result<MpiTransport> {
        init()?;
        let mut comm = Comm(
            // SAFETY: reading an extern constant of the MPI shim.
            unsafe { ffi::RSMPI_COMM_NULL },
        );
        // SAFETY: MPI is initialised; `comm.0` receives the new handle.
        check(unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm.0) }, "MPI_Comm_dup")?;
        // SAFETY: `comm` is a valid communicator.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm.0, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `comm` is valid; the outputs are plain ints.
        unsafe {
            check(ffi::MPI_Comm_rank(comm.0, &mut rank), "MPI_Comm_rank")?;
            check(ffi::MPI_Comm_size(comm.0, &mut size), "MPI_Comm_size")?;
        }
        let (rank, size) = (rank as usize, size as usize);
        let mine = encode_record(fingerprint, &processor_name());
        let mut all = vec![0u8; RECORD_BYTES * size];
        // SAFETY: `mine` holds RECORD_BYTES bytes and `all` RECORD_BYTES per rank.
        check(
            unsafe {
                ffi::MPI_Allgather(
                    mine.as_ptr() as *const c_void,
                    RECORD_BYTES as c_int,
                    ffi::RSMPI_UINT8_T,
                    all.as_mut_ptr() as *mut c_void,
                    RECORD_BYTES as c_int,
                    ffi::RSMPI_UINT8_T,
                    comm.0,
                )
            },
            "MPI_Allgather of the join records",
        )?;
        let records: Vec<(u32, u64, String)> = all.chunks_exact(RECORD_BYTES).map(decode_record).collect();
        let hosts: Vec<String> = records.iter().map(|(_, _, h)| h.clone()).collect();
        verify_world(rank, &records, |p| format!("mpi:{}", hosts[p]))?;
        Ok(MpiTransport { comm, rank, size, hosts, busy: AtomicBool::new(false), failed: Mutex::new(None) })
    }

    /// The host name MPI reports for `peer`.
    pub fn host(&self, peer: usize) -> &str {
        &self.hosts[peer]
    }

    fn peer(&self, rank: usize) -> PeerId {
        PeerId::new(rank, self.peer_addr(rank))
    }

    fn run(&self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>]) -> Result<()> {
        // SAFETY (whole function): MPI is initialised and `self.comm` is valid;
        // every buffer handed to MPI outlives the requests, because we return
        // only once all of them completed (or abort the job).
        let (dtype, null) = unsafe { (ffi::RSMPI_UINT8_T, ffi::RSMPI_REQUEST_NULL) };
        let count = recvs.iter().map(|r| pieces(r.buf.len()).count()).sum::<usize>()
            + sends.iter().map(|s| pieces(s.data.len()).count()).sum::<usize>();
        let mut reqs = vec![null; count];
        // What each request is: a piece of receive `i`, or a send to `peer`.
        let mut what: Vec<Piece> = Vec::with_capacity(count);
        let mut posted = 0;
        for (i, r) in recvs.iter_mut().enumerate() {
            let base = r.buf.as_mut_ptr();
            for piece in pieces(r.buf.len()) {
                let rc = unsafe {
                    ffi::MPI_Irecv(
                        base.add(piece.start) as *mut c_void,
                        piece.len() as c_int,
                        dtype,
                        r.peer as c_int,
                        DATA_TAG,
                        self.comm.0,
                        &mut reqs[posted],
                    )
                };
                if rc != ffi::MPI_SUCCESS as c_int {
                    fatal(self.comm, &format!("MPI_Irecv from rank {}: {}", r.peer, error_string(rc)));
                }
                what.push(Piece::Recv(i, piece));
                posted += 1;
            }
        }
        for s in sends {
            for piece in pieces(s.data.len()) {
                let rc = unsafe {
                    ffi::MPI_Isend(
                        s.data.as_ptr().add(piece.start) as *const c_void,
                        piece.len() as c_int,
                        dtype,
                        s.peer as c_int,
                        DATA_TAG,
                        self.comm.0,
                        &mut reqs[posted],
                    )
                };
                if rc != ffi::MPI_SUCCESS as c_int {
                    fatal(self.comm, &format!("MPI_Isend to rank {}: {}", s.peer, error_string(rc)));
                }
                what.push(Piece::Send(s.peer));
                posted += 1;
            }
        }
        // SAFETY: an all-zero MPI_Status is a valid plain C struct.
        let mut statuses: Vec<ffi::MPI_Status> = vec![unsafe { std::mem::zeroed() }; count];
        let rc = unsafe { ffi::MPI_Waitall(count as c_int, reqs.as_mut_ptr(), statuses.as_mut_ptr()) };
        let in_status = rc == ffi::MPI_ERR_IN_STATUS as c_int;
        if rc != ffi::MPI_SUCCESS as c_int && !in_status {
            fatal(self.comm, &format!("MPI_Waitall: {}", error_string(rc)));
        }
        if in_status && statuses.iter().any(|s| s.MPI_ERROR == ffi::MPI_ERR_PENDING as c_int) {
            fatal(self.comm, "MPI_Waitall left requests pending after an error");
        }
        let mut first_err: Option<CommError> = None;
        for (k, w) in what.iter().enumerate() {
            let st = &statuses[k];
            let err = if in_status { st.MPI_ERROR } else { ffi::MPI_SUCCESS as c_int };
            let problem = match w {
                Piece::Send(peer) if err != ffi::MPI_SUCCESS as c_int => {
                    Some(self.peer(*peer).lost(format!("MPI send failed: {}", error_string(err))))
                }
                Piece::Send(_) => None,
                Piece::Recv(i, piece) => {
                    let (peer, total) = (recvs[*i].peer, recvs[*i].buf.len());
                    if err == ffi::MPI_ERR_TRUNCATE as c_int {
                        Some(self.peer(peer).protocol(format!("it sent more than the {total} bytes expected")))
                    } else if err != ffi::MPI_SUCCESS as c_int {
                        Some(self.peer(peer).lost(format!("MPI receive failed: {}", error_string(err))))
                    } else {
                        let mut got: c_int = 0;
                        let rc = unsafe { ffi::MPI_Get_count(st, dtype, &mut got) };
                        if rc != ffi::MPI_SUCCESS as c_int || got as usize != piece.len() {
                            Some(self.peer(peer).protocol(format!(
                                "it sent {} bytes where {total} were expected",
                                piece.start + got.max(0) as usize
                            )))
                        } else {
                            None
                        }
                    }
                }
            };
            if first_err.is_none() {
                first_err = problem;
            }
        }
        // Failed requests stay allocated; they are complete, so freeing is safe.
        for req in reqs.iter_mut().filter(|r| **r != null) {
            unsafe { ffi::MPI_Request_free(req) };
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// One MPI request of an exchange.
enum Piece {
    /// Bytes `range` of receive number `.0`.
    Recv(usize, std::ops::Range<usize>),
    /// A send to this rank.
    Send(usize),
}

impl Transport for MpiTransport {
    fn kind(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn peer_addr(&self, peer: usize) -> String {
        match self.hosts.get(peer) {
            Some(h) => format!("mpi:{h}"),
            None => format!("mpi:rank{peer}"),
        }
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

impl Group {
    /// Joins the world of this MPI job (every process of `mpirun` calls it);
    /// see [`MpiTransport::connect`].
    pub fn connect_mpi(fingerprint: u64) -> Result<Group> {
        Ok(Group::new(Arc::new(MpiTransport::connect(fingerprint)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let rec = encode_record(0xdead_beef_0123, "node-7");
        assert_eq!(decode_record(&rec), (PROTOCOL_VERSION, 0xdead_beef_0123, "node-7".to_string()));
        let long = "h".repeat(400);
        assert_eq!(decode_record(&encode_record(1, &long)).2.len(), HOST_BYTES);
    }

    #[test]
    fn every_rank_refuses_a_mixed_world() {
        let rec = |fp: u64| (PROTOCOL_VERSION, fp, "h".to_string());
        let world = [rec(7), rec(7), rec(9)];
        let addr = |p: usize| format!("mpi:h{p}");
        for rank in 0..3 {
            let e = verify_world(rank, &world, addr).unwrap_err();
            match rank {
                2 => assert_eq!(
                    e.to_string(),
                    "peer 0 at mpi:h0 has model fingerprint 0000000000000007, we have 0000000000000009"
                ),
                _ => assert_eq!(
                    e.to_string(),
                    "peer 2 at mpi:h2 has model fingerprint 0000000000000009, we have 0000000000000007"
                ),
            }
        }
        assert!(verify_world(1, &[rec(7), rec(7)], addr).is_ok());
        let old = [rec(7), (PROTOCOL_VERSION + 1, 7, "h".to_string())];
        assert!(matches!(verify_world(0, &old, addr), Err(CommError::VersionMismatch { rank: 1, .. })));
    }

    #[test]
    fn pieces_cover_the_message() {
        assert_eq!(pieces(0).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(pieces(5).collect::<Vec<_>>(), vec![0..5]);
        let big: Vec<_> = pieces(2 * MAX_PIECE + 3).collect();
        assert_eq!(big, vec![0..MAX_PIECE, MAX_PIECE..2 * MAX_PIECE, 2 * MAX_PIECE..2 * MAX_PIECE + 3]);
    }
}
