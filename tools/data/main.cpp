// loongforge-data: dataset preprocessing and inspection, the demo corpus, a tokenizer benchmark.
//   loongforge-data preprocess --input x.jsonl --json-keys text --tokenizer-type T
//                              [--tokenizer-model M] [--append-eod] --workers N --output-prefix P
//   loongforge-data preprocess --conversations --tokenizer-model DIR --input x.jsonl
//                              --output-prefix P [--workers N] [--chat-template-kwargs JSON]
//   loongforge-data preprocess --multimodal --tokenizer-model DIR --input x.jsonl --output-prefix P
//                              [--media-root DIR] [--min-pixels N --max-pixels N ...]
//   loongforge-data render-chat --tokenizer-model DIR --input x.jsonl --output y.jsonl
//                               [--add-generation-prompt] [--chat-template-kwargs JSON]
//   loongforge-data inspect P [--tokenizer-type T --tokenizer-model M] [--vocab-size V]
//   loongforge-data inspect LEROBOT_DIR [--dump-episode N OUT.safetensors]
//   loongforge-data make-demo-corpus --out DIR [--seed S]
//   loongforge-data diffusion --manifest x.jsonl --out DIR [--text-table T] [--num-frames N]
//   loongforge-data make-demo-squares --out DIR [--clips N --seed S --text-dim D]
//   loongforge-data score-squares --latents FILE --caption TEXT
//   loongforge-data make-demo-reach --out DIR [--episodes N --seed S --image-size S --chunk H]
//   loongforge-data bench-tokenizer --input x.jsonl --tokenizer-type T [--tokenizer-model M]
// Errors from the library become one message on stderr and exit code 1 (2 for usage errors).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <set>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/demo_corpus.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/multimodal.h"
#include "loongforge/data/preprocess.h"
#include "loongforge/data/tokenizer.h"

namespace {

struct ConversationFlags {
  bool on = false, multimodal = false;
  std::string kwargs, template_name;
  lf::data::MultimodalOptions media;
  // Flags given explicitly (they override the model directory's preprocessor_config.json).
  std::set<std::string> given;
};

// transformers' preprocessor_config.json beside the tokenizer (a VLM's directory): patch sizes,
// pixel bounds (size.shortest_edge / longest_edge or min_pixels / max_pixels), mean and std, for
// the settings not given as flags.
void apply_preprocessor_config(const std::string& model, ConversationFlags& c) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(model) ? fs::path(model) : fs::path(model).parent_path();
  const fs::path file = dir / "preprocessor_config.json";
  if (!fs::exists(file)) return;
  // The file over the defaults, then the flags given explicitly over the file.
  const auto from_file = lf::media::read_preprocessor_config(file.string(), lf::media::QwenVisionPreprocess{});
  auto& p = c.media.image;
  if (!c.given.count("--patch-size")) p.patch_size = from_file.patch_size;
  if (!c.given.count("--merge-size")) p.merge_size = from_file.merge_size;
  if (!c.given.count("--temporal-patch-size")) p.temporal_patch_size = from_file.temporal_patch_size;
  if (!c.given.count("--min-pixels")) p.min_pixels = from_file.min_pixels;
  if (!c.given.count("--max-pixels")) p.max_pixels = from_file.max_pixels;
  if (!c.given.count("--image-mean")) p.image_mean = from_file.image_mean;
  if (!c.given.count("--image-std")) p.image_std = from_file.image_std;
  LF_INFO("vision preprocessing from ", file.string(), ": patch ", p.patch_size, ", merge ", p.merge_size,
          ", temporal ", p.temporal_patch_size, ", pixels [", p.min_pixels, ", ", p.max_pixels, "]");
}

