//! Any JSON as a `json_schema` / tool parameter schema: it compiles to the
//! guide's grammar or is refused, and the shortest valid text is computable.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(s) = server::Schema::compile(&v) {
            let _ = s.min_text(s.root, 0);
        }
    }
});
