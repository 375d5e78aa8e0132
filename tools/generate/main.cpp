// loongforge-generate: load a model (a LoongForge checkpoint or an HF directory) and sample from
// it, score exact-match answers on a prompt/answer jsonl, or dump the logits of given token ids.
//   loongforge-generate --load DIR [--iteration N] --tokenizer-type T [--tokenizer-model M]
//       (--prompt TEXT | --eval-file eval.jsonl [--eval-limit N] | --input-ids 1,2,3)
//       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//       [--stop TEXT] [--no-kv-cache] [--bf16] [--dump-logits out.safetensors]
// Single process. Errors become one message on stderr and exit code 1 (2 for usage errors).
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/tokenizer.h"
#include "loongforge/models/generation.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/lora_io.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace {

struct Options {
  std::string load, tokenizer_type, tokenizer_model, prompt, eval_file, input_ids, dump_logits, lora_adapter;
  std::vector<std::string> stop;
  int64_t iteration = -1, eval_limit = 0;
  bool bf16 = false, no_kv_cache = false, verbose = false;
  lf::models::GenerateOptions gen;
};

struct Loaded {
  lf::models::DecoderConfig config;
  std::map<std::string, at::Tensor> tensors;
  std::string what;
  lf::models::LoraSpec lora;                   // a LoRA checkpoint's (or --lora-adapter's) settings
  std::map<std::string, at::Tensor> adapters;  // and its adapters, our names
};

// A LoongForge checkpoint directory or an HF model directory (config.json + safetensors).
Loaded load_model(const std::string& dir, int64_t iteration) {
  Loaded out;
  if (lf::models::hf::is_hf_model_dir(dir)) {
    lf::models::hf::ReadOptions ro;
    ro.dtype = at::kFloat;
    auto m = lf::models::hf::read_hf(dir, ro);
    out.config = m.config;
    for (auto& [name, t] : m.tensors) out.tensors[name] = t;
    out.what = "HF " + m.architecture + " model " + dir;
  } else {
    auto m = lf::train::read_model_checkpoint(dir, iteration);
    out.config = lf::models::hf::config_from_model_section(m.config_yaml, dir + " (checkpoint config)");
    out.what = "LoongForge checkpoint " + dir + " iteration " + std::to_string(m.iteration);
    const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
    if (const auto base = resolved ? lf::train::verified_checkpoint_base(*resolved) : std::nullopt) {
      // A LoRA checkpoint: the adapters here, the base weights where it says.
      out.lora = lf::models::lora_spec_from_job_yaml(m.config_yaml, *resolved + "/config.yaml");
      LF_CHECK(out.lora.enabled(), *resolved, " names a base but its config.yaml has no lora section");
      for (auto& [name, t] : m.tensors) out.adapters[name] = t;
      for (auto& [name, t] : lf::train::read_model_checkpoint(base->dir).tensors) out.tensors[name] = t;
      out.what += " (LoRA rank " + std::to_string(out.lora.rank) + " on " + base->dir + ")";
    } else {
      for (auto& [name, t] : m.tensors) out.tensors[name] = t;
    }
  }
  return out;
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      LF_CHECK(used == item.size(), "");
    } catch (const std::exception&) {
      LF_FAIL("--input-ids: '", item, "' is not an integer", lf::hint("write ids as 1,2,3"));
    }
  }
  LF_CHECK(!ids.empty(), "--input-ids is empty", lf::hint("write ids as 1,2,3"));
  return ids;
}

