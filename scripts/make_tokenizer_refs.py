#!/usr/bin/env python3
"""Reference token ids from llama.cpp for the tokenizer tests.

Writes tests/data/tokenizer/smollm2_tokens.json with, for every text below, the ids
llama.cpp (through llama-cpp-python) gives with
`llm.tokenize(text.encode(), add_bos=False, special=True)`:

* `ids`: the SmolLM2 GGUF as it is (byte-level BPE, pre-tokenizer "smollm");
* `pre_variants[name]`: the same vocabulary with `tokenizer.ggml.pre` set to another
  llama.cpp pre-tokenizer name (a vocab-only copy of the GGUF is written for each), so
  every supported regex set is checked against llama.cpp; stored as
  {text index: ids} for the texts whose ids differ from `ids`;
* `spm`: a SentencePiece ("llama") vocabulary derived from SmolLM2's by the rule in
  `spm_vocab` (the Rust test rebuilds it the same way), with and without BOS.

Usage: python3 scripts/make_tokenizer_refs.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
The model defaults to $SHARDLM_CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf with
SHARDLM_CACHE defaulting to ~/.cache/shardlm.
"""

import json
import os
import sys
import tempfile

import gguf
import llama_cpp

COMMAND = "python3 scripts/make_tokenizer_refs.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizer", "smollm2_tokens.json")

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    "   leading spaces",
    "trailing spaces   ",
    "multiple   spaces   between    words",
    "tabs\tand\ttabs\t\t",
    "line one\nline two\n\nline four\r\nwindows line",
    "\n\n\n",
    " ",
    "",
    "12345",
    "3.14159 and 2.71828, 1,000,000 and 0x1F; 1234567890 in 2024",
    "I'm sure you'll see they've done it, didn't they? It's John's. I'D SAY WE'RE OK",
    "café naïve résumé Ångström façade",
    "中文分词测试：你好，世界！",
    "日本語のテキスト、カタカナとひらがな。",
    "Привет, как дела? Съешь же ещё этих мягких булок.",
    "emoji 😀🎉👍🏽 and flags 🇫🇷 and ZWJ 👨‍👩‍👧",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<filename>main.py<file_sep> <|im_end|>  <|im_start|",
    "Mixed 中文 and English 123 numbers ١٢٣ and ½ ²",
    "Arabic مرحبا بالعالم, Hindi नमस्ते दुनिया, Thai สวัสดีครับ",
    "Korean 안녕하세요 and Greek Καλημέρα κόσμε",
    "symbols: @#$%^&*()_+-=[]{}|;':\",./<>?`~ «quotes» — dash … ellipsis",
    "URL https://example.com/path?q=1&b=2#frag email a.b@c.org",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "zero\u200bwidth, nbsp\u00a0here, ideographic\u3000space, nel\u0085end",
    "   \n  \n\t \n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]

# Every llama.cpp pre-tokenizer name the Rust side supports (crates/engine/src/
# tokenizer/pretok.rs), checked with SmolLM2's vocabulary.
PRE_VARIANTS = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
    "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "falcon",
    "mpt", "starcoder", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
    "a.x-4.0", "mellum", "modern-bert", "jais-2", "jina-v1-en", "jina-v2-code", "roberta-bpe", "refact",
    "command-r", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx",
    "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken", "smollm",
    "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe", "chameleon", "minerva-7b",
    "megrez", "gpt-4o", "llama4", "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe",
    "trillion", "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "hunyuan",
    "hunyuan-dense", "hy_v4", "joyai-llm", "ufakzeka", "grok-2", "laguna", "minimax-m2", "solar-open",
    "mellum2",
]

