//! The connection handshake, run on every connection before any data flows.
//!
//! ```text
//!  A                                        B
//!  hello(magic, version, rank, size, conn,  hello(...)               both write first
//!        fingerprint, nonce_A)     ───────▶ ◀─────
//!  check version, size, rank, fingerprint   (same checks)
//!  proof_A = HMAC(secret, L‖hello_A‖hello_B) ───▶ ◀─── proof_B = HMAC(secret, L‖hello_B‖hello_A)
//!  verify proof_B                           verify proof_A
//!  verdict byte                    ───────▶ ◀───── verdict byte
//! ```
//!
//! The secret itself never crosses the wire. Each proof covers both hellos, and
//! with them both fresh random nonces, so a proof cannot be replayed on another
//! connection; it also covers the version, rank and fingerprint, so they cannot
//! be altered in flight. A peer that echoes our own hello back (reflection) is
//! refused because it would claim our rank and our nonce. Every failure is
//! detected on both sides: mismatches are symmetric, and the verdict byte tells
//! a side whose own checks passed that the other side refused it.

use crate::error::{CommError, PeerId, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The wire protocol version spoken by this build. 2: the accepting side of
/// a TCP connection announces no connection count (it learns who connected
/// from the hello), and the hello's flags word may ask to continue a
/// connection whose cable was lost.
pub const PROTOCOL_VERSION: u32 = 2;

const MAGIC: [u8; 8] = *b"SHARDLM\0";
const PREFIX_LEN: usize = 16; // magic, version, rank: fixed in every version
/// Length of a version-1 hello.
pub(crate) const HELLO_LEN: usize = PREFIX_LEN + 16 + 8 + 32;
const PROOF_LEN: usize = 32;
/// Connection index announced by an accepting side, which learns the index
/// from the connecting side's hello.
pub(crate) const CONN_ANY: usize = u32::MAX as usize;
const LABEL: &[u8] = b"shardlm-auth/1";

/// Hello flag: the connection continues an existing one (see `tcp_resume`).
pub(crate) const FLAG_RESUME: u32 = 1;

const VERDICT_OK: u8 = 1;
const VERDICT_AUTH: u8 = 2;
const VERDICT_HELLO: u8 = 3;

/// A byte stream a handshake runs over. Errors must already name the peer.
pub(crate) trait HandshakeIo {
    fn write_all(&mut self, data: &[u8]) -> Result<()>;
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()>;
}

/// What one side announces about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub version: u32,
    pub rank: u32,
    pub size: u32,
    /// Index of this connection among the connections to the same peer.
    pub conn: u32,
    /// Number of connections per peer the sender uses.
    pub conns: u32,
    /// [`FLAG_RESUME`]: this connection continues connection `conn`, whose cable was lost.
    pub flags: u32,
    pub fingerprint: u64,
    pub nonce: [u8; 32],
}

impl Hello {
    /// A hello with a fresh random nonce.
    pub fn new(version: u32, rank: usize, size: usize, conn: usize, conns: usize, fingerprint: u64) -> Result<Hello> {
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce)
            .map_err(|e| CommError::Io { context: "reading random nonce".into(), detail: e.to_string() })?;
        Ok(Hello {
            version,
            rank: rank as u32,
            size: size as u32,
            conn: conn as u32,
            conns: conns as u32,
            flags: 0,
            fingerprint,
            nonce,
        })
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..20].copy_from_slice(&self.size.to_le_bytes());
        b[20..24].copy_from_slice(&self.conn.to_le_bytes());
        b[24..28].copy_from_slice(&self.conns.to_le_bytes());
        b[28..32].copy_from_slice(&self.flags.to_le_bytes());
        b[32..40].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[40..72].copy_from_slice(&self.nonce);
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> Hello {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Hello {
            version: u32_at(8),
            rank: u32_at(12),
            size: u32_at(16),
            conn: u32_at(20),
            conns: u32_at(24),
            flags: u32_at(28),
            fingerprint: u64::from_le_bytes(b[32..40].try_into().unwrap()),
            nonce: b[40..72].try_into().unwrap(),
        }
    }
}

