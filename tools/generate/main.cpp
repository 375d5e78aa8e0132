// loongforge-generate: load a model (a LoongForge checkpoint or an HF directory) and sample from
// it, score exact-match answers on a prompt/answer jsonl, or dump the logits of given token ids;
// sample latents (frames, an animated GIF) from a Wan diffusion transformer (sample.h), or run one
// forward of it on given tensors (denoise.h).
//   loongforge-generate --load DIR [--iteration N] --tokenizer-type T [--tokenizer-model M]
//       (--prompt TEXT | --eval-file eval.jsonl [--eval-limit N] | --input-ids 1,2,3)
//       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//       [--stop TEXT] [--no-kv-cache] [--bf16] [--dump-logits out.safetensors]
//       [--image FILE ... | --vision-inputs FILE.safetensors]   (a vision-language model: qwen2_5_vl)
//   loongforge-generate --load DIR --denoise-inputs FILE.safetensors --dump-prediction OUT.safetensors
//       (a Wan diffusion transformer: diffusers directory or flow_matching checkpoint; one forward)
//   loongforge-generate --load DIR [--use-ema] (--prompt TEXT --text-table FILE [--negative-prompt TEXT]
//       | --text-embeddings FILE.safetensors) --latent-shape F,H,W --output-dir DIR [--first-frame FILE]
//       [--load-low-noise DIR --boundary-ratio R [--guidance-scale-low G]]
//       [--num-inference-steps 50] [--guidance-scale 5] [--sample-shift 5] [--seed S] [--num-samples K]
//       [--fps 8] [--bf16]   (a Wan diffusion transformer: Euler flow-matching sampling, sample.h)
//   loongforge-generate --load DIR --policy-inputs FILE.safetensors [--dump-loss OUT] [--dump-actions OUT]
//       [--num-inference-steps N]
//       (a pi05 policy: LeRobot directory or pi05 checkpoint; PI05Pytorch's loss / sampled actions, policy.h)
// Single process. Errors become one message on stderr and exit code 1 (2 for usage errors).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/chat_template.h"
#include "loongforge/data/multimodal.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/tokenizer.h"
#include "loongforge/media/image.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/generation.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/hf_vlm.h"
#include "loongforge/models/lora_io.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"
#include "denoise.h"
#include "policy.h"
#include "sample.h"
#include "vlm_tensors.h"

