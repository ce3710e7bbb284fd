//! Any JSON as an HF `config.json`: a config or a typed error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = formats::hf::parse_config(std::path::Path::new("fuzz/config.json"), &v, None);
    }
});