fn proof(secret: &[u8], prover: &Hello, verifier: &Hello) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(LABEL);
    mac.update(&prover.encode());
    mac.update(&verifier.encode());
    mac
}

/// Runs the whole handshake on one connection.
///
/// `peer_of` maps the rank the other side claims to the identity used in error
/// messages; it is called with `None` when the other side is not a shardlm
/// process at all (bad magic), and may itself refuse a claimed rank.
pub(crate) fn handshake(
    io: &mut dyn HandshakeIo,
    ours: &Hello,
    secret: &[u8],
    peer_of: &dyn Fn(Option<usize>) -> Result<PeerId>,
) -> Result<(Hello, PeerId)> {
    io.write_all(&ours.encode())?;
    let mut raw = [0u8; HELLO_LEN];
    io.read_exact(&mut raw[..PREFIX_LEN])?;
    if raw[..8] != MAGIC {
        return Err(peer_of(None)?.handshake("it is not a shardlm process (bad magic)"));
    }
    let claimed = u32::from_le_bytes(raw[12..16].try_into().unwrap()) as usize;
    let peer = peer_of(Some(claimed))?;
    let version = u32::from_le_bytes(raw[8..12].try_into().unwrap());
    if version != ours.version {
        return Err(CommError::VersionMismatch {
            rank: peer.rank,
            addr: peer.addr.clone(),
            theirs: version,
            ours: ours.version,
        });
    }
    io.read_exact(&mut raw[PREFIX_LEN..])?;
    let theirs = Hello::decode(&raw);

    let hello_err = check_hello(ours, &theirs, &peer);
    io.write_all(&proof(secret, ours, &theirs).finalize().into_bytes())?;
    let mut their_proof = [0u8; PROOF_LEN];
    io.read_exact(&mut their_proof)?;
    let auth_ok = proof(secret, &theirs, ours).verify_slice(&their_proof).is_ok();

    let verdict = match (auth_ok, &hello_err) {
        (false, _) => VERDICT_AUTH,
        (true, Some(_)) => VERDICT_HELLO,
        (true, None) => VERDICT_OK,
    };
    io.write_all(&[verdict])?;
    let mut their_verdict = [0u8; 1];
    // A side that refused us may close before we read its verdict; our own
    // finding is then the better message, so report it first.
    let read_verdict = io.read_exact(&mut their_verdict);
    if !auth_ok {
        return Err(CommError::AuthFailed { rank: peer.rank, addr: peer.addr });
    }
    if let Some(err) = hello_err {
        return Err(err);
    }
    read_verdict?;
    match their_verdict[0] {
        VERDICT_OK => Ok((theirs, peer)),
        VERDICT_AUTH => Err(CommError::AuthFailed { rank: peer.rank, addr: peer.addr }),
        VERDICT_HELLO => Err(peer.handshake("it refused our hello (group size, rank or connection count differ)")),
        other => Err(peer.handshake(format!("unknown verdict byte {other}"))),
    }
}