int run_preprocess(const lf::data::PreprocessOptions& o, const std::string& type,
                   const std::string& model, const ConversationFlags& conv) {
  lf::data::PreprocessStats s;
  LF_CHECK(conv.on || conv.multimodal || (conv.kwargs.empty() && conv.template_name.empty()),
           "--chat-template-kwargs and --chat-template-name apply to --conversations and --multimodal");
  if (conv.multimodal) {
    auto tpl = lf::data::tools::load_chat_template(model, conv.template_name, conv.kwargs);
    lf::data::HfBpeTokenizer tok(model);
    LF_INFO("tokenizer: ", tok.describe());
    LF_INFO(tpl.describe());
    ConversationFlags c = conv;
    apply_preprocessor_config(model, c);
    s = lf::data::preprocess_multimodal(o, tok, tpl, c.media);
    std::printf("output: %s_media.json\n", o.output_prefix.c_str());
  } else if (conv.on) {
    auto tpl = lf::data::tools::load_chat_template(model, conv.template_name, conv.kwargs);
    lf::data::HfBpeTokenizer tok(model);
    LF_INFO("tokenizer: ", tok.describe());
    LF_INFO(tpl.describe());
    s = lf::data::preprocess_conversations(o, tok, tpl);
  } else {
    auto tok = lf::data::make_tokenizer(type, model);
    LF_INFO("tokenizer: ", tok->describe());
    s = lf::data::preprocess_jsonl(o, *tok);
  }
  double mb = static_cast<double>(s.input_bytes) / 1e6;
  std::printf("input: %s, %.2f MB, %lld lines, %lld documents (%lld empty skipped)\n",
              o.input.c_str(), mb, static_cast<long long>(s.lines),
              static_cast<long long>(s.documents), static_cast<long long>(s.empty_skipped));
  for (size_t k = 0; k < s.output_prefixes.size(); ++k)
    std::printf("output: %s.{bin,idx} (%lld tokens)\n", s.output_prefixes[k].c_str(),
                static_cast<long long>(s.tokens[k]));
  for (size_t w = 0; w < s.workers.size(); ++w)
    std::printf("worker %zu: %lld chunks, %.2f MB, busy %.2f s\n", w,
                static_cast<long long>(s.workers[w].chunks),
                static_cast<double>(s.workers[w].bytes) / 1e6, s.workers[w].busy_s);
  std::printf("time: %.2f s, throughput: %.2f MB/s with %d workers\n", s.seconds,
              s.seconds > 0 ? mb / s.seconds : 0.0, o.workers);
  return 0;
}

