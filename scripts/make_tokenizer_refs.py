#!/usr/bin/env python3
"""Reference token ids from llama.cpp for the tokenizer tests.

Writes tests/data/tokenizer/smollm2_tokens.json with, for every text below, the ids
llama.cpp (through llama-cpp-python) gives with
`llm.tokenize(text.encode(), add_bos=False, special=True)`:

* `ids`: the SmolLM2 GGUF as it is (byte-level BPE, pre-tokenizer "smollm");
* `pre_variants[name]`: the same vocabulary with `tokenizer.ggml.pre` set to another
  llama.cpp pre-tokenizer name (a vocab-only copy of the GGUF is written for each), so
  every supported regex set is checked against llama.cpp; stored as
  {text index: ids} for the texts whose ids differ from `ids` (indices past the
  fixed texts refer to `fuzz`);
* `fuzz`: seeded random strings over tricky characters, with their ids;
* `spm`: a SentencePiece ("llama") vocabulary derived from SmolLM2's by the rule in
  `spm_vocab` (the Rust test rebuilds it the same way), with and without BOS.

It also renders the chat templates in tests/data/tokenizer/templates/ (plus SmolLM2's,
taken from the GGUF) with Python jinja2 set up as transformers does
(`_compile_jinja_template`: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False, ...), raise_exception,
strftime_now) into tests/data/tokenizer/chat_template_refs.json. Differences from
transformers: `tools` is passed only when given (transformers passes tools=None), and
for templates that cannot read list-form content the text parts are joined with
newlines first (`flattened`), as the Rust side does.

Usage: python3 scripts/make_tokenizer_refs.py [--only tokens|templates] [model.gguf]
The model defaults to $SHARDLM_CACHE/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf with
SHARDLM_CACHE defaulting to ~/.cache/shardlm. Needs `pip install llama-cpp-python gguf
jinja2`.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import tempfile

import gguf

COMMAND = "python3 scripts/make_tokenizer_refs.py"
DATA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizer"))
OUT = os.path.join(DATA, "smollm2_tokens.json")
TEMPLATE_OUT = os.path.join(DATA, "chat_template_refs.json")

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

# Random strings over characters that stress the pre-tokenizer regexes (Unicode
# categories, whitespace kinds, apostrophes, marks, digits of other scripts).
FUZZ_SEED = 1234
FUZZ_COUNT = 40
FUZZ_POOL = (
    list("aZ09 .,;:!?'\"-_/\\()[]{}<>@#$%^&*+=|~`")
    + ["'s", "'LL", "’t", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u2009", "\u3000", "\u0085", "\u200b"]
    + ["é", "ß", "Ä", "ǅ", "中文", "か", "ア", "한", "Ж", "Ω", "𝔘", "e\u0301", "क्ष", "ا", "١٢", "Ⅻ", "½", "²", "٣"]
    + ["😀", "👍🏽", "👨\u200d👩", "\u2014", "\u2026", "«", "€", "™", "\ufeff", "123", "4567", "<|im_start|>", "<|im_end|>"]
)


def fuzz_texts():
    import random

    rng = random.Random(FUZZ_SEED)
    return ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(3, 25))) for _ in range(FUZZ_COUNT)]


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
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode(), add_bos=add_bos, special=True) for t in TEXTS + fuzz_texts()], llm


def dump_compact(obj):
    """Indented JSON with every list of integers on one line."""
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)
    assert json.loads(text) == obj
    return text + "\n"


def make_tokens(model):
    import llama_cpp

    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()

    ids, llm = tokenize_all(model)
    fuzz = fuzz_texts()
    ids, fuzz_ids = ids[: len(TEXTS)], ids[len(TEXTS) :]
    decoded = [llm.detokenize(i, special=True).decode("utf-8", errors="replace") for i in ids]
    del llm

    S = gguf.GGUFValueType
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, f"pre-{pre}.gguf")
            write_vocab_gguf(reader, path, arch, {"tokenizer.ggml.pre"}, [("tokenizer.ggml.pre", pre, S.STRING, None)])
            got, _ = tokenize_all(path)
            # Only the texts whose ids differ from the "smollm" ones are stored
            # (indices past the fixed texts are the fuzz texts).
            variants[pre] = {str(k): v for k, (v, base) in enumerate(zip(got, ids + fuzz_ids)) if v != base}

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
        spm_ids = spm_ids[: len(TEXTS)]
        spm_bos = [spm_llm.tokenize(t.encode(), add_bos=True, special=True) for t in TEXTS]
        spm_decoded = [spm_llm.detokenize(i, special=False).decode("utf-8", errors="replace") for i in spm_ids]
        del spm_llm

    out = {
        "command": COMMAND + " --only tokens " + os.path.relpath(model, os.path.expanduser("~")).join(["~/", ""]),
        "generator": f"llama-cpp-python {llama_cpp.__version__}, gguf-py {importlib.metadata.version('gguf')}",
        "tokenize_call": "llm.tokenize(text.encode(), add_bos=False, special=True)",
        "model": "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
        "cases": [{"text": t, "ids": i, "llama_cpp_detokenize": d} for t, i, d in zip(TEXTS, ids, decoded)],
        "fuzz": {"seed": FUZZ_SEED, "cases": [{"text": t, "ids": i} for t, i in zip(fuzz, fuzz_ids)]},
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
        f.write(dump_compact(out))
    print(f"wrote {os.path.normpath(OUT)}: {len(TEXTS)} texts, {len(variants)} pre variants, spm vocab {len(vocab)}")


# ---------------------------------------------------------------------------------
# Chat templates

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the <b>current</b> weather & more for a city (°C)",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": 'City name, e.g. "Zürich" or \'東京\''},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Web search\nreturns\ttop hits",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "top_k": {"type": "integer", "default": 5, "maximum": 12345678901234567890},
                "threshold": {"type": "number", "default": 0.5, "minimum": 1e-06},
                "lang": {"type": ["string", "null"], "default": None},
            },
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

CONVERSATIONS = {
    "basic": [
        {"role": "system", "content": "You are a pirate.  "},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Arr, hello matey!"},
        {"role": "user", "content": "  What's the weather like? 🌧  "},
    ],
    "no_system": [{"role": "user", "content": "Hi there"}],
    "tool_calls": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21.5, "sky": "<clear>"}'},
        {"role": "assistant", "content": "It is 21.5 °C & clear."},
        {"role": "user", "content": "Thanks!"},
    ],
    "two_tool_results": [
        {"role": "user", "content": "Search twice"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": "a", "top_k": 2}}},
                {"type": "function", "function": {"name": "search", "arguments": '{"query": "b"}'}},
            ],
        },
        {"role": "tool", "content": "result a"},
        {"role": "tool", "content": "result b"},
    ],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"},
    ],
    "typed": [
        {"role": "system", "content": "Look closely."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe"},
                {"type": "image", "image": "cat.png"},
                {"type": "text", "text": "this picture."},
            ],
        },
    ],
    "not_alternating": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "bad_role": [{"role": "user", "content": "one"}, {"role": "tool", "content": "two"}],
}

# (template, conversation, tools, add_generation_prompt, extra)
TEMPLATE_CASES = [
    ("smollm2", "basic", False, True, None),
    ("smollm2", "no_system", False, True, None),
    ("smollm2", "no_system", False, False, None),
    ("smollm2", "typed", False, True, None),
    ("qwen2_5", "basic", False, True, None),
    ("qwen2_5", "no_system", True, True, None),
    ("qwen2_5", "tool_calls", True, True, None),
    ("qwen2_5", "two_tool_results", True, False, None),
    ("qwen2_5", "typed", False, True, None),
    ("qwen3", "basic", False, True, None),
    ("qwen3", "tool_calls", True, True, None),
    ("qwen3", "two_tool_results", True, True, None),
    ("qwen3", "thinking", False, False, None),
    ("qwen3", "thinking", False, True, {"enable_thinking": False}),
    ("qwen3", "typed", False, True, None),
    ("llama3_1", "basic", False, True, None),
    ("llama3_1", "tool_calls", True, True, None),
    ("llama3_1", "tool_calls", True, False, {"tools_in_user_message": False, "date_string": "01 Jan 2025"}),
    ("llama3_1", "two_tool_results", True, True, None),
    ("llama3_1", "no_system", False, False, None),
    ("mistral_like", "basic", False, False, None),
    ("mistral_like", "no_system", False, True, {"metadata": {"_hidden": 0, "a": 1, "b": "two", "stop": True, "c": 3}}),
    ("mistral_like", "not_alternating", False, True, None),
    ("mistral_like", "bad_role", False, True, None),
    ("zephyr", "basic", False, True, None),
    ("zephyr", "no_system", False, False, None),
    ("typed_content", "typed", False, True, None),
    ("typed_content", "basic", False, False, None),
    ("tojson_options", "no_system", True, False, {"numbers": [1, 2.5, 1e20, 0.1, -3, 1.0, 12345678901234567890, 1e-07]}),
]

BOS, EOS = "<s>", "</s>"
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)


def template_env(strftime_calls):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        out = FIXED_NOW.strftime(format)
        strftime_calls.append([format, out])
        return out

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def flatten(messages):
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"] if p.get("type", "text") == "text")
        out.append(m)
    return out


def make_templates(model):
    import jinja2

    sources = {}
    for name in sorted(os.listdir(os.path.join(DATA, "templates"))):
        if name.endswith(".jinja"):
            with open(os.path.join(DATA, "templates", name), encoding="utf-8") as f:
                sources[name[: -len(".jinja")]] = f.read()
    reader = gguf.GGUFReader(model)
    sources["smollm2"] = reader.fields["tokenizer.chat_template"].contents()

    cases = []
    for tmpl, conv, with_tools, agp, extra in TEMPLATE_CASES:
        messages = CONVERSATIONS[conv]
        calls = []
        env = template_env(calls)
        compiled = env.from_string(sources[tmpl])
        kwargs = dict(extra or {})
        if with_tools:
            kwargs["tools"] = TOOLS
        typed = any(isinstance(m.get("content"), list) for m in messages)
        # Like the Rust side: a template that does not print a probe text part
        # gets flattened content.
        probe = [{"role": "user", "content": [{"type": "text", "text": "PROBE-7d1c4e2a"}]}]
        try:
            out = template_env([]).from_string(sources[tmpl]).render(messages=probe, add_generation_prompt=True, bos_token=BOS, eos_token=EOS)
            handles_parts = "PROBE-7d1c4e2a" in out and '"text"' not in out and "'text'" not in out
        except Exception:
            handles_parts = False
        used = messages if handles_parts else flatten(messages)
        case = {
            "template": tmpl,
            "conversation": conv,
            "messages": messages,
            "tools": TOOLS if with_tools else None,
            "add_generation_prompt": agp,
            "extra": extra,
            "flattened": typed and not handles_parts,
        }
        try:
            case["expected"] = compiled.render(messages=used, add_generation_prompt=agp, bos_token=BOS, eos_token=EOS, **kwargs)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        case["strftime_calls"] = calls
        cases.append(case)

    out = {
        "command": COMMAND + " --only templates",
        "generator": f"jinja2 {jinja2.__version__} (transformers-style environment, see the script)",
        "bos_token": BOS,
        "eos_token": EOS,
        "fixed_now": FIXED_NOW.isoformat(),
        "smollm2_template": sources["smollm2"],
        "cases": cases,
    }
    with open(TEMPLATE_OUT, "w", encoding="utf-8") as f:
        f.write(dump_compact(out))
    print(f"wrote {TEMPLATE_OUT}: {len(cases)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["tokens", "templates"])
    ap.add_argument("model", nargs="?", default=default_model())
    args = ap.parse_args()
    if args.only in (None, "tokens"):
        make_tokens(args.model)
    if args.only in (None, "templates"):
        make_templates(args.model)


if __name__ == "__main__":
    main()