fn check_hello(ours: &Hello, theirs: &Hello, peer: &PeerId) -> Option<CommError> {
    if theirs.size != ours.size {
        return Some(peer.handshake(format!("it runs a group of {} ranks, we run {}", theirs.size, ours.size)));
    }
    if theirs.rank == ours.rank || theirs.rank >= ours.size {
        return Some(peer.handshake(format!("it claims rank {}, which is invalid here", theirs.rank)));
    }
    if theirs.nonce == ours.nonce {
        return Some(peer.handshake("it echoed our own nonce"));
    }
    if theirs.fingerprint != ours.fingerprint {
        return Some(CommError::FingerprintMismatch {
            rank: peer.rank,
            addr: peer.addr.clone(),
            theirs: theirs.fingerprint,
            ours: ours.fingerprint,
        });
    }
    let any = CONN_ANY as u32;
    let index_differs = ours.conn != any && theirs.conn != any && theirs.conn != ours.conn;
    let count_differs = ours.conns != any && theirs.conns != any && theirs.conns != ours.conns;
    if count_differs || index_differs || (theirs.conn != any && theirs.conn >= theirs.conns) {
        return Some(peer.handshake(format!(
            "it opened connection {} of {}, we expected connection {} of {}",
            theirs.conn, theirs.conns, ours.conn, ours.conns
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};

    struct Pipe {
        tx: Sender<Vec<u8>>,
        rx: Receiver<Vec<u8>>,
        pending: Vec<u8>,
        peer: PeerId,
    }

    impl HandshakeIo for Pipe {
        fn write_all(&mut self, data: &[u8]) -> Result<()> {
            let _ = self.tx.send(data.to_vec());
            Ok(())
        }
        fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
            while self.pending.len() < buf.len() {
                let more = self.rx.recv().map_err(|_| self.peer.lost("closed"))?;
                self.pending.extend(more);
            }
            buf.copy_from_slice(&self.pending[..buf.len()]);
            self.pending.drain(..buf.len());
            Ok(())
        }
    }

    fn pair() -> (Pipe, Pipe) {
        let (ta, ra) = channel();
        let (tb, rb) = channel();
        let a = Pipe { tx: ta, rx: rb, pending: vec![], peer: PeerId::new(1, "b") };
        let b = Pipe { tx: tb, rx: ra, pending: vec![], peer: PeerId::new(0, "a") };
        (a, b)
    }

    fn run(secret_a: &[u8], secret_b: &[u8], va: u32, fa: u64) -> (Result<()>, Result<()>) {
        let (mut a, mut b) = pair();
        let ha = Hello::new(va, 0, 2, 0, 1, fa).unwrap();
        let hb = Hello::new(PROTOCOL_VERSION, 1, 2, 0, 1, 7).unwrap();
        let sb = secret_b.to_vec();
        let t = std::thread::spawn(move || {
            let peer = b.peer.clone();
            let r = handshake(&mut b, &hb, &sb, &|_| Ok(peer.clone()));
            drop(b);
            r.map(|_| ())
        });
        let peer = a.peer.clone();
        let ra = handshake(&mut a, &ha, secret_a, &|_| Ok(peer.clone())).map(|_| ());
        drop(a);
        (ra, t.join().unwrap())
    }

    #[test]
    fn same_secret_succeeds() {
        let (a, b) = run(b"s3cret", b"s3cret", PROTOCOL_VERSION, 7);
        a.unwrap();
        b.unwrap();
    }

    #[test]
    fn wrong_secret_fails_on_both_sides() {
        let (a, b) = run(b"s3cret", b"other", PROTOCOL_VERSION, 7);
        assert_eq!(a.unwrap_err().to_string(), "peer 1 at b failed authentication (wrong cluster secret)");
        assert_eq!(b.unwrap_err().to_string(), "peer 0 at a failed authentication (wrong cluster secret)");
    }

    #[test]
    fn version_and_fingerprint_mismatch() {
        let (v, w) = (PROTOCOL_VERSION, PROTOCOL_VERSION + 1);
        let (a, b) = run(b"s", b"s", w, 7);
        assert_eq!(a.unwrap_err().to_string(), format!("peer 1 at b speaks protocol v{v}, we speak v{w}"));
        assert_eq!(b.unwrap_err().to_string(), format!("peer 0 at a speaks protocol v{w}, we speak v{v}"));
        let (a, b) = run(b"s", b"s", PROTOCOL_VERSION, 8);
        assert!(matches!(a.unwrap_err(), CommError::FingerprintMismatch { .. }));
        assert!(matches!(b.unwrap_err(), CommError::FingerprintMismatch { .. }));
    }
}
