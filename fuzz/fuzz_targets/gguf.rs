//! Any bytes as a `.gguf` file: `open_model` returns a model or a typed error,
//! never panics, hangs or allocates what a size field claims without the bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("shardlm-fuzz-gguf-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("m.gguf");
    if std::fs::write(&path, data).is_ok() {
        let _ = formats::open_model(&path);
    }
});