int run_bench(const std::string& input, const std::string& key, const std::string& type,
              const std::string& model, int repeat) {
  auto tok = lf::data::make_tokenizer(type, model);
  std::ifstream in(input, std::ios::binary);
  LF_CHECK(in.good(), "cannot open ", input);
  std::vector<std::string> docs;
  int64_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    docs.push_back(nlohmann::json::parse(line).at(key).get<std::string>());
    bytes += static_cast<int64_t>(docs.back().size());
  }
  std::vector<int32_t> ids;
  int64_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    tokens = 0;
    for (const auto& d : docs) {
      ids.clear();
      tok->encode_into(d, ids);
      tokens += static_cast<int64_t>(ids.size());
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("pass %d: %zu documents, %.2f MB, %lld tokens, %.3f s, %.2f MB/s (one thread)\n",
                r, docs.size(), static_cast<double>(bytes) / 1e6, static_cast<long long>(tokens), s,
                static_cast<double>(bytes) / 1e6 / s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loongforge-data: Megatron indexed datasets, tokenizers and the demo corpus"};
  app.require_subcommand(1);

  lf::data::PreprocessOptions po;
  std::string type = "HuggingFaceTokenizer", model;
  auto* pre = app.add_subcommand("preprocess", "tokenize a jsonl file into indexed datasets");
  pre->add_option("--input", po.input, "jsonl file, one JSON object per line")->required();
  auto* keys_opt = pre->add_option("--json-keys", po.json_keys, "keys to tokenize (one dataset each)");
  auto* type_opt = pre->add_option("--tokenizer-type", type, "HuggingFaceTokenizer | ByteTokenizer");
  ConversationFlags conv;
  auto* conv_opt = pre->add_flag("--conversations", conv.on,
                                 "lines are {\"messages\": [...], \"tools\": [...]}: write "
                                 "<prefix>_input_ids_document and <prefix>_assistant_masks_document");
  auto* mm_opt = pre->add_flag("--multimodal", conv.multimodal,
                               "lines are conversations with media (messages + images / videos, or LLaVA's "
                               "conversations + image): write the multimodal store (docs/data.md)");
  pre->add_option("--chat-template-kwargs", conv.kwargs,
                  "extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  pre->add_option("--chat-template-name", conv.template_name, "which of the tokenizer directory's named chat templates");
  conv_opt->excludes(keys_opt);
  mm_opt->excludes(keys_opt)->excludes(conv_opt);
  auto& mo = conv.media;
  const auto media_option = [&](const std::string& name, auto& field, const std::string& help) {
    pre->add_option(name, field, help)->needs(mm_opt)->capture_default_str()->each([&conv, name](const std::string&) {
      conv.given.insert(name);
    });
  };
  media_option("--media-root", mo.media_root, "relative media paths resolve here (default: the input's directory)");
  media_option("--patch-size", mo.image.patch_size, "vision patch size (default, or preprocessor_config.json)");
  media_option("--merge-size", mo.image.merge_size, "spatial merge size");
  media_option("--temporal-patch-size", mo.image.temporal_patch_size, "frames per temporal patch");
  media_option("--min-pixels", mo.image.min_pixels, "images: smart-resize lower bound (pixels)");
  media_option("--max-pixels", mo.image.max_pixels, "images: smart-resize upper bound (pixels)");
  media_option("--image-mean", mo.image.image_mean, "normalisation mean per channel (3 values)");
  media_option("--image-std", mo.image.image_std, "normalisation std per channel (3 values)");
  media_option("--video-min-pixels", mo.video_min_pixels, "videos: per-frame lower bound (pixels)");
  media_option("--video-max-pixels", mo.video_max_pixels, "videos: per-frame upper bound (pixels)");
  media_option("--video-fps", mo.video_fps, "frames sampled per second of video (0: every frame)");
  media_option("--video-min-frames", mo.video_min_frames, "videos: at least this many sampled frames");
  media_option("--video-max-frames", mo.video_max_frames, "videos: at most this many sampled frames");
  media_option("--image-token", mo.image_token, "the image placeholder token the chat template renders");
  media_option("--video-token", mo.video_token, "the video placeholder token the chat template renders");
  pre->add_option("--tokenizer-model", model, "tokenizer.json or its directory");
  pre->add_flag("--append-eod", po.append_eod, "end every document with the eod token");
  pre->add_option("--workers", po.workers, "tokenizing threads")->check(CLI::PositiveNumber);
  pre->add_option("--output-prefix", po.output_prefix,
                  "outputs are <prefix>_<key>_document.{bin,idx}")->required();
  pre->add_option("--chunk-bytes", po.chunk_bytes, "lines per work item, in bytes");
  pre->add_option("--log-interval", po.log_interval_s, "seconds between progress lines");

  lf::data::tools::DemoVlmOptions dv;
  auto* demo_vlm = app.add_subcommand("make-demo-vlm", "the VLM demo's images, conversations and tokenizer (tools/demo-vlm)");
  demo_vlm->add_option("--out", dv.out, "output directory")->required();
  demo_vlm->add_option("--seed", dv.seed, "random seed")->capture_default_str();
  demo_vlm->add_option("--train-images", dv.train_images, "training images (3 questions each)")->capture_default_str();
  demo_vlm->add_option("--eval-images", dv.eval_images, "held-out images (3 questions each)")->capture_default_str();

  lf::data::tools::RenderChatOptions rc;
  auto* chat = app.add_subcommand(
      "render-chat", "conversations -> input_ids and assistant_masks as transformers' apply_chat_template");
  chat->add_option("--tokenizer-model", rc.tokenizer_model, "HF tokenizer directory (tokenizer.json, chat template)")
      ->required();
  chat->add_option("--input", rc.input, "jsonl, one {\"messages\": [...], \"tools\": [...]} per line")->required();
  chat->add_option("--output", rc.output, "jsonl, one {\"input_ids\", \"assistant_masks\"} per conversation")
      ->required();
  chat->add_flag("--add-generation-prompt", rc.add_generation_prompt, "end with the assistant turn's header");
  chat->add_option("--chat-template-kwargs", rc.chat_template_kwargs,
                   "extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  chat->add_option("--chat-template-name", rc.chat_template_name,
                   "which of the tokenizer directory's named chat templates");

  lf::data::tools::InspectOptions io;
  auto* ins = app.add_subcommand(
      "inspect",
      "an indexed dataset: counts, dtype, length histogram and a decoded sample; a LeRobot dataset (a directory "
      "with meta/info.json, v3.0 or v2.1): version, fps, episodes, frames, features and cameras");
  ins->add_option("prefix", io.prefix, "indexed dataset path prefix (without .bin/.idx), or a LeRobot dataset directory")
      ->required();
  ins->add_option("--dump-episode", io.dump_episode,
                  "N OUT.safetensors: write LeRobot episode N as the trainer sees it: one float32 tensor per "
                  "feature key (observation.state, action, ...) [T, ...], camera frames decoded as uint8 "
                  "[T, C, H, W] under their keys, and timestamp (float32), frame_index, task_index, index, "
                  "episode_index (int64); the tasks in the file's metadata")
      ->expected(2)
      ->type_name("N OUT");
  ins->add_option("--tokenizer-type", io.tokenizer_type, "decode the sample with this tokenizer");
  ins->add_option("--tokenizer-model", io.tokenizer_model, "tokenizer.json or its directory");
  ins->add_option("--vocab-size", io.vocab_size, "check every token id is below this");
  ins->add_option("--sample", io.sample, "which sequence to show");
  ins->add_option("--max-tokens", io.max_tokens, "tokens of the sample to show");

  lf::data::DemoCorpusOptions dopt;
  auto* demo = app.add_subcommand("make-demo-corpus",
                                  "write the arithmetic demo corpus (train/valid/eval jsonl)");
  demo->add_option("--out", dopt.out_dir, "output directory")->required();
  demo->add_option("--seed", dopt.seed, "random seed");
  demo->add_option("--train-docs", dopt.train_docs, "training documents");
  demo->add_option("--valid-docs", dopt.valid_docs, "validation documents (held-out problems)");
  demo->add_option("--eval-problems", dopt.eval_problems, "prompt/answer pairs in eval.jsonl");
  demo->add_option("--problems-per-doc", dopt.problems_per_doc, "problems per document");
  demo->add_option("--max-operand", dopt.max_operand, "largest operand");

  lf::data::tools::DiffusionStoreOptions dso;
  auto* diff = app.add_subcommand("diffusion", "a latent store for diffusion models from a manifest of clips and captions");
  diff->add_option("--manifest", dso.manifest,
                   "jsonl: {\"caption\", \"video\" | \"frames\" | \"image\" | \"latents\", "
                   "\"text_embeddings\", \"image_embeddings\"} per line")
      ->required();
  diff->add_option("--out", dso.out, "store directory to create")->required();
  diff->add_option("--text-table", dso.text_table, "encode captions with this word table (text_table.safetensors)");
  diff->add_option("--media-root", dso.media_root, "relative paths resolve here (default: the manifest's directory)");
  diff->add_option("--num-frames", dso.num_frames, "keep the first N frames of every clip");
  lf::data::tools::SquaresDemoOptions sq;
  auto* squares = app.add_subcommand("make-demo-squares", "the diffusion demo's clips of moving squares (tools/demo-diffusion)");
  squares->add_option("--out", sq.out, "output directory")->required();
  squares->add_option("--clips", sq.clips, "clips (all 16 colour x direction pairs in turn)")->capture_default_str();
  squares->add_option("--seed", sq.seed, "random seed")->capture_default_str();
  squares->add_option("--text-dim", sq.text_dim, "width of the text table's embeddings")->capture_default_str();
  squares->add_option("--frames", sq.frames, "frames per clip")->capture_default_str();
  squares->add_option("--size", sq.size, "frame height and width in pixels")->capture_default_str();
  lf::data::tools::ScoreSquaresOptions ss;
  lf::data::tools::ReachDemoOptions rd;
  auto* reach = app.add_subcommand("make-demo-reach",
                                   "the VLA demo's store: the reach task's scripted episodes (images, prompts, action "
                                   "chunks) for training a pi05 policy (tools/demo-vla)");
  reach->add_option("--out", rd.out, "output directory")->required();
  reach->add_option("--episodes", rd.episodes, "episodes, from seeds seed .. seed + N - 1")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  reach->add_option("--seed", rd.seed, "the first episode's seed")->capture_default_str();
  reach->add_option("--image-size", rd.image_size, "camera image side in pixels")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{512}));
  reach->add_option("--chunk", rd.chunk, "actions per chunk (the expert's plan from each step)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{200}));
  reach->add_option("--noise", rd.noise,
                    "Gaussian noise on the executed motions of every other episode, in units of the max speed (the "
                    "labels stay the expert's plan)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  reach->add_option("--sample-every", rd.sample_every,
                    "keep every k-th step of each episode (offset by the episode index): more scenes for the same "
                    "number of samples")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  reach->add_flag("--position-queries", rd.position_queries,
                  "end each prompt with the words block_x block_y target_x target_y and store prompt_labels: the named "
                  "block's and target's positions in the state's bins, targets of pi05's model.prefix_lm_loss_weight");
  reach->add_flag("--scene-queries", rd.scene_queries,
                  "end each prompt with sixteen more query words, <colour>_block_x <colour>_block_y <colour>_target_x "
                  "<colour>_target_y for red, green, blue, yellow, labelled in prompt_labels with every object's "
                  "position (-100 for a colour the scene lacks); prompts grow from 16 to 32 tokens");
  reach->add_flag("--located", rd.located,
                  "end each prompt with the named block's and target's query words in their colours (red_block_x "
                  "red_block_y blue_target_x blue_target_y), labelled with their positions, then their four answers "
                  "(the true bins) in an attention block of their own (prompt_ar_mask): a pi05 with "
                  "model.prefix_lm_loss_weight > 0 learns to predict the answers, its action expert reads them, and "
                  "the policy decodes them before sampling actions (pi0.5's hierarchical inference); 8 more tokens");
  auto* score = app.add_subcommand("score-squares", "colour and direction of generated demo clips");
  score->add_option("--latents", ss.latents, "loongforge-generate's latents.safetensors")->required();
  score->add_option("--caption", ss.caption, "the prompt the clips were generated from")->required();
  score->add_flag("--verbose", ss.verbose, "one line per clip");

  std::string bench_input, bench_key = "text";
  int repeat = 2;
  auto* bench = app.add_subcommand("bench-tokenizer", "single-thread encoding throughput");
  bench->add_option("--input", bench_input, "jsonl file")->required();
  bench->add_option("--json-key", bench_key, "text key");
  bench->add_option("--tokenizer-type", type, "HuggingFaceTokenizer | ByteTokenizer")->required();
  bench->add_option("--tokenizer-model", model, "tokenizer.json or its directory");
  bench->add_option("--repeat", repeat, "passes (the first fills the word cache)");

  CLI11_PARSE(app, argc, argv);
  try {
    lf::log::init(lf::log::options_from_env(-1, 1));
    if (*pre) {
      if (conv.on || conv.multimodal) {
        const char* mode = conv.on ? "--conversations" : "--multimodal";
        LF_CHECK(type_opt->count() == 0 || type == "hf" || type == "HuggingFaceTokenizer", mode,
                 " needs the HF tokenizer of --tokenizer-model, not --tokenizer-type ", type);
        LF_CHECK(!po.append_eod, "--append-eod does not apply to ", mode,
                 lf::hint("the chat template writes each turn's end token"));
      } else {
        LF_CHECK(type_opt->count() > 0, "preprocess needs --tokenizer-type (or --conversations / --multimodal)");
      }
      return run_preprocess(po, type, model, conv);
    }
    if (*chat) return lf::data::tools::run_render_chat(rc);
    if (*diff) return lf::data::tools::run_diffusion_store(dso);
    if (*squares) return lf::data::tools::run_make_demo_squares(sq);
    if (*score) return lf::data::tools::run_score_squares(ss);
    if (*reach) return lf::data::tools::run_make_demo_reach(rd);
    if (*demo_vlm) return lf::data::tools::run_make_demo_vlm(dv);
    if (*ins) return lf::data::tools::run_inspect(io);
    if (*bench) return run_bench(bench_input, bench_key, type, model, repeat);
    if (*demo) {
      auto f = lf::data::write_demo_corpus(dopt);
      std::printf("wrote %s, %s, %s (%lld training problems, %lld held out)\n", f.train.c_str(),
                  f.valid.c_str(), f.eval.c_str(), static_cast<long long>(f.train_problems),
                  static_cast<long long>(f.heldout_problems));
      return 0;
    }
  } catch (const lf::Error& e) {
    std::fprintf(stderr, "loongforge-data: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loongforge-data: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
