#!/usr/bin/env python3
"""Low-bit checkpoints written the way their publishers write them, loaded by shardlm.

Needs numpy, and gguf (llama.cpp's Python package) for the GGUF part; the
safetensors files are read and written by the few lines below. Usage:

    scripts/lowbit_interop.py [path/to/shardlm]

Part 1, publisher layouts (FORMATS.md §1): the tiny llama and qwen3 fixtures
quantized to ModelOpt NVFP4, compressed-tensors NVFP4, gpt-oss MXFP4 and
DeepSeek block FP8 by numpy code that follows each publisher's quantize and
dequantize code; shardlm runs each checkpoint and the same model in f32 on the
weights as the publisher's dequantizer decodes them. The logits agree within the
bound `crates/cli/tests/quantize.rs` derives: 5% of the largest |logit| for the
FP4 formats (8-bit activations), 1e-3 for FP8 (f32 activations). The tiny gpt_oss
is written as OpenAI publishes gpt-oss: stacked experts in MXFP4 `_blocks`/`_scales`
(output-major), the rest in bf16.

Part 2, llama.cpp's GGUF types: the tiny llama as GGUF with its linear weights
quantized to MXFP4 and NVFP4 by gguf-py (`gguf.quants.quantize`, llama.cpp's
reference quantizer) loads in shardlm and matches the f32 GGUF of gguf-py's
dequantization; and a GGUF that `shardlm quantize` writes decodes in gguf-py
(`gguf.quants.dequantize`, times the `.scale` tensor) to weights on which
shardlm's f32 run matches, within the same bound.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDLM = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/shardlm")
PROMPT = "1,17,230,5,999,64,3,512"

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3_table():
    """All 256 E4M3 ("fn") values; NaN for 0x7F/0xFF."""
    v = np.zeros(256, np.float32)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[b] = -mag if b & 0x80 else mag
    v[0x7F] = v[0xFF] = np.nan
    return v


E4M3 = e4m3_table()
E4M3_POS = np.arange(0x7F)  # finite non-negative codes, ascending values


def to_e4m3(x):
    """Nearest E4M3 code (saturating), as torch's float8_e4m3fn cast rounds."""
    x = np.asarray(x, np.float32)
    idx = np.abs(np.abs(x)[..., None] - E4M3[E4M3_POS]).argmin(-1).astype(np.uint8)
    return np.where(x < 0, idx | 0x80, idx).astype(np.uint8)


def to_e2m1(x):
    """Nearest E2M1 code (saturating at ±6)."""
    idx = np.abs(np.abs(x)[..., None] - E2M1[:8]).argmin(-1).astype(np.uint8)
    return np.where(x < 0, idx | 8, idx).astype(np.uint8)