namespace {

struct Options {
  std::string load, tokenizer_type, tokenizer_model, prompt, eval_file, input_ids, dump_logits, lora_adapter;
  std::vector<std::string> stop, images;
  std::string vision_inputs;
  std::string denoise_inputs, dump_prediction;  // a Wan model (denoise.h)
  lf::tools::generate::SampleOptions sample;    // a Wan model's sampling (sample.h)
  lf::tools::generate::PolicyOptions policy;    // a pi05 policy (policy.h)
  int64_t iteration = -1, eval_limit = 0;
  bool bf16 = false, no_kv_cache = false, verbose = false, add_special_tokens = false;
  lf::models::GenerateOptions gen;
  std::vector<std::string> given;  // the options on the command line, by their long names
};

struct Loaded {
  lf::models::DecoderConfig config;
  std::map<std::string, at::Tensor> tensors;
  std::string what;
  lf::models::LoraSpec lora;                   // a LoRA checkpoint's (or --lora-adapter's) settings
  std::map<std::string, at::Tensor> adapters;  // and its adapters, our names
  std::optional<lf::models::hf::VlmConfig> vlm;  // a vision-language model (config = its foundation)
};

// A LoongForge checkpoint directory or an HF model directory (config.json + safetensors).
Loaded load_model(const std::string& dir, int64_t iteration) {
  Loaded out;
  if (lf::models::hf::is_vlm_hf_dir(dir)) {
    lf::models::hf::ReadOptions ro;
    ro.dtype = at::kFloat;
    auto m = lf::models::hf::read_vlm_hf(dir, ro);
    out.vlm = m.config;
    out.config = m.config.foundation;
    for (auto& [name, t] : m.tensors) out.tensors[name] = t;
    out.what = "HF " + m.architecture + " model " + dir;
  } else if (lf::models::hf::is_hf_model_dir(dir)) {
    lf::models::hf::ReadOptions ro;
    ro.dtype = at::kFloat;
    auto m = lf::models::hf::read_hf(dir, ro);
    out.config = m.config;
    for (auto& [name, t] : m.tensors) out.tensors[name] = t;
    out.what = "HF " + m.architecture + " model " + dir;
  } else {
    auto m = lf::train::read_model_checkpoint(dir, iteration);
    out.vlm = lf::models::hf::vlm_config_from_model_section(m.config_yaml, dir + " (checkpoint config)");
    out.config = out.vlm ? out.vlm->foundation
                         : lf::models::hf::config_from_model_section(m.config_yaml, dir + " (checkpoint config)");
    out.what = "LoongForge checkpoint " + dir + " iteration " + std::to_string(m.iteration);
    const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
    if (const auto base = resolved ? lf::train::verified_checkpoint_base(*resolved) : std::nullopt) {
      // A LoRA checkpoint: the adapters here, the base weights where it says.
      out.lora = lf::models::lora_spec_from_job_yaml(m.config_yaml, *resolved + "/config.yaml");
      LF_CHECK(out.lora.enabled(), *resolved, " names a base but its config.yaml has no lora section");
      LF_CHECK(!out.vlm, dir, ": LoRA adapters are built for causal_lm models, not ", out.vlm->type);
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

// The ids of a --prompt / --eval-file prompt: the tokenizer's, and with --add-special-tokens inside
// its post-processor's template, as HF's tokenizer(text) (add_special_tokens=True) gives them:
// LLaMA-3's <|begin_of_text|>, Gemma's <bos>.
std::vector<int64_t> prompt_ids(lf::data::Tokenizer& tok, const std::string& text, bool special) {
  if (!special) return to64(tok.encode(text));
  auto* hf = dynamic_cast<lf::data::HfBpeTokenizer*>(&tok);
  LF_CHECK(hf != nullptr, "--add-special-tokens needs --tokenizer-type HuggingFaceTokenizer (", tok.describe(),
           " has no post-processor)", lf::hint("drop --add-special-tokens"));
  return to64(hf->encode_with_special_tokens(text));
}

std::vector<int32_t> to32(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// logits [tokens, vocab] of `ids` -> `path`, tensor "logits" float32.
void write_logits(at::Tensor logits, const std::vector<int64_t>& ids, const std::string& path) {
  logits = logits.to(at::kCPU, at::kFloat).contiguous();
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

// Full-sequence logits of `ids` -> `path`.
void dump_logits(const lf::models::CausalLm& model, const std::vector<int64_t>& ids, const std::string& path) {
  at::NoGradGuard no_grad;
  write_logits(model.forward(at::tensor(ids, at::TensorOptions().dtype(at::kLong)).unsqueeze(0)).select(1, 0), ids,
               path);
}

// --- vision-language models ---------------------------------------------------------------------

namespace fs = std::filesystem;
using lf::models::Qwen25VlMedia;
using nlohmann::json;

// The image preprocessing of --load: its preprocessor_config.json (transformers'
// Qwen2VLImageProcessor fields) when present, else the defaults; the tower's patch, merge and
// temporal sizes must agree with it.
lf::media::QwenVisionPreprocess preprocess_of(const std::string& dir, const lf::models::Qwen25VisionConfig& v) {
  lf::media::QwenVisionPreprocess p;
  p.patch_size = v.patch_size;
  p.merge_size = v.spatial_merge_size;
  p.temporal_patch_size = v.temporal_patch_size;
  const fs::path file = fs::path(dir) / "preprocessor_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return p;
  p = lf::media::read_preprocessor_config(file.string(), p);
  LF_CHECK(p.patch_size == v.patch_size && p.merge_size == v.spatial_merge_size &&
               p.temporal_patch_size == v.temporal_patch_size,
           file.string(), ": patch_size ", p.patch_size, ", merge_size ", p.merge_size, ", temporal_patch_size ",
           p.temporal_patch_size, " differ from the vision tower's ", v.patch_size, ", ", v.spatial_merge_size, ", ",
           v.temporal_patch_size);
  return p;
}

// --image files -> pixel_values (their rows, in order) and image_grid_thw.
Qwen25VlMedia media_of_images(const std::vector<std::string>& files, const lf::media::QwenVisionPreprocess& p) {
  std::vector<at::Tensor> rows;
  std::vector<int64_t> grids;
  for (const auto& f : files) {
    lf::media::Image image;
    try {
      image = lf::media::decode_image(f);
    } catch (const lf::Error& e) {
      LF_FAIL("--image ", f, ": ", e.message(), lf::hint(e.hint()));
    }
    auto patches = lf::media::qwen_image_patches(image, p);
    rows.push_back(patches.pixel_values);
    grids.insert(grids.end(), patches.grid.begin(), patches.grid.end());
  }
  Qwen25VlMedia m;
  m.pixel_values = at::cat(rows);
  m.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
  return m;
}

// --vision-inputs: the tensors transformers' processor returns (pixel_values + image_grid_thw,
// pixel_values_videos + video_grid_thw, second_per_grid_ts); its input_ids / attention_mask /
// mm_token_type_ids are ignored (--input-ids gives the ids).
Qwen25VlMedia media_of_file(const std::string& file, const lf::models::Qwen25VisionConfig& v) {
  const auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> t;
  for (const auto& info : r.tensors()) {
    static const std::set<std::string> ignored{"input_ids", "attention_mask", "mm_token_type_ids"};
    if (ignored.count(info.name)) continue;
    static const std::set<std::string> known{"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                                             "second_per_grid_ts"};
    LF_CHECK(known.count(info.name), "--vision-inputs ", file, ": unknown tensor '", info.name, "'",
             lf::hint("pixel_values + image_grid_thw, pixel_values_videos + video_grid_thw, second_per_grid_ts"));
    t[info.name] = lf::tools::generate::tensor_of(r, info);
  }
  Qwen25VlMedia m;
  for (const auto& [pix, grid, out_pix, out_grid] :
       {std::tuple<const char*, const char*, at::Tensor*, at::Tensor*>{"pixel_values", "image_grid_thw", &m.pixel_values,
                                                                       &m.image_grid_thw},
        {"pixel_values_videos", "video_grid_thw", &m.pixel_values_videos, &m.video_grid_thw}}) {
    LF_CHECK(t.count(pix) == t.count(grid), "--vision-inputs ", file, ": ", t.count(pix) ? pix : grid, " without ",
             t.count(pix) ? grid : pix);
    if (!t.count(pix)) continue;
    const at::Tensor g = t[grid].to(at::kLong);
    const at::Tensor x = t[pix].to(at::kFloat);
    LF_CHECK(g.dim() == 2 && g.size(1) == 3, "--vision-inputs ", file, ": ", grid, " must be [n, 3], got ", g.sizes());
    LF_CHECK(x.dim() == 2 && x.size(1) == v.patch_dim(), "--vision-inputs ", file, ": ", pix, " must be [patches, ",
             v.patch_dim(), "] (C T P P of the vision tower), got ", x.sizes());
    const int64_t rows = (g.select(1, 0) * g.select(1, 1) * g.select(1, 2)).sum().item<int64_t>();
    LF_CHECK(rows == x.size(0), "--vision-inputs ", file, ": ", grid, " makes ", rows, " patches, ", pix, " holds ",
             x.size(0));
    *out_pix = x;
    *out_grid = g;
  }
  if (t.count("second_per_grid_ts")) {
    LF_CHECK(m.video_grid_thw.defined(), "--vision-inputs ", file, ": second_per_grid_ts without videos");
    const at::Tensor s = t["second_per_grid_ts"].to(at::kDouble).contiguous().reshape({-1});
    LF_CHECK(s.numel() == m.video_grid_thw.size(0), "--vision-inputs ", file, ": second_per_grid_ts holds ", s.numel(),
             " values for ", m.video_grid_thw.size(0), " videos");
    m.second_per_grid_ts.assign(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
  }
  LF_CHECK(m.pixel_values.defined() || m.pixel_values_videos.defined(), "--vision-inputs ", file,
           " holds neither pixel_values nor pixel_values_videos");
  return m;
}

// The placeholders of `ids` against the media's grids: one clear error naming the flags.
void check_placeholders(const std::vector<int64_t>& ids, const Qwen25VlMedia& m, const lf::models::hf::VlmConfig& c,
                        const std::string& media_flag) {
  const int64_t merge = c.vision.spatial_merge_size;
  for (const auto& [what, token, grid] :
       {std::tuple<const char*, int64_t, const at::Tensor*>{"image", c.own.image_token_id, &m.image_grid_thw},
        {"video", c.own.video_token_id, &m.video_grid_thw}}) {
    const int64_t have = std::count(ids.begin(), ids.end(), token);
    int64_t want = 0;
    std::string grids;
    if (grid->defined())
      for (int64_t i = 0; i < grid->size(0); ++i) {
        const auto g = (*grid)[i];
        const int64_t t = g[0].item<int64_t>(), h = g[1].item<int64_t>(), w = g[2].item<int64_t>();
        want += t * h * w / (merge * merge);
        grids += lf::str(i ? ", " : "", "(", t, ", ", h, ", ", w, ")");
      }
    LF_CHECK(have == want, "the ids hold ", have, " ", what, " placeholders (token ", token, ") but ",
             media_flag.empty() ? std::string("no media were given")
                                : media_flag + " give" + (grids.empty() ? " no " + std::string(what) + "s"
                                                                        : " " + std::string(what) + " grids " + grids +
                                                                              " (t, h, w in patches), " +
                                                                              std::to_string(want) + " placeholders"),
             lf::hint("each " + std::string(what) + " takes t h w / " + std::to_string(merge * merge) +
                      " consecutive placeholder tokens in the ids, in order"));
  }
}

// A vision-language model: logits of the ids with the media, or generation that recomputes the
// whole sequence (and its M-RoPE positions) each step.
// qwen3_vl and internvl: the processor's tensors (vlm_tensors.h).
int run_tensor_vlm(Options& o, Loaded& loaded, lf::data::Tokenizer* tok) {
  const auto& v = *loaded.vlm;
  for (const auto& [flag, given] : {std::pair<const char*, bool>{"--image", !o.images.empty()},
                                    {"--eval-file", !o.eval_file.empty()}, {"--lora-adapter", !o.lora_adapter.empty()}})
    LF_CHECK(!given, flag, " is built for qwen2_5_vl models; a ", v.type, " model takes its processor's tensors",
             lf::hint("give --vision-inputs FILE.safetensors (the processor's pixel_values ...) with --input-ids"));
  lf::tools::generate::TensorVlm model(v, loaded.tensors, o.bf16, o.vision_inputs);
  const auto ids = !o.input_ids.empty() ? parse_ids(o.input_ids) : prompt_ids(*tok, o.prompt, o.add_special_tokens);
  for (int64_t id : ids)
    LF_CHECK(id >= 0 && id < v.foundation.vocab_size, "token ", id, " is outside the vocabulary [0, ",
             v.foundation.vocab_size, ")");
  if (!o.dump_logits.empty()) {
    write_logits(model.logits(ids), ids, o.dump_logits);
    return 0;
  }
  const auto out = model.continue_ids(ids, o.gen);
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(out[i]));
  std::printf("\n");
  if (tok) std::printf("%s\n", tok->decode(to32(out)).c_str());
  return 0;
}

int run_vlm(Options& o, Loaded& loaded, lf::data::Tokenizer* tok) {
  const auto& v = *loaded.vlm;
  if (v.type != "qwen2_5_vl") return run_tensor_vlm(o, loaded, tok);
  LF_CHECK(o.lora_adapter.empty(), "--lora-adapter: LoRA adapters are built for causal_lm models, not ", v.type);
  const auto t0 = std::chrono::steady_clock::now();
  const auto& be = lf::backend::select_backend();
  lf::models::Qwen25Vl model(v.foundation, v.vision, v.own, be, 0, o.bf16 ? at::kBFloat16 : at::kFloat, nullptr, false,
                             lf::models::PipelineStage{});
  lf::models::hf::load_full_vlm(model, loaded.tensors);
  loaded.tensors.clear();
  model.set_training(false);
  LF_INFO("loaded ", loaded.what, " (", v.type, ", ", be.name(), ", ", o.bf16 ? "bf16" : "fp32", ") in ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
  at::NoGradGuard no_grad_all;
  const auto opts = at::TensorOptions().dtype(at::kLong);
  // Greedy or sampled continuation of `seq` with `media`, the whole sequence recomputed per token.
  const auto continue_ids = [&](std::vector<int64_t> seq, const Qwen25VlMedia& media, at::Generator& gen) {
    std::vector<int64_t> out;
    while (static_cast<int64_t>(out.size()) < o.gen.max_new_tokens &&
           static_cast<int64_t>(seq.size()) < v.foundation.max_position_embeddings) {
      const at::Tensor logits = model.logits(at::tensor(seq, opts).unsqueeze(0), media);  // [s, 1, vocab]
      const int64_t token = lf::models::sample_token(logits[-1][0], o.gen.sampling, gen);
      if (std::find(o.gen.stop_ids.begin(), o.gen.stop_ids.end(), token) != o.gen.stop_ids.end()) break;
      if (token == v.own.image_token_id || token == v.own.video_token_id) {
        LF_WARN("the model produced the placeholder token ", token, "; generation stops (a placeholder needs a medium)");
        break;
      }
      out.push_back(token);
      seq.push_back(token);
    }
    return out;
  };
  if (!o.eval_file.empty()) {
    // --eval-file for a VLM: {"messages": [...], "images": [...], "answer": ..., "attribute": ...}
    // per line, rendered with --tokenizer-model's chat template (generation prompt added) and
    // media as preprocess --multimodal does; exact match of the stripped completion, per attribute.
    LF_CHECK(!o.tokenizer_model.empty() && tok, "--eval-file with a ", v.type,
             " model needs --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR (its chat template)");
    const auto tpl = lf::data::ChatTemplate::from_tokenizer_dir(
        fs::is_directory(o.tokenizer_model) ? o.tokenizer_model : fs::path(o.tokenizer_model).parent_path().string());
    lf::data::MultimodalOptions mo;
    mo.image = preprocess_of(o.load, v.vision);
    LF_CHECK(!o.add_special_tokens, "--add-special-tokens does not apply to a vision-language --eval-file: its "
             "records are rendered with the chat template of --tokenizer-model",
             lf::hint("drop --add-special-tokens"));
    const std::string root = fs::path(o.eval_file).parent_path().string();
    std::ifstream in(o.eval_file);
    LF_CHECK(in.good(), "cannot open --eval-file ", o.eval_file);
    std::map<std::string, std::pair<int64_t, int64_t>> by_attribute;  // correct, total
    int64_t n = 0, correct = 0, line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.empty()) continue;
      if (o.eval_limit > 0 && n >= o.eval_limit) break;
      json j;
      lf::data::MultimodalSample s;
      try {
        j = json::parse(line);
        LF_CHECK(j.contains("answer") && j["answer"].is_string(), "needs a string field \"answer\"");
        s = lf::data::render_multimodal(line, tpl, *tok, mo, root, static_cast<int32_t>(v.own.image_token_id),
                                        static_cast<int32_t>(v.own.video_token_id), true);
      } catch (const json::exception& e) {
        LF_FAIL(o.eval_file, ":", line_no, ": not JSON: ", e.what());
      } catch (const lf::Error& e) {
        LF_FAIL(o.eval_file, ":", line_no, ": ", e.message(), e.hint().empty() ? lf::hint("") : lf::hint(e.hint()));
      }
      auto gen = at::make_generator<at::CPUGeneratorImpl>(o.gen.seed);
      const auto out = continue_ids(to64(s.tokens), lf::models::Qwen25Vl::media_of_records(s.media, mo.image), gen);
      std::string got = tok->decode(to32(out));
      while (!got.empty() && std::isspace(static_cast<unsigned char>(got.back()))) got.pop_back();
      const std::string answer = j["answer"];
      const bool ok = got == answer;
      correct += ok;
      ++n;
      auto& a = by_attribute[j.value("attribute", "")];
      a.first += ok;
      ++a.second;
      if (o.verbose) std::printf("line %lld: %s %s (want %s)\n", static_cast<long long>(line_no), got.c_str(),
                                 ok ? "ok" : "wrong", answer.c_str());
    }
    LF_CHECK(n > 0, o.eval_file, " has no problems");
    for (const auto& [attribute, a] : by_attribute)
      if (!attribute.empty())
        std::printf("attribute %s: %lld/%lld = %.3f\n", attribute.c_str(), static_cast<long long>(a.first),
                    static_cast<long long>(a.second), static_cast<double>(a.first) / static_cast<double>(a.second));
    std::printf("exact match: %lld/%lld = %.3f\n", static_cast<long long>(correct), static_cast<long long>(n),
                static_cast<double>(correct) / static_cast<double>(n));
    return 0;
  }
  Qwen25VlMedia media;
  std::string media_flag;
  if (!o.images.empty()) {
    media = media_of_images(o.images, preprocess_of(o.load, v.vision));
    for (const auto& f : o.images) media_flag += (media_flag.empty() ? "--image " : ", --image ") + f;
  } else if (!o.vision_inputs.empty()) {
    media = media_of_file(o.vision_inputs, v.vision);
    media_flag = "--vision-inputs " + o.vision_inputs;
  }
  const std::vector<int64_t> ids =
      !o.input_ids.empty() ? parse_ids(o.input_ids) : prompt_ids(*tok, o.prompt, o.add_special_tokens);
  for (int64_t id : ids)
    LF_CHECK(id >= 0 && id < v.foundation.vocab_size, "token ", id, " is outside the vocabulary [0, ",
             v.foundation.vocab_size, ")");
  check_placeholders(ids, media, v, media_flag);
  if (!o.dump_logits.empty()) {
    write_logits(model.logits(at::tensor(ids, opts).unsqueeze(0), media).select(1, 0), ids, o.dump_logits);
    return 0;
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.gen.seed);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> out = continue_ids(ids, media, gen);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(out[i]));
  std::printf("\n");
  if (tok) std::printf("%s\n", tok->decode(to32(out)).c_str());
  LF_INFO(out.size(), " tokens in ", secs, " s (the whole sequence recomputed per token)");
  return 0;
}

// What a Wan diffusion transformer takes in loongforge-generate (the hint of the errors that meet one).
constexpr const char* kWanHint =
    "a Wan diffusion transformer samples: --latent-shape F,H,W --output-dir DIR with --prompt TEXT --text-table FILE "
    "or --text-embeddings FILE.safetensors; or runs one forward: --denoise-inputs FILE.safetensors --dump-prediction "
    "OUT.safetensors";

// The sampling flags given (for the modes that take none).
std::vector<const char*> sampling_flags_given(const Options& o) {
  const auto& s = o.sample;
  std::vector<const char*> out;
  for (const auto& [flag, given] : {std::pair<const char*, bool>{"--text-table", !s.text_table.empty()},
                                    {"--negative-prompt", !s.negative_prompt.empty()},
                                    {"--text-embeddings", !s.text_embeddings.empty()},
                                    {"--latent-shape", !s.latent_shape.empty()},
                                    {"--first-frame", !s.first_frame.empty()},
                                    {"--load-low-noise", !s.load_low_noise.empty()},
                                    {"--boundary-ratio", s.boundary_ratio >= 0},
                                    {"--guidance-scale-low", s.guidance_scale_low >= 0},
                                    {"--output-dir", !s.output_dir.empty()},
                                    {"--use-ema", s.use_ema}})
    if (given) out.push_back(flag);
  // The options with defaults count when they are on the command line.
  for (const char* flag : {"--num-inference-steps", "--guidance-scale", "--sample-shift", "--num-samples", "--fps"})
    if (std::find(o.given.begin(), o.given.end(), flag) != o.given.end()) out.push_back(flag);
  return out;
}

// A Wan model: one forward on given tensors (denoise.h) or sampling (sample.h).
int run_wan(const Options& o) {
  const bool denoise = !o.denoise_inputs.empty() || !o.dump_prediction.empty();
  for (const auto& [flag, given] : {std::pair<const char*, bool>{"--prompt", denoise && !o.prompt.empty()},
                                    {"--tokenizer-type", !o.tokenizer_type.empty()},
                                    {"--tokenizer-model", !o.tokenizer_model.empty()},
                                    {"--eval-file", !o.eval_file.empty()},
                                    {"--input-ids", !o.input_ids.empty()},
                                    {"--dump-logits", !o.dump_logits.empty()},
                                    {"--image", !o.images.empty()},
                                    {"--vision-inputs", !o.vision_inputs.empty()},
                                    {"--lora-adapter", !o.lora_adapter.empty()},
                                    {"--stop", !o.stop.empty()},
                                    {"--add-special-tokens", o.add_special_tokens}})
    LF_CHECK(!given, flag, " does not apply to ",
             denoise ? "--denoise-inputs (one forward of a Wan diffusion transformer)"
                     : "a Wan diffusion transformer (" + o.load + ")",
             lf::hint(std::string("drop ") + flag + "; " + kWanHint));
  if (denoise) {
    const auto extra = sampling_flags_given(o);
    LF_CHECK(extra.empty(), extra.empty() ? "" : extra[0],
             " is a sampling flag; it does not apply to --denoise-inputs (one forward)",
             lf::hint(std::string("drop ") + (extra.empty() ? "" : extra[0])));
    lf::tools::generate::DenoiseOptions d;
    d.load = o.load;
    d.iteration = o.iteration;
    d.inputs = o.denoise_inputs;
    d.prediction = o.dump_prediction;
    d.bf16 = o.bf16;
    return lf::tools::generate::run_denoise(d);
  }
  auto s = o.sample;
  s.load = o.load;
  s.iteration = o.iteration;
  s.prompt = o.prompt;
  s.seed = o.gen.seed;
  s.bf16 = o.bf16;
  LF_CHECK(!s.latent_shape.empty() || !s.output_dir.empty() || !s.prompt.empty() || !s.text_embeddings.empty(),
           o.load, " is a Wan diffusion transformer; give what to sample or the forward's inputs", lf::hint(kWanHint));
  return lf::tools::generate::run_sample(s);
}

// A pi05 policy: its loss and / or sampled actions on one batch (policy.h).
int run_pi05(Options& o) {
  // Everything else on the command line is for language models or Wan sampling: an error, not ignored.
  static const std::set<std::string> kPolicyFlags = {"--load",      "--iteration",    "--policy-inputs",
                                                     "--dump-loss", "--dump-actions", "--num-inference-steps"};
  for (const auto& flag : o.given)
    LF_CHECK(kPolicyFlags.count(flag), flag, " does not apply to a pi05 policy (", o.load, ")",
             lf::hint("drop " + flag + "; " + lf::tools::generate::kPolicyHint));
  if (std::find(o.given.begin(), o.given.end(), "--num-inference-steps") != o.given.end()) {
    LF_CHECK(o.sample.num_inference_steps >= 1, "--num-inference-steps must be >= 1, got ",
             o.sample.num_inference_steps);
    LF_CHECK(!o.policy.actions.empty(), "--num-inference-steps sets the Euler steps of --dump-actions",
             lf::hint("add --dump-actions OUT.safetensors or drop --num-inference-steps"));
    o.policy.steps = o.sample.num_inference_steps;
  }
  o.policy.load = o.load;
  o.policy.iteration = o.iteration;
  return lf::tools::generate::run_policy(o.policy);
}

int run(Options& o) {
  if (!o.policy.inputs.empty() || !o.policy.loss.empty() || !o.policy.actions.empty() ||
      lf::tools::generate::is_policy_model(o.load, o.iteration))
    return run_pi05(o);
  if (!o.denoise_inputs.empty() || !o.dump_prediction.empty() || lf::tools::generate::is_wan_model(o.load, o.iteration))
    return run_wan(o);
  const auto sampling = sampling_flags_given(o);
  LF_CHECK(sampling.empty(), sampling.empty() ? "" : sampling[0], " applies to Wan diffusion transformers only; ",
           o.load, " is not one", lf::hint(std::string("drop ") + (sampling.empty() ? "" : sampling[0])));
  const int modes = !o.prompt.empty() + !o.eval_file.empty() + !o.input_ids.empty();
  LF_CHECK(modes == 1, "give exactly one of --prompt, --eval-file, --input-ids (got ", modes, ")");
  LF_CHECK(o.dump_logits.empty() || !o.input_ids.empty(), "--dump-logits needs --input-ids");
  LF_CHECK(!o.add_special_tokens || o.input_ids.empty(), "--add-special-tokens applies to --prompt and --eval-file; "
           "--input-ids are taken as given", lf::hint("add the special tokens' ids to --input-ids"));
  LF_CHECK(!o.add_special_tokens || o.tokenizer_type == "HuggingFaceTokenizer",
           "--add-special-tokens needs --tokenizer-type HuggingFaceTokenizer (got '", o.tokenizer_type,
           "', which has no post-processor)", lf::hint("drop --add-special-tokens"));
  std::unique_ptr<lf::data::Tokenizer> tok;
  if (!o.tokenizer_type.empty()) tok = lf::data::make_tokenizer(o.tokenizer_type, o.tokenizer_model);
  LF_CHECK(tok || !o.input_ids.empty(), "--prompt and --eval-file need --tokenizer-type",
           lf::hint("e.g. --tokenizer-type ByteTokenizer, or HuggingFaceTokenizer --tokenizer-model DIR"));
  // The flags of a mode not in use would do nothing: each is refused by name.
  auto given = [&](const char* flag) { return std::find(o.given.begin(), o.given.end(), flag) != o.given.end(); };
  for (const char* flag : {"--eval-limit", "--verbose"})
    LF_CHECK(!given(flag) || !o.eval_file.empty(), flag, " applies to --eval-file", lf::hint(std::string("drop ") + flag));
  if (!o.dump_logits.empty()) {
    for (const char* flag : {"--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed", "--stop", "--no-kv-cache"})
      LF_CHECK(!given(flag), flag, " is a generation flag, and --dump-logits scores --input-ids in one forward",
               lf::hint(std::string("drop ") + flag));
  } else if (o.gen.sampling.temperature == 0) {
    for (const char* flag : {"--top-k", "--top-p", "--seed"})
      LF_CHECK(!given(flag), flag, " shapes sampling, and --temperature 0 decodes greedily (it draws nothing)",
               lf::hint(std::string("add --temperature T (T > 0) to sample, or drop ") + flag));
  }
  LF_CHECK(o.stop.empty() || tok, "--stop strings are read with the tokenizer, and no --tokenizer-type is given",
           lf::hint("add --tokenizer-type (as the model was trained with), or drop --stop"));
  if (tok) {
    if (auto eod = tok->eod_id()) o.gen.stop_ids.push_back(*eod);
    for (const auto& s : o.stop) {
      auto ids = tok->encode(s);
      LF_CHECK(ids.size() == 1, "--stop '", s, "' is ", ids.size(), " tokens; stop strings must be one token");
      o.gen.stop_ids.push_back(ids[0]);
    }
  }
  LF_CHECK(o.images.empty() || o.vision_inputs.empty(), "give --image or --vision-inputs, not both (--vision-inputs ",
           o.vision_inputs, ", --image ", o.images.empty() ? "" : o.images[0], ")");
  for (const auto& f : o.images) {
    std::error_code ec;
    LF_CHECK(fs::is_regular_file(f, ec), "--image ", f, ": no such file");
  }
  if (!o.vision_inputs.empty()) {
    std::error_code ec;
    LF_CHECK(fs::is_regular_file(o.vision_inputs, ec), "--vision-inputs ", o.vision_inputs, ": no such file");
  }

  const auto t0 = std::chrono::steady_clock::now();
  Loaded loaded = load_model(o.load, o.iteration);
  if (loaded.vlm) {
    if (tok)
      LF_CHECK(tok->vocab_size() <= loaded.config.vocab_size, "the tokenizer has ", tok->vocab_size(),
               " ids, the model's vocabulary only ", loaded.config.vocab_size);
    LF_CHECK(!o.no_kv_cache, "--no-kv-cache: a vision-language model recomputes the whole sequence every step already",
             lf::hint("drop --no-kv-cache"));
    return run_vlm(o, loaded, tok.get());
  }
  const std::string media_flag = !o.images.empty() ? "--image " + o.images[0] : "--vision-inputs " + o.vision_inputs;
  LF_CHECK(o.images.empty() && o.vision_inputs.empty(), media_flag, ": ", loaded.what,
           " is a text-only model (causal_lm); images need a vision-language model (qwen2_5_vl)",
           lf::hint("drop " + media_flag.substr(0, media_flag.find(' ')) + ", or --load a Qwen2.5-VL checkpoint"));
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
  LF_CHECK(!tok || tok->vocab_size() <= loaded.config.vocab_size, "the tokenizer has ", tok ? tok->vocab_size() : 0,
           " ids, the model's vocabulary only ", loaded.config.vocab_size,
           lf::hint("use the tokenizer the model was trained with"));
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
    const auto ids = prompt_ids(*tok, o.prompt, o.add_special_tokens);
    LF_INFO("prompt: ", ids.size(), " tokens (", o.add_special_tokens ? "with" : "without",
            " the tokenizer's special tokens)");
    const auto out = lf::models::generate(model, ids, o.gen);
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
    const std::string got =
        tok->decode(to32(lf::models::generate(model, prompt_ids(*tok, prompt, o.add_special_tokens), o.gen)));
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
  app.add_option("--prompt", o.prompt,
                 "Text to continue (a Wan diffusion transformer: the caption to sample, encoded with --text-table)");
  app.add_flag("--add-special-tokens", o.add_special_tokens,
               "Encode --prompt / --eval-file prompts with the tokenizer's post-processor template, as HF's "
               "tokenizer(text) does (LLaMA-3's <|begin_of_text|>, Gemma's <bos>); HuggingFaceTokenizer only. Off: "
               "the text's ids alone, as loongforge-data preprocesses training text");
  app.add_option("--eval-file", o.eval_file,
                 "jsonl with prompt/answer: exact-match accuracy (VLMs: messages + images + answer [+ attribute], "
                 "rendered with the chat template of --tokenizer-model)");
  app.add_option("--eval-limit", o.eval_limit, "Score at most this many problems (0: all)");
  app.add_option("--input-ids", o.input_ids, "Token ids to continue, e.g. 1,2,3");
  app.add_option("--dump-logits", o.dump_logits, "With --input-ids: write their logits (safetensors)");
  app.add_option("--image", o.images,
                 "A vision-language model: an image (PNG/JPEG) for the ids' image placeholders, in order (repeatable; "
                 "preprocessed as --load's preprocessor_config.json says)");
  app.add_option("--vision-inputs", o.vision_inputs,
                 "A vision-language model: safetensors with the processor's pixel_values + image_grid_thw and/or "
                 "pixel_values_videos + video_grid_thw (+ second_per_grid_ts)");
  app.add_option("--denoise-inputs", o.denoise_inputs,
                 "A Wan diffusion transformer (diffusers WanTransformer3DModel directory or flow_matching checkpoint): "
                 "safetensors with hidden_states [b, c, f, h, w], timestep [b] or [b, tokens], encoder_hidden_states "
                 "[b, l, d] (+ encoder_hidden_states_image for I2V), as diffusers' model takes them; one forward");
  app.add_option("--dump-prediction", o.dump_prediction,
                 "With --denoise-inputs: write the model's output as tensor prediction (float32, safetensors)");
  // A pi05 policy (policy.h).
  app.add_option("--policy-inputs", o.policy.inputs,
                 "A pi05 policy (LeRobot pi05 directory or pi05 checkpoint): safetensors with the batch as LeRobot's "
                 "PI05Pytorch takes it after its processor: images [n_cam, b, 3, H, W] float32 in [-1, 1], img_masks "
                 "[n_cam, b] (uint8 or bool), tokens [b, L] int64, masks [b, L], actions [b, chunk, max_action_dim], "
                 "noise (the actions' shape) and time [b]");
  app.add_option("--dump-loss", o.policy.loss,
                 "With --policy-inputs: write tensor loss, the element-wise flow-matching MSE [b, chunk, "
                 "max_action_dim] of PI05Pytorch.forward (float32, safetensors)");
  app.add_option("--dump-actions", o.policy.actions,
                 "With --policy-inputs: write tensor actions [b, chunk, max_action_dim], Euler-sampled from noise with "
                 "the policy's num_inference_steps as PI05Pytorch.sample_actions does (float32, safetensors)");
  // Sampling from a Wan diffusion transformer (sample.h).
  app.add_option("--text-table", o.sample.text_table,
                 "Wan sampling: the word-table text encoder (safetensors, the small demos) that encodes --prompt and "
                 "--negative-prompt");
  app.add_option("--negative-prompt", o.sample.negative_prompt,
                 "Wan sampling with --text-table: the caption of the unconditional pass (default \"\": all-zero rows)");
  app.add_option("--text-embeddings", o.sample.text_embeddings,
                 "Wan sampling: safetensors with the text encoder's embeddings computed offline (e.g. UMT5's): prompt "
                 "[l, text_dim] and optional negative_prompt [l, text_dim] (default: all-zero rows)");
  app.add_option("--latent-shape", o.sample.latent_shape,
                 "Wan sampling: latent frames,height,width (F,H,W; multiples of the patch size; channels from the "
                 "model)");
  app.add_option("--first-frame", o.sample.first_frame,
                 "Wan sampling, Wan 2.2 TI2V: safetensors with first_frame [C, 1, H, W] or [K, C, 1, H, W], the clean "
                 "first latent frame kept fixed (its tokens at timestep 0)");
  app.add_option("--load-low-noise", o.sample.load_low_noise,
                 "Wan sampling, Wan 2.2 A14B: the low-noise expert (diffusers directory or checkpoint, the same "
                 "configuration as --load, the high-noise expert); it predicts at timesteps below --boundary-ratio x 1000");
  app.add_option("--boundary-ratio", o.sample.boundary_ratio,
                 "Wan sampling with --load-low-noise: the boundary of the two experts (A14B text-to-video: 0.875)");
  app.add_option("--guidance-scale-low", o.sample.guidance_scale_low,
                 "Wan sampling with --load-low-noise: its guidance scale (default: --guidance-scale)");
  app.add_option("--num-inference-steps", o.sample.num_inference_steps,
                 "Wan sampling: Euler steps (a pi05 policy's --dump-actions: default the policy's num_inference_steps)")
      ->capture_default_str();
  app.add_option("--guidance-scale", o.sample.guidance_scale,
                 "Wan sampling: classifier-free guidance g, v = v_uncond + g (v_cond - v_uncond) (1: one pass)")
      ->capture_default_str();
  app.add_option("--sample-shift", o.sample.sample_shift,
                 "Wan sampling: the schedule's shift (diffusers' FlowMatchEulerDiscreteScheduler shift)")
      ->capture_default_str();
  app.add_option("--num-samples", o.sample.num_samples, "Wan sampling: samples drawn (a batch)")->capture_default_str();
  app.add_option("--output-dir", o.sample.output_dir,
                 "Wan sampling: writes latents.safetensors (latents [K, C, F, H, W], float32) and, for a 3-channel "
                 "(pixel) latent space, sample_<k>/frame_<ff>.png and sample_<k>.gif");
  app.add_option("--fps", o.sample.fps, "Wan sampling: frames per second of the GIFs")->capture_default_str();
  app.add_flag("--use-ema", o.sample.use_ema,
               "Wan sampling from a LoongForge checkpoint: its EMA weights (--ema-decay in training)");
  app.add_option("--max-new-tokens", o.gen.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  app.add_option("--temperature", o.gen.sampling.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-k", o.gen.sampling.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  app.add_option("--top-p", o.gen.sampling.top_p, "Nucleus mass (1: off)")->capture_default_str();
  app.add_option("--seed", o.gen.seed,
                 "Sampling seed (Wan: the initial noise is torch.randn([K, C, F, H, W], "
                 "generator=torch.Generator().manual_seed(seed)), float32 on the CPU)")
      ->capture_default_str();
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
  for (const CLI::Option* opt : app.get_options())
    if (opt->count() > 0) o.given.push_back(opt->get_name());
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