std::vector<int64_t> to64(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }
std::vector<int32_t> to32(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Full-sequence logits of `ids` -> `path`, tensor "logits" [tokens, vocab] float32.
void dump_logits(const lf::models::CausalLm& model, const std::vector<int64_t>& ids, const std::string& path) {
  at::NoGradGuard no_grad;
  at::Tensor logits = model.forward(at::tensor(ids, at::TensorOptions().dtype(at::kLong)).unsqueeze(0))
                          .select(1, 0)
                          .to(at::kCPU, at::kFloat)
                          .contiguous();  // [tokens, vocab]
  lf::safetensors::Writer w;
  w.add("logits", lf::safetensors::DType::F32, {logits.size(0), logits.size(1)}, logits.data_ptr());
  w.set_metadata("input_ids", [&] {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s;
  }());
  w.write(path);
  std::printf("logits [%lld, %lld] float32 -> %s\n", static_cast<long long>(logits.size(0)),
              static_cast<long long>(logits.size(1)), path.c_str());
}

int run(Options& o) {
  const int modes = !o.prompt.empty() + !o.eval_file.empty() + !o.input_ids.empty();
  LF_CHECK(modes == 1, "give exactly one of --prompt, --eval-file, --input-ids (got ", modes, ")");
  LF_CHECK(o.dump_logits.empty() || !o.input_ids.empty(), "--dump-logits needs --input-ids");
  std::unique_ptr<lf::data::Tokenizer> tok;
  if (!o.tokenizer_type.empty()) tok = lf::data::make_tokenizer(o.tokenizer_type, o.tokenizer_model);
  LF_CHECK(tok || !o.input_ids.empty(), "--prompt and --eval-file need --tokenizer-type",
           lf::hint("e.g. --tokenizer-type ByteTokenizer, or HuggingFaceTokenizer --tokenizer-model DIR"));

  const auto t0 = std::chrono::steady_clock::now();
  Loaded loaded = load_model(o.load, o.iteration);
  const auto& be = lf::backend::select_backend();
  lf::models::CausalLm model(loaded.config, be, 0, o.bf16 ? at::kBFloat16 : at::kFloat);
  model.load_full_parameters(loaded.tensors);
  loaded.tensors.clear();
  if (!o.lora_adapter.empty()) {
    LF_CHECK(!loaded.lora.enabled(), "--lora-adapter: ", o.load, " is a LoRA checkpoint with adapters of its own",
             lf::hint("give the base model as --load"));
    auto adapter = lf::models::read_peft_adapter(o.lora_adapter, loaded.config);
    loaded.lora = adapter.spec;
    for (auto& [name, t] : adapter.tensors) loaded.adapters[name] = t;
    loaded.what += " + PEFT adapter " + o.lora_adapter + " (rank " + std::to_string(adapter.spec.rank) + ")";
  }
  if (loaded.lora.enabled()) {
    model.add_lora(loaded.lora, 0);
    model.load_full_lora(loaded.adapters);
    loaded.adapters.clear();
  }
  model.set_training(false);
  LF_INFO("loaded ", loaded.what, " (", loaded.config.num_parameters(), " parameters, ", be.name(), ", ",
          o.bf16 ? "bf16" : "fp32", ") in ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
  if (tok) {
    LF_CHECK(tok->vocab_size() <= loaded.config.vocab_size, "the tokenizer has ", tok->vocab_size(),
             " ids, the model's vocabulary only ", loaded.config.vocab_size,
             lf::hint("use the tokenizer the model was trained with"));
    if (auto eod = tok->eod_id()) o.gen.stop_ids.push_back(*eod);
    for (const auto& s : o.stop) {
      auto ids = tok->encode(s);
      LF_CHECK(ids.size() == 1, "--stop '", s, "' is ", ids.size(), " tokens; stop strings must be one token");
      o.gen.stop_ids.push_back(ids[0]);
    }
  }
  o.gen.use_kv_cache = !o.no_kv_cache;

  if (!o.input_ids.empty()) {
    const auto ids = parse_ids(o.input_ids);
    if (!o.dump_logits.empty()) {
      dump_logits(model, ids, o.dump_logits);
      return 0;
    }
    const auto out = lf::models::generate(model, ids, o.gen);
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(out[i]));
    std::printf("\n");
    if (tok) std::printf("%s\n", tok->decode(to32(out)).c_str());
    return 0;
  }
  if (!o.prompt.empty()) {
    const auto start = std::chrono::steady_clock::now();
    const auto out = lf::models::generate(model, to64(tok->encode(o.prompt)), o.gen);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s%s\n", o.prompt.c_str(), tok->decode(to32(out)).c_str());
    LF_INFO(out.size(), " tokens in ", secs, " s (", out.size() / std::max(secs, 1e-9), " tokens/s)");
    return 0;
  }
  // --eval-file: {"prompt": ..., "answer": ...} per line; exact match of the completion.
  std::ifstream in(o.eval_file);
  LF_CHECK(in.good(), "cannot open --eval-file ", o.eval_file);
  int64_t n = 0, correct = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    if (o.eval_limit > 0 && n >= o.eval_limit) break;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      LF_FAIL(o.eval_file, ":", line_no, ": not JSON: ", e.what());
    }
    LF_CHECK(j.contains("prompt") && j["prompt"].is_string() && j.contains("answer") && j["answer"].is_string(),
             o.eval_file, ":", line_no, ": needs string fields \"prompt\" and \"answer\"");
    const std::string prompt = j["prompt"], answer = j["answer"];
    const std::string got = tok->decode(to32(lf::models::generate(model, to64(tok->encode(prompt)), o.gen)));
    const bool ok = got == answer;
    correct += ok;
    ++n;
    if (o.verbose) std::printf("%s%s %s (want %s)\n", prompt.c_str(), got.c_str(), ok ? "ok" : "wrong", answer.c_str());
  }
  LF_CHECK(n > 0, o.eval_file, " has no problems");
  std::printf("exact match: %lld/%lld = %.3f\n", static_cast<long long>(correct), static_cast<long long>(n),
              static_cast<double>(correct) / static_cast<double>(n));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"loongforge-generate: sample from a LoongForge checkpoint or an HF model"};
  app.add_option("--load", o.load, "Checkpoint directory (LoongForge or HF)")->required();
  app.add_option("--iteration", o.iteration, "Checkpoint iteration (default: the latest)");
  app.add_option("--lora-adapter", o.lora_adapter,
                 "A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to --load");
  app.add_option("--tokenizer-type", o.tokenizer_type, "ByteTokenizer or HuggingFaceTokenizer");
  app.add_option("--tokenizer-model", o.tokenizer_model, "tokenizer.json or its directory");
  app.add_option("--prompt", o.prompt, "Text to continue");
  app.add_option("--eval-file", o.eval_file, "jsonl with prompt/answer: exact-match accuracy");
  app.add_option("--eval-limit", o.eval_limit, "Score at most this many problems (0: all)");
  app.add_option("--input-ids", o.input_ids, "Token ids to continue, e.g. 1,2,3");
  app.add_option("--dump-logits", o.dump_logits, "With --input-ids: write their logits (safetensors)");
  app.add_option("--max-new-tokens", o.gen.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  app.add_option("--temperature", o.gen.sampling.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-k", o.gen.sampling.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  app.add_option("--top-p", o.gen.sampling.top_p, "Nucleus mass (1: off)")->capture_default_str();
  app.add_option("--seed", o.gen.seed, "Sampling seed")->capture_default_str();
  app.add_option("--stop", o.stop, "Stop after this one-token string (repeatable; EOD always stops)");
  app.add_flag("--no-kv-cache", o.no_kv_cache, "Recompute the whole prefix every step (a check)");
  app.add_flag("--bf16", o.bf16, "bf16 weights and compute");
  app.add_flag("--verbose", o.verbose, "With --eval-file: print every problem");
  lf::log::init(lf::log::options_from_env(-1, 1));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(o);
  } catch (const lf::Error& e) {
    lf::log::flush();
    std::cerr << "loongforge-generate: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    lf::log::flush();
    std::cerr << "loongforge-generate: error: " << e.what() << "\n";
    return 1;
  }
}
