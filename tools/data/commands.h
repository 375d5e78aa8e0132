// Subcommands of loongforge-data that are more than a call into the data library. Not a public
// API: the library (include/loongforge/data) is what other programs use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/data/chat_template.h"

namespace lf::data::tools {

struct InspectOptions {
  std::string prefix;  // an indexed dataset's prefix, or a LeRobot dataset's directory
  // LeRobot datasets: {N, OUT.safetensors} writes episode N as the trainer sees it.
  std::vector<std::string> dump_episode;
  std::string tokenizer_type, tokenizer_model;  // empty type: show ids only
  int64_t vocab_size = -1;                      // -1: the tokenizer's, or no check
  int64_t sample = 0;
  int64_t max_tokens = 64;
};

// Prints counts, dtype, the sequence-length histogram and one sample; returns the exit code. A
// directory holding meta/info.json is a LeRobot dataset: run_inspect_lerobot.
int run_inspect(const InspectOptions& options);
// A LeRobot dataset's summary (version, fps, episodes, frames, tasks, features, cameras, stats), or
// with dump_episode the episode's tensors (tools/data/lerobot.cpp).
int run_inspect_lerobot(const InspectOptions& options);

struct RenderChatOptions {
  std::string tokenizer_model, input, output;
  bool add_generation_prompt = false;
  std::string chat_template_kwargs;  // JSON object, empty: none
  std::string chat_template_name;    // empty: transformers' default choice
};

// render-chat: one {"input_ids", "assistant_masks"} line per conversation line.
int run_render_chat(const RenderChatOptions& options);
// The chat template of a tokenizer directory with --chat-template-kwargs applied.
ChatTemplate load_chat_template(const std::string& dir, const std::string& name, const std::string& kwargs);

struct DemoVlmOptions {
  std::string out;
  uint64_t seed = 1;
  int64_t train_images = 1200, eval_images = 100;
};

// make-demo-vlm: synthetic shape images, attribute questions, a held-out set and its image-ablated
// twin, and a tokenizer directory for them (tools/data/demo_vlm.cpp).
int run_make_demo_vlm(const DemoVlmOptions& options);

// diffusion: a latent store (data/latent_store.h) from a JSONL manifest, one sample per line:
// {"caption", "video" | "frames": [...] | "image"} (pixels as the latents: the identity VAE of
// pixel-space models) or {"latents": FILE} (precomputed, tensor "latents" [C, F, H, W]); the text
// from {"text_embeddings": FILE} (tensor "text" [L, D]) or the caption through --text-table;
// optional {"image_embeddings": FILE} (tensor "image").
struct DiffusionStoreOptions {
  std::string manifest, out, text_table, media_root;
  int64_t num_frames = 0;  // > 0: the first N frames of every clip
};
int run_diffusion_store(const DiffusionStoreOptions& options);

// make-demo-squares: the diffusion demo's store (OUT/store), text table (OUT/text_table.safetensors)
// and a few example frames.
struct SquaresDemoOptions {
  std::string out;
  int64_t clips = 2048, text_dim = 16, frames = 4, size = 16;
  uint64_t seed = 1234;
};
int run_make_demo_squares(const SquaresDemoOptions& options);

// score-squares: colour and direction of every generated clip of a caption (one JSON line).
struct ScoreSquaresOptions {
  std::string latents, caption;
  bool verbose = false;
};
int run_score_squares(const ScoreSquaresOptions& options);

// make-demo-reach: the VLA demo's store (vla/reach_demo.h) of the reach task's expert episodes.
struct ReachDemoOptions {
  std::string out;
  int64_t episodes = 400, image_size = 32, chunk = 10;
  uint64_t seed = 0;
  double noise = 0.3;
  bool position_queries = false;
  bool scene_queries = false;
  bool located = false;
  int64_t sample_every = 1;
};
int run_make_demo_reach(const ReachDemoOptions& options);

}  // namespace lf::data::tools