# The SentencePiece vocabulary: see spm_vocab().
SPM_FIRST_N = 8000
SPM_SPECIALS = [("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)]


def default_model():
    cache = os.environ.get("SHARDLM_CACHE") or os.path.expanduser("~/.cache/shardlm")
    return os.path.join(cache, "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def spm_vocab(tokens, types):
    """[<unk>, <s>, </s>, <0x00>..<0xFF>, specials, pieces]: pieces are SmolLM2's normal
    tokens with id < SPM_FIRST_N whose bytes are valid UTF-8, spaces written as ▁, the
    first of any duplicates kept, score = -id."""
    dec = byte_decoder()
    out = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    out += [("<0x%02X>" % b, 0.0, 6) for b in range(256)]
    out += [(t, 0.0, ty) for t, ty in SPM_SPECIALS]
    seen = {t for t, _, _ in out}
    for i in range(min(SPM_FIRST_N, len(tokens))):
        if types[i] != 1:
            continue
        try:
            text = bytes(dec[c] for c in tokens[i]).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        piece = text.replace(" ", "\u2581")
        if piece in seen:
            continue
        seen.add(piece)
        out.append((piece, -float(i), 1))
    return out


def copy_kv(reader, writer, skip):
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in skip:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)


def write_vocab_gguf(reader, path, arch, skip, extra):
    w = gguf.GGUFWriter(path, arch)
    copy_kv(reader, w, skip)
    for key, val, vtype, sub in extra:
        w.add_key_value(key, val, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def tokenize_all(path, add_bos=False):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode(), add_bos=add_bos, special=True) for t in TEXTS], llm


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else default_model()
    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()

    ids, llm = tokenize_all(model)
    decoded = [llm.detokenize(i, special=True).decode("utf-8", errors="replace") for i in ids]
    del llm

    S = gguf.GGUFValueType
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, f"pre-{pre}.gguf")
            write_vocab_gguf(reader, path, arch, {"tokenizer.ggml.pre"}, [("tokenizer.ggml.pre", pre, S.STRING, None)])
            got, _ = tokenize_all(path)
            # Only the texts whose ids differ from the "smollm" ones are stored.
            variants[pre] = {str(k): v for k, (v, base) in enumerate(zip(got, ids)) if v != base}

        vocab = spm_vocab(tokens, types)
        path = os.path.join(tmp, "spm.gguf")
        skip = {k for k in reader.fields if k.startswith("tokenizer.")}
        extra = [
            ("tokenizer.ggml.model", "llama", S.STRING, None),
            ("tokenizer.ggml.tokens", [t for t, _, _ in vocab], S.ARRAY, S.STRING),
            ("tokenizer.ggml.scores", [s for _, s, _ in vocab], S.ARRAY, S.FLOAT32),
            ("tokenizer.ggml.token_type", [ty for _, _, ty in vocab], S.ARRAY, S.INT32),
            ("tokenizer.ggml.bos_token_id", 1, S.UINT32, None),
            ("tokenizer.ggml.eos_token_id", 2, S.UINT32, None),
            ("tokenizer.ggml.unknown_token_id", 0, S.UINT32, None),
        ]
        write_vocab_gguf(reader, path, arch, skip, extra)
        spm_ids, spm_llm = tokenize_all(path)
        spm_bos = [spm_llm.tokenize(t.encode(), add_bos=True, special=True) for t in TEXTS]
        spm_decoded = [spm_llm.detokenize(i, special=False).decode("utf-8", errors="replace") for i in spm_ids]
        del spm_llm

    out = {
        "command": COMMAND + " " + os.path.relpath(model, os.path.expanduser("~")).join(["~/", ""]),
        "generator": f"llama-cpp-python {llama_cpp.__version__}, gguf-py {getattr(gguf, '__version__', '?')}",
        "tokenize_call": "llm.tokenize(text.encode(), add_bos=False, special=True)",
        "model": "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
        "cases": [{"text": t, "ids": i, "llama_cpp_detokenize": d} for t, i, d in zip(TEXTS, ids, decoded)],
        "pre_variants": variants,
        "spm_vocab": {
            "rule": spm_vocab.__doc__.split("\n")[0] + " (see scripts/make_tokenizer_refs.py)",
            "first_n": SPM_FIRST_N,
            "specials": [[t, ty] for t, ty in SPM_SPECIALS],
            "size": len(vocab),
            "sample": [[i, vocab[i][0]] for i in range(0, len(vocab), max(1, len(vocab) // 20))],
        },
        "spm": [{"ids": i, "ids_add_bos": b, "llama_cpp_detokenize": d} for i, b, d in zip(spm_ids, spm_bos, spm_decoded)],
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(TEXTS)} texts, {len(variants)} pre variants, spm vocab {len(vocab)}")


if __name__ == "__main__":
    main()
