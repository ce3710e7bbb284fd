// Teacher-forced logits from llama.cpp itself (libllama), for comparing with shardlm.
//
// Decodes the given token ids in one batch from position 0 with logits requested
// for every position, and writes them as raw little-endian f32, row-major
// [n_tokens, n_vocab], to OUT. Nothing is sampled; no BOS is added.
//
// Build (scripts/lowbit-llamacpp.sh does this) against a llama.cpp build:
//   c++ -O2 -std=c++17 -I$SRC/include -I$SRC/ggml/include llamacpp_logits.cpp \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o llamacpp-logits
// Usage: llamacpp-logits MODEL.gguf ID,ID,... OUT.f32 [THREADS [KV_TYPE [FLASH_ATTN]]]
// KV_TYPE: f16 (llama.cpp's default) or f32, the K and V cache element type.
// FLASH_ATTN: auto (the default) or off. The CPU flash-attention kernel keeps
// f16 intermediates even over an f32 cache, so f32 + off is the setting that
// compares with an f32 reference.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf ID,ID,... OUT.f32 [THREADS [f16|f32 [auto|off]]]\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> ids;
    std::stringstream list(argv[2]);
    for (std::string item; std::getline(list, item, ',');) {
        ids.push_back((llama_token) std::stol(item));
    }
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    const std::string kv_type = argc > 5 ? argv[5] : "f16";
    if (kv_type != "f16" && kv_type != "f32") {
        fprintf(stderr, "llamacpp-logits: KV_TYPE must be f16 or f32, not %s\n", kv_type.c_str());
        return 2;
    }
    const std::string flash_attn = argc > 6 ? argv[6] : "auto";
    if (flash_attn != "auto" && flash_attn != "off") {
        fprintf(stderr, "llamacpp-logits: FLASH_ATTN must be auto or off, not %s\n", flash_attn.c_str());
        return 2;
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.progress_callback = [](float, void *) { return true; };  // no progress dots
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp-logits: cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) ids.size() + 16;
    cp.n_batch = (uint32_t) ids.size();
    cp.n_ubatch = (uint32_t) ids.size();
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    if (kv_type == "f32") {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    }
    if (flash_attn == "off") {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp-logits: cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // One batch, one sequence, logits at every position (teacher forcing).
    llama_batch batch = llama_batch_init((int32_t) ids.size(), 0, 1);
    for (size_t i = 0; i < ids.size(); i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = (llama_pos) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = (int32_t) ids.size();
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llamacpp-logits: llama_decode failed\n");
        return 1;
    }
    FILE * out = fopen(argv[3], "wb");
    if (!out) {
        fprintf(stderr, "llamacpp-logits: cannot write %s\n", argv[3]);
        return 1;
    }
    for (size_t i = 0; i < ids.size(); i++) {
        const float * row = llama_get_logits_ith(ctx, (int32_t) i);
        fwrite(row, sizeof(float), (size_t) n_vocab, out);
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