def pack_fp4(codes):
    """[.., K] codes → [.., K/2] bytes, element 2i in the low nibble (all publishers)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(b):
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 15, b >> 4
    return out


# ---------------------------------------------------------------- safetensors


def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[8 + n + a : 8 + n + b])
    return out


def to_f32(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, np.float32).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(shape)
    assert dtype == "BF16", dtype
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def write_st(path, tensors):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors:
            f.write(t[3])


def is_linear(name, shape):
    return len(shape) == 2 and name.endswith("_proj.weight")


# ------------------------------------------------------ publishers' quantizers
# Each returns (tensors to write for layer `base`, the weight as the publisher dequantizes it).


def modelopt_nvfp4(base, w):
    # ModelOpt NVFP4QTensor: weight_scale_2 = amax/(6·448); per-16 scale = amax_16/(6·weight_scale_2) in E4M3.
    n, k = w.shape
    s2 = np.float32(np.abs(w).max() / (6 * 448))
    g = w.reshape(n, k // 16, 16)
    sc = to_e4m3(np.abs(g).max(-1) / (6 * s2))
    d = E4M3[sc] * s2
    codes = to_e2m1(g / np.where(d > 0, d, 1)[..., None]).reshape(n, k)
    deq = (E2M1[codes].reshape(n, k // 16, 16) * E4M3[sc][..., None] * s2).reshape(n, k)
    return [
        (f"{base}.weight", "U8", [n, k // 2], pack_fp4(codes).tobytes()),
        (f"{base}.weight_scale", "F8_E4M3", [n, k // 16], sc.tobytes()),
        (f"{base}.weight_scale_2", "F32", [], s2.tobytes()),
        (f"{base}.input_scale", "F32", [], np.float32(1.0).tobytes()),
    ], deq


def ct_nvfp4(base, w):
    # compressed-tensors nvfp4-pack-quantized: global_scale = 6·448/amax; scale = amax_16/6·global (E4M3);
    # dequantize x = E2M1 · scale / global_scale.
    n, k = w.shape
    gs = np.float32(6 * 448 / np.abs(w).max())
    g = w.reshape(n, k // 16, 16)
    sc = to_e4m3(np.abs(g).max(-1) / 6 * gs)
    d = E4M3[sc] / gs
    codes = to_e2m1(g / np.where(d > 0, d, 1)[..., None]).reshape(n, k)
    deq = (E2M1[codes].reshape(n, k // 16, 16) * (E4M3[sc] / gs)[..., None]).reshape(n, k)
    return [
        (f"{base}.weight_packed", "U8", [n, k // 2], pack_fp4(codes).tobytes()),
        (f"{base}.weight_scale", "F8_E4M3", [n, k // 16], sc.tobytes()),
        (f"{base}.weight_global_scale", "F32", [1], np.array([gs], np.float32).tobytes()),
        (f"{base}.input_global_scale", "F32", [1], np.array([1.0], np.float32).tobytes()),
    ], deq


def gpt_oss_mxfp4(base, w):
    # gpt-oss `_blocks` [.., K/32, 16] / `_scales` [.., K/32] (E8M0); dequantize as gpt_oss/torch/weights.py:
    # LUT[b & 0xF], LUT[b >> 4] interleaved, then ldexp(·, scale − 127). (Dense layer: names X.weight_blocks/_scales.)
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127).astype(np.int32)
    scales = np.clip(e + 127, 0, 254).astype(np.uint8)
    codes = to_e2m1(g / np.ldexp(1.0, scales.astype(np.int32) - 127)[..., None].astype(np.float32))
    blocks = pack_fp4(codes)  # [n, K/32, 16]
    lut = E2M1[unpack_fp4(blocks)]  # [n, K/32, 32]
    deq = np.ldexp(lut, (scales.astype(np.int32) - 127)[..., None]).reshape(n, k).astype(np.float32)
    return [
        (f"{base}.weight_blocks", "U8", [n, k // 32, 16], blocks.tobytes()),
        (f"{base}.weight_scales", "U8", [n, k // 32], scales.tobytes()),
    ], deq


def deepseek_fp8(base, w):
    # DeepSeek-V3 block FP8: scale_inv per 128×128 = amax/448; weight = E4M3(w / scale); w = fp8 · scale_inv.
    n, k = w.shape
    gn, gk = -(-n // 128), -(-k // 128)
    s = np.ones((gn, gk), np.float32)
    for i in range(gn):
        for j in range(gk):
            a = np.abs(w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]).max()
            s[i, j] = a / 448 if a > 0 else 1.0
    full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:n, :k]
    q = to_e4m3(w / full)
    deq = E4M3[q] * full
    return [
        (f"{base}.weight", "F8_E4M3", [n, k], q.tobytes()),
        (f"{base}.weight_scale_inv", "F32", [gn, gk], s.tobytes()),
    ], deq


LAYOUTS = {
    "modelopt-nvfp4": (modelopt_nvfp4, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}),
    "ct-nvfp4": (ct_nvfp4, {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}),
    "gpt-oss-mxfp4": (gpt_oss_mxfp4, {"quant_method": "mxfp4"}),
    "deepseek-fp8": (
        deepseek_fp8,
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    ),
}


# ------------------------------------------------------------------ running


def logits(model):
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "l.safetensors")
        cmd = [SHARDLM, "run", "--model", model, "--prompt-ids", PROMPT, "--max-tokens", "1", "--json"]
        # An f32 KV cache on both sides (quantized models default to f16), so only the weights' format differs.
        env = dict(os.environ, SHARDLM_KV_TYPE="f32")
        subprocess.run(cmd + ["--threads", "1", "--dump-logits", dump], check=True, capture_output=True, env=env)
        t = read_st(dump)["logits"]
        return to_f32(*t)


def compare(what, quantized, reference, fp8):
    a, b = logits(quantized), logits(reference)
    diff, top = float(np.abs(a - b).max()), float(np.abs(b).max())
    bound = 1e-3 if fp8 else 0.05 * top
    ok = diff <= bound
    print(f"{'ok  ' if ok else 'FAIL'} {what}: max |Δ logits| = {diff:.3e} (max |logit| {top:.2f}, bound {bound:.2e})")
    return ok


def publisher_layouts(tmp):
    ok = True
    for arch in ["llama", "qwen3"]:
        src = os.path.join(ROOT, "tests/fixtures/tiny", arch)
        tensors = read_st(os.path.join(src, "model.safetensors"))
        cfg = json.load(open(os.path.join(src, "config.json")))
        for layout, (quantize, qcfg) in LAYOUTS.items():
            qdir, rdir = os.path.join(tmp, f"{arch}-{layout}"), os.path.join(tmp, f"{arch}-{layout}-f32")
            os.makedirs(qdir), os.makedirs(rdir)
            qt, rt = [], []
            for name, (dtype, shape, raw) in sorted(tensors.items()):
                w = to_f32(dtype, shape, raw)
                if is_linear(name, shape):
                    parts, deq = quantize(name[: -len(".weight")], w)
                    qt += parts
                    rt.append((name, "F32", shape, deq.astype(np.float32).tobytes()))
                else:
                    qt.append((name, dtype, shape, raw))
                    rt.append((name, "F32", shape, w.astype(np.float32).tobytes()))
            write_st(os.path.join(qdir, "model.safetensors"), qt)
            write_st(os.path.join(rdir, "model.safetensors"), rt)
            json.dump(dict(cfg, quantization_config=qcfg), open(os.path.join(qdir, "config.json"), "w"))
            json.dump(cfg, open(os.path.join(rdir, "config.json"), "w"))
            ok &= compare(f"{arch} {layout}", qdir, rdir, layout.endswith("fp8"))
    return ok


def gpt_oss_experts(tmp):
    """The gpt_oss fixture as OpenAI publishes gpt-oss: the stacked experts in MXFP4
    (`X_blocks` [E, out, in/32, 16], `X_scales` [E, out, in/32]: the bf16 `[E, in, out]`
    transposed to output-major, then quantized along `in`), everything else in bf16.
    The reference holds the publisher's dequantization, back in HF's `[E, in, out]`."""
    src = os.path.join(ROOT, "tests/fixtures/tiny/gpt_oss")
    tensors = read_st(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    qdir, rdir = os.path.join(tmp, "gpt_oss-mxfp4"), os.path.join(tmp, "gpt_oss-mxfp4-f32")
    os.makedirs(qdir), os.makedirs(rdir)
    qt, rt, kept = [], [], []
    for name, (dtype, shape, raw) in sorted(tensors.items()):
        w = to_f32(dtype, shape, raw)
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, k, n = shape
            parts, deq = gpt_oss_mxfp4(name, w.transpose(0, 2, 1).reshape(e * n, k))
            (blocks, scales) = (parts[0][3], parts[1][3])
            qt += [(f"{name}_blocks", "U8", [e, n, k // 32, 16], blocks), (f"{name}_scales", "U8", [e, n, k // 32], scales)]
            rt.append((name, "F32", shape, deq.reshape(e, n, k).transpose(0, 2, 1).astype(np.float32).tobytes()))
        else:
            if name.endswith(".weight") and len(shape) == 2:
                kept.append(name[: -len(".weight")])
            qt.append((name, dtype, shape, raw))
            rt.append((name, "F32", shape, w.astype(np.float32).tobytes()))
    write_st(os.path.join(qdir, "model.safetensors"), qt)
    write_st(os.path.join(rdir, "model.safetensors"), rt)
    qcfg = {"quant_method": "mxfp4", "modules_to_not_convert": kept}
    json.dump(dict(cfg, quantization_config=qcfg), open(os.path.join(qdir, "config.json"), "w"))
    json.dump(cfg, open(os.path.join(rdir, "config.json"), "w"))
    return compare("gpt_oss gpt-oss-mxfp4 experts", qdir, rdir, False)


# ---------------------------------------------------------------------- GGUF


def llama_gguf(path, weights, cfg, qtype):
    """The tiny llama as GGUF: linear weights as `qtype` (a gguf.GGMLQuantizationType) or F32."""
    import gguf

    gguf_names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_context_length(4096)
    w.add_vocab_size(cfg["vocab_size"])
    for name, x in weights.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            parts = name.split(".")
            g = f"blk.{parts[2]}.{gguf_names['.'.join(parts[3:-1])]}.weight"
        if is_linear(name, x.shape) and qtype is not None:
            w.add_tensor(g, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_dequantized(path):
    """Every tensor of a GGUF as f32 by gguf-py, NVFP4 weights times their `.scale` tensor."""
    import gguf

    r = gguf.GGUFReader(path)
    scales = {t.name[: -len(".scale")]: float(np.asarray(t.data).reshape(-1)[0]) for t in r.tensors if t.name.endswith(".scale")}
    out = {}
    for t in r.tensors:
        if t.name.endswith(".scale"):
            continue
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        x = x.reshape([int(d) for d in reversed(t.shape)])
        out[t.name] = x * scales.get(t.name[: -len(".weight")], 1.0)
    return out


def write_gguf_f32(path, tensors, src_path):
    """A copy of GGUF `src_path`'s llama metadata with `tensors` (GGUF names) as F32."""
    import gguf

    r = gguf.GGUFReader(src_path)
    w = gguf.GGUFWriter(path, "llama")
    for f in r.fields.values():
        if f.name.startswith("llama.") and f.types and f.types[0] != gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), f.types[0])
    for name, x in tensors.items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_interop(tmp):
    import gguf

    src = os.path.join(ROOT, "tests/fixtures/tiny/llama")
    cfg = json.load(open(os.path.join(src, "config.json")))
    weights = {n: to_f32(*t) for n, t in sorted(read_st(os.path.join(src, "model.safetensors")).items())}
    ok = True
    f32 = os.path.join(tmp, "llama-f32.gguf")
    llama_gguf(f32, weights, cfg, None)
    for qt in [gguf.GGMLQuantizationType.MXFP4, gguf.GGMLQuantizationType.NVFP4]:
        # llama.cpp's quantizer → shardlm.
        q = os.path.join(tmp, f"llama-gguf-py-{qt.name}.gguf")
        try:
            llama_gguf(q, weights, cfg, qt)
        except NotImplementedError:
            print(f"skip gguf-py {qt.name} GGUF in shardlm: this gguf-py has no {qt.name} quantizer")
        else:
            ref = os.path.join(tmp, f"llama-gguf-py-{qt.name}-deq.gguf")
            write_gguf_f32(ref, gguf_dequantized(q), q)
            ok &= compare(f"gguf-py {qt.name} GGUF in shardlm", q, ref, False)
        # shardlm's quantizer → llama.cpp's dequantizer.
        s = os.path.join(tmp, f"llama-shardlm-{qt.name}.gguf")
        subprocess.run([SHARDLM, "quantize", f32, s, "--to", qt.name.lower()], check=True, capture_output=True)
        ref = os.path.join(tmp, f"llama-shardlm-{qt.name}-deq.gguf")
        write_gguf_f32(ref, gguf_dequantized(s), s)
        ok &= compare(f"shardlm {qt.name} GGUF decoded by gguf-py", s, ref, False)
    return ok


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ok = publisher_layouts(tmp)
        ok &= gpt_oss_experts(tmp)
        try:
            import gguf  # noqa: F401
        except ImportError:
            print("GGUF interop SKIPPED: no gguf package (pip install gguf)")
        else:
            ok &= gguf_interop(tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
