#!/usr/bin/env python3
# Usage: scripts/make_random_hf_llama.py OUT_DIR   (needs torch and safetensors)
# A random llama of the 1.1B shape (TinyLlama's: hidden 2048, FFN 5632, 22
# layers, 32 heads, 4 KV heads, vocab 32000) as a bf16 HF checkpoint: decode
# speed does not depend on the values.
import json, os, sys, torch
from safetensors.torch import save_file
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
h, f, L, nh, kv, v = 2048, 5632, 22, 32, 4, 32000
hd = h // nh
cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=h, intermediate_size=f,
           num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=kv, vocab_size=v,
           rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
           torch_dtype="bfloat16", head_dim=hd)
json.dump(cfg, open(f"{out}/config.json", "w"))
g = torch.Generator().manual_seed(0)
def r(*s):
    return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)
t = {"model.embed_tokens.weight": r(v, h), "lm_head.weight": r(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
for l in range(L):
    p = f"model.layers.{l}."
    t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    t[p + "self_attn.q_proj.weight"] = r(h, h)
    t[p + "self_attn.k_proj.weight"] = r(kv * hd, h)
    t[p + "self_attn.v_proj.weight"] = r(kv * hd, h)
    t[p + "self_attn.o_proj.weight"] = r(h, h)
    t[p + "mlp.gate_proj.weight"] = r(f, h)
    t[p + "mlp.up_proj.weight"] = r(f, h)
    t[p + "mlp.down_proj.weight"] = r(h, f)
save_file(t, f"{out}/model.safetensors")
print("made", out)
