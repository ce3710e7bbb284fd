//! `shardlm devices`: the GPUs `--device gpu:N` can name, in that order,
//! with what each reports (backend, driver, device memory, whether it is a
//! software adapter), as a table or `--json`.

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Print one JSON object (`{"gpus": [...]}`) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn devices(a: DevicesArgs) -> Result<()> {
    let gpus = shardlm_gpu::Gpu::adapters();
    if a.json {
        let list: Vec<serde_json::Value> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                serde_json::json!({
                    "device": format!("gpu:{i}"),
                    "name": g.name,
                    "backend": g.backend,
                    "driver": g.driver,
                    "software": g.software,
                    "memory_bytes": g.memory_bytes,
                    "max_binding_bytes": g.max_binding_bytes,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "gpus": list }));
        return Ok(());
    }
    if gpus.is_empty() {
        println!("no GPU (Vulkan or Metal) adapter: --device cpu only");
        return Ok(());
    }
    for (i, g) in gpus.iter().enumerate() {
        let note = if g.software { ": slower than --device cpu" } else { "" };
        println!("gpu:{i}  {g}{note}");
    }
    Ok(())
}
