#include "loongforge/vla/reach_demo.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"

namespace lf::vla {
namespace {
namespace fs = std::filesystem;
constexpr int64_t kShard = 4096;  // samples per file
constexpr const char* kPositionQueries[] = {"block_x", "block_y", "target_x", "target_y"};

// The scene query words: four per colour, in reach_colours() order.
std::vector<std::string> scene_query_words() {
  std::vector<std::string> out;
  for (const auto& c : reach_colours())
    for (const char* q : kPositionQueries) out.push_back(c + "_" + q);
  return out;
}

// The instructed block's and target's centres (block x, block y, target x, target y).
std::array<double, 4> named_positions(const ReachEnv& env) {
  const auto [block_colour, target_colour] = env.task();
  std::array<double, 4> out{-1, -1, -1, -1};
  for (const auto& b : env.blocks())
    if (b.colour == block_colour) out[0] = b.x, out[1] = b.y;
  for (const auto& t : env.targets())
    if (t.colour == target_colour) out[2] = t.x, out[3] = t.y;
  LF_CHECK(out[0] >= 0 && out[2] >= 0, "reach prompt: the scene has no block or no target of its instruction's colours");
  return out;
}

at::Tensor read_tensor(const lf::safetensors::Reader& r, const std::string& name, at::ScalarType type,
                       const std::string& file) {
  for (const auto& info : r.tensors()) {
    if (info.name != name) continue;
    at::Tensor t = at::empty(info.shape, type);
    LF_CHECK(static_cast<size_t>(info.end - info.begin) == t.nbytes(), file, ": tensor ", name,
             " has the wrong dtype or size", lf::hint("rewrite the store with loongforge-data make-demo-reach"));
    std::memcpy(t.data_ptr(), r.data(info), t.nbytes());
    return t;
  }
  LF_FAIL(file, ": no tensor '", name, "'", lf::hint("rewrite the store with loongforge-data make-demo-reach"));
}

}  // namespace

std::vector<std::string> ReachPrompt::vocab() const {
  std::vector<std::string> v{"<pad>", "put", "the", "block", "on", "target"};
  for (const auto& c : reach_colours()) v.push_back(c);
  v.push_back("state");
  for (int64_t b = 0; b < state_bins; ++b) v.push_back("s" + std::to_string(b));
  if (position_queries)
    for (const char* q : kPositionQueries) v.push_back(q);
  if (scene_queries || located)
    for (const auto& q : scene_query_words()) v.push_back(q);
  return v;
}

std::pair<at::Tensor, at::Tensor> ReachPrompt::encode(const std::string& instruction, const at::Tensor& state) const {
  const auto words = vocab();
  auto id_of = [&](const std::string& w) -> int64_t {
    auto it = std::find(words.begin(), words.end(), w);
    LF_CHECK(it != words.end(), "reach prompt: the word '", w, "' of \"", instruction, "\" is not in the vocabulary",
             lf::hint("the reach task's instructions read \"put the <colour> block on the <colour> target\""));
    return it - words.begin();
  };
  std::vector<int64_t> ids;
  std::istringstream in(instruction);
  for (std::string w; in >> w;) ids.push_back(id_of(w));
  ids.push_back(id_of("state"));
  const at::Tensor s = state.to(at::kFloat).contiguous().view({-1});
  for (int64_t i = 0; i < s.numel(); ++i) ids.push_back(id_of(bin_word(s[i].item<float>())));
  if (position_queries)
    for (const char* q : kPositionQueries) ids.push_back(id_of(q));
  if (scene_queries)
    for (const auto& q : scene_query_words()) ids.push_back(id_of(q));
  if (located) {
    // The named objects' query words, then placeholders for their answers (set_answers).
    const auto [block, target] = instruction_colours(instruction);
    for (const char* q : {"_block_x", "_block_y"}) ids.push_back(id_of(block + q));
    for (const char* q : {"_target_x", "_target_y"}) ids.push_back(id_of(target + q));
    for (int i = 0; i < 4; ++i) ids.push_back(id_of(bin_word(0.0)));
  }
  LF_CHECK(static_cast<int64_t>(ids.size()) <= length, "reach prompt: \"", instruction, "\" and the state make ",
           ids.size(), " tokens, more than the prompt length ", length);
  at::Tensor t = at::zeros({length}, at::kLong), m = at::zeros({length}, at::kBool);
  for (size_t i = 0; i < ids.size(); ++i) t[static_cast<int64_t>(i)] = ids[i], m[static_cast<int64_t>(i)] = true;
  return {t, m};
}

std::string ReachPrompt::bin_word(double v) const {
  v = std::clamp(v, 0.0, 1.0);
  return "s" + std::to_string(std::min(state_bins - 1, static_cast<int64_t>(v * static_cast<double>(state_bins))));
}

at::Tensor ReachPrompt::query_labels(const at::Tensor& ids, const std::map<std::string, double>& positions) const {
  const auto words = vocab();
  const auto t = ids.to(at::kLong).contiguous().view({-1});
  at::Tensor labels = at::full({t.numel()}, -100, at::kLong);
  const int64_t* in = t.data_ptr<int64_t>();
  int64_t* out = labels.data_ptr<int64_t>();
  const auto scene = scene_query_words();
  for (const auto& [word, value] : positions) {
    const auto named = std::find(std::begin(kPositionQueries), std::end(kPositionQueries), word);
    const bool query = (position_queries && named != std::end(kPositionQueries)) ||
                       ((scene_queries || located) && std::find(scene.begin(), scene.end(), word) != scene.end());
    LF_CHECK(query, "reach prompt: '", word, "' is not a query word of this prompt");
    const int64_t id = std::find(words.begin(), words.end(), word) - words.begin();
    const int64_t bin = std::find(words.begin(), words.end(), bin_word(value)) - words.begin();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (in[i] == id) out[i] = bin;
  }
  return labels;
}

at::Tensor ReachPrompt::position_labels(const at::Tensor& ids, const std::array<double, 4>& positions) const {
  LF_CHECK(position_queries, "reach prompt: position labels need a prompt with position queries");
  const auto words = vocab();
  const auto t = ids.to(at::kLong).contiguous().view({-1});
  const int64_t* in = t.data_ptr<int64_t>();
  int found = 0;
  std::map<std::string, double> named;
  for (int q = 0; q < 4; ++q) {
    named[kPositionQueries[q]] = positions[static_cast<size_t>(q)];
    const int64_t id = std::find(words.begin(), words.end(), kPositionQueries[q]) - words.begin();
    found += static_cast<int>(std::count(in, in + t.numel(), id));
  }
  LF_CHECK(found == 4, "reach prompt: ", found, " position query words in the prompt, expected 4");
  return query_labels(ids, named);
}

at::Tensor ReachPrompt::scene_labels(const at::Tensor& ids, const ReachEnv& env) const {
  if (!has_queries()) return {};
  std::map<std::string, double> where;
  const auto& colours = reach_colours();
  if (position_queries || located) {
    // The instructed block and target (the scene has one of each colour).
    const auto named = named_positions(env);
    if (position_queries)
      for (size_t q = 0; q < 4; ++q) where[kPositionQueries[q]] = named[q];
    if (located) {
      const auto [block_colour, target_colour] = env.task();
      const std::string b = colours.at(static_cast<size_t>(block_colour)), t = colours.at(static_cast<size_t>(target_colour));
      where[b + "_block_x"] = named[0], where[b + "_block_y"] = named[1];
      where[t + "_target_x"] = named[2], where[t + "_target_y"] = named[3];
    }
  }
  if (scene_queries) {
    for (const auto& b : env.blocks()) {
      const std::string c = colours.at(static_cast<size_t>(b.colour));
      where[c + "_block_x"] = b.x, where[c + "_block_y"] = b.y;
    }
    for (const auto& t : env.targets()) {
      const std::string c = colours.at(static_cast<size_t>(t.colour));
      where[c + "_target_x"] = t.x, where[c + "_target_y"] = t.y;
    }
  }
  return query_labels(ids, where);
}

std::pair<std::string, std::string> ReachPrompt::instruction_colours(const std::string& instruction) const {
  std::vector<std::string> w;
  std::istringstream in(instruction);
  for (std::string x; in >> x;) w.push_back(x);
  const auto& colours = reach_colours();
  auto colour = [&](const std::string& c) { return std::find(colours.begin(), colours.end(), c) != colours.end(); };
  LF_CHECK(w.size() == 8 && w[0] == "put" && w[1] == "the" && colour(w[2]) && w[3] == "block" && w[4] == "on" &&
               w[5] == "the" && colour(w[6]) && w[7] == "target",
           "reach prompt: \"", instruction, "\" is not a reach instruction",
           lf::hint("the reach task's instructions read \"put the <colour> block on the <colour> target\""));
  return {w[2], w[6]};
}

std::array<int64_t, 4> ReachPrompt::located_slots(const at::Tensor& ids) const {
  LF_CHECK(located, "reach prompt: located slots need a prompt made with located answers");
  const auto words = vocab();
  const auto t = ids.to(at::kLong).contiguous().view({-1});
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t n = t.numel();
  const int64_t nw = static_cast<int64_t>(words.size());
  auto is = [&](int64_t i, const std::string& suffix) {
    if (p[i] < 0 || p[i] >= nw) return false;
    const auto& w = words[static_cast<size_t>(p[i])];
    return w.size() > suffix.size() && w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  auto is_bin = [&](int64_t i) {
    if (p[i] < 0 || p[i] >= nw) return false;
    const auto& w = words[static_cast<size_t>(p[i])];
    return w.size() > 1 && w[0] == 's' && std::all_of(w.begin() + 1, w.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // The last run of <colour>_block_x _block_y _target_x _target_y words followed by four bin words
  // (the scene queries, when present, come earlier and have no answers).
  for (int64_t i = n - 8; i >= 0; --i)
    if (is(i, "_block_x") && is(i + 1, "_block_y") && is(i + 2, "_target_x") && is(i + 3, "_target_y") &&
        is_bin(i + 4) && is_bin(i + 5) && is_bin(i + 6) && is_bin(i + 7))
      return {i, i + 1, i + 2, i + 3};
  LF_FAIL("reach prompt: no located queries (<colour>_block_x <colour>_block_y <colour>_target_x <colour>_target_y "
          "and four answers) among the ", n, " tokens");
}

at::Tensor ReachPrompt::ar_mask(const at::Tensor& ids) const {
  if (!located) return {};
  at::Tensor m = at::zeros({ids.numel()}, at::kBool);
  m[located_slots(ids)[3] + 1] = true;
  return m;
}

void ReachPrompt::set_answers(at::Tensor& ids, const std::array<double, 4>& values) const {
  const auto slots = located_slots(ids);
  const auto words = vocab();
  for (size_t i = 0; i < 4; ++i)
    ids[slots[3] + 1 + static_cast<int64_t>(i)] =
        static_cast<int64_t>(std::find(words.begin(), words.end(), bin_word(values[i])) - words.begin());
}

at::Tensor ReachPrompt::decode_state(const at::Tensor& ids) const {
  const auto words = vocab();
  const int64_t state_id = std::find(words.begin(), words.end(), "state") - words.begin();
  const int64_t s0 = state_id + 1;
  const auto t = ids.to(at::kLong).contiguous().view({-1});
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t n = t.numel();
  int64_t at_state = -1;
  for (int64_t i = 0; i < n && at_state < 0; ++i)
    if (p[i] == state_id) at_state = i;
  LF_CHECK(at_state >= 0, "reach prompt: no \"state\" word among the ", n, " tokens");
  std::vector<float> out;
  for (int64_t i = at_state + 1; i < n && p[i] >= s0 && p[i] < s0 + state_bins; ++i)
    out.push_back(static_cast<float>((static_cast<double>(p[i] - s0) + 0.5) / static_cast<double>(state_bins)));
  return at::tensor(out, at::kFloat);
}

at::Tensor normalize_reach_actions(const at::Tensor& a, double max_speed) {
  auto out = a.to(at::kFloat).clone();
  out.narrow(-1, 0, 2).div_(max_speed);
  out.narrow(-1, 2, 1).copy_(at::where(out.narrow(-1, 2, 1) > 0, 1.0, -1.0));
  return out;
}

at::Tensor unnormalize_reach_actions(const at::Tensor& a, double max_speed) {
  auto out = a.to(at::kFloat).clone();
  out.narrow(-1, 0, 2).clamp_(-1, 1).mul_(max_speed);
  return out;
}

ReachDemoMeta write_reach_demos(const std::string& dir, ReachDemoMeta meta) {
  LF_CHECK(meta.episodes > 0, "make-demo-reach: --episodes must be positive");
  fs::create_directories(dir);
  ReachOptions o;
  o.image_size = meta.image_size;
  o.max_speed = meta.max_speed;
  o.max_steps = meta.max_steps;
  ReachEnv env(o);
  ReachExpertPolicy expert(meta.chunk, meta.max_speed);
  std::vector<at::Tensor> images, tokens, masks, actions, episode, labels;
  int shard = 0;
  auto flush = [&] {
    if (images.empty()) return;
    const at::Tensor im = at::stack(images).contiguous(), tk = at::stack(tokens).contiguous(),
                     mk = at::stack(masks).to(at::kByte).contiguous(), ac = at::stack(actions).contiguous();
    const at::Tensor eps = at::stack(episode).contiguous();
    lf::safetensors::Writer w;
    using lf::safetensors::DType;
    w.add("images", DType::U8, im.sizes().vec(), im.data_ptr());
    w.add("prompt_tokens", DType::I64, tk.sizes().vec(), tk.data_ptr());
    w.add("prompt_masks", DType::U8, mk.sizes().vec(), mk.data_ptr());
    w.add("actions", DType::F32, ac.sizes().vec(), ac.data_ptr());
    w.add("episode", DType::I64, eps.sizes().vec(), eps.data_ptr());
    at::Tensor lb;
    if (meta.prompt.has_queries()) {
      lb = at::stack(labels).contiguous();
      w.add("prompt_labels", DType::I64, lb.sizes().vec(), lb.data_ptr());
    }
    char name[64];
    std::snprintf(name, sizeof name, "samples-%05d.safetensors", shard++);
    w.write((fs::path(dir) / name).string());
    meta.samples += im.size(0);
    images.clear(), tokens.clear(), masks.clear(), actions.clear(), episode.clear(), labels.clear();
  };
  // One sample: the observation, its prompt (and position labels), the expert's plan as the label.
  auto record = [&](const Observation& obs, const at::Tensor& plan, int64_t e) {
    images.push_back(obs.at("observation/image").permute({2, 0, 1}).contiguous());
    auto [ids, mask] = meta.prompt.encode(obs.prompt, obs.at("observation/state"));
    if (meta.prompt.located) meta.prompt.set_answers(ids, named_positions(env));  // the true answers
    tokens.push_back(ids);
    masks.push_back(mask);
    if (meta.prompt.has_queries()) labels.push_back(meta.prompt.scene_labels(ids, env));
    actions.push_back(normalize_reach_actions(plan, meta.max_speed));
    episode.push_back(at::scalar_tensor(e, at::kLong));
    if (static_cast<int64_t>(images.size()) == kShard) flush();
  };
  meta.samples = 0;
  LF_CHECK(meta.sample_every >= 1, "make-demo-reach: --sample-every must be at least 1");
  for (int64_t e = 0; e < meta.episodes; ++e) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(meta.seed * 7919 + static_cast<uint64_t>(e) + 1);
    const bool noisy = e % 2 == 1 && meta.noise > 0;
    Observation obs = env.reset(meta.seed + static_cast<uint64_t>(e));
    for (int64_t n = 0;; ++n) {
      const at::Tensor plan = expert.infer(obs);  // [chunk, 3]
      if ((n + e) % meta.sample_every == 0) record(obs, plan, e);
      at::Tensor act = plan[0].clone();
      if (noisy) act.narrow(0, 0, 2).add_(at::normal(0.0, meta.noise * meta.max_speed, {2}, gen, at::kFloat));
      auto step = env.step(act);
      if (step.done) break;
      obs = step.observation;
    }
  }
  flush();
  nlohmann::json j = {{"format", "loongforge reach demos v1"},
                      {"image_size", meta.image_size},
                      {"chunk", meta.chunk},
                      {"action_dim", meta.action_dim},
                      {"max_speed", meta.max_speed},
                      {"max_steps", meta.max_steps},
                      {"state_bins", meta.prompt.state_bins},
                      {"prompt_length", meta.prompt.length},
                      {"position_queries", meta.prompt.position_queries},
                      {"scene_queries", meta.prompt.scene_queries},
                      {"located", meta.prompt.located},
                      {"vocab", meta.prompt.vocab()},
                      {"seed", meta.seed},
                      {"episodes", meta.episodes},
                      {"samples", meta.samples},
                      {"noise", meta.noise},
                      {"sample_every", meta.sample_every},
                      {"shards", shard}};
  std::ofstream(fs::path(dir) / "meta.json") << j.dump(2) << "\n";
  return meta;
}

ReachDemoMeta read_reach_demo_meta(const std::string& dir) {
  const fs::path file = fs::path(dir) / "meta.json";
  std::ifstream in(file);
  LF_CHECK(in.good(), "reach demo store ", dir, ": no meta.json",
           lf::hint("make one with loongforge-data make-demo-reach --out DIR"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    LF_FAIL(file.string(), ": not JSON (", e.what(), ")");
  }
  LF_CHECK(j.value("format", std::string()) == "loongforge reach demos v1", file.string(),
           ": not a reach demo store (format ", j.value("format", std::string("missing")), ")");
  ReachDemoMeta m;
  try {
    m.image_size = j.at("image_size"), m.chunk = j.at("chunk"), m.action_dim = j.at("action_dim");
    m.max_speed = j.at("max_speed"), m.max_steps = j.at("max_steps");
    m.prompt.state_bins = j.at("state_bins"), m.prompt.length = j.at("prompt_length");
    m.prompt.position_queries = j.value("position_queries", false);  // absent in stores before them
    m.prompt.scene_queries = j.value("scene_queries", false);
    m.prompt.located = j.value("located", false);
    m.sample_every = j.value("sample_every", int64_t{1});
    m.seed = j.at("seed"), m.episodes = j.at("episodes"), m.samples = j.at("samples"), m.noise = j.at("noise");
    LF_CHECK(j.at("vocab").get<std::vector<std::string>>() == m.prompt.vocab(), file.string(),
             ": its vocabulary is not this program's reach prompt vocabulary");
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(file.string(), ": ", e.what());
  }
  return m;
}

ReachDemoStore::ReachDemoStore(const std::string& dir) : dir_(dir), meta_(read_reach_demo_meta(dir)) {
  std::vector<at::Tensor> im, tk, mk, ac, lb;
  for (int s = 0;; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "samples-%05d.safetensors", s);
    const fs::path file = fs::path(dir) / name;
    if (!fs::exists(file)) break;
    const auto r = lf::safetensors::Reader::open(file.string());
    im.push_back(read_tensor(r, "images", at::kByte, file.string()));
    tk.push_back(read_tensor(r, "prompt_tokens", at::kLong, file.string()));
    mk.push_back(read_tensor(r, "prompt_masks", at::kByte, file.string()).to(at::kBool));
    ac.push_back(read_tensor(r, "actions", at::kFloat, file.string()));
    if (meta_.prompt.has_queries()) {
      lb.push_back(read_tensor(r, "prompt_labels", at::kLong, file.string()));
      LF_CHECK(lb.back().sizes() == tk.back().sizes(), file.string(), ": prompt_labels ", lb.back().sizes(),
               " do not have the prompt_tokens' shape ", tk.back().sizes());
    }
    // Every shard's shapes as meta.json says (a stale or foreign shard is named, not mis-read).
    const int64_t n = im.back().size(0), S = meta_.image_size, L = meta_.prompt.length;
    const bool fits = im.back().sizes() == at::IntArrayRef({n, 3, S, S}) && tk.back().sizes() == at::IntArrayRef({n, L}) &&
                      mk.back().sizes() == at::IntArrayRef({n, L}) &&
                      ac.back().sizes() == at::IntArrayRef({n, meta_.chunk, meta_.action_dim});
    LF_CHECK(fits, file.string(), ": images ", im.back().sizes(), ", prompt_tokens ", tk.back().sizes(),
             ", prompt_masks ", mk.back().sizes(), ", actions ", ac.back().sizes(), " do not fit meta.json (",
             S, "x", S, " images, prompts of ", L, ", chunks of ", meta_.chunk, " x ", meta_.action_dim, ")",
             lf::hint("rewrite the store with loongforge-data make-demo-reach into an empty directory"));
  }
  LF_CHECK(!im.empty(), "reach demo store ", dir, ": no samples-00000.safetensors");
  images_ = at::cat(im), tokens_ = at::cat(tk), masks_ = at::cat(mk), actions_ = at::cat(ac);
  if (!lb.empty()) labels_ = at::cat(lb);
  if (meta_.prompt.located) {  // each prompt's answer block (a store's prompts all place it alike)
    std::vector<at::Tensor> ar;
    for (int64_t i = 0; i < tokens_.size(0); ++i) ar.push_back(meta_.prompt.ar_mask(tokens_[i]));
    ar_masks_ = at::stack(ar);
  }
  LF_CHECK(images_.size(0) == meta_.samples, "reach demo store ", dir, ": meta.json counts ", meta_.samples,
           " samples, the shards hold ", images_.size(0));
}

ReachDemoSample ReachDemoStore::get(int64_t i) const {
  LF_CHECK(i >= 0 && i < size(), "reach demo store ", dir_, ": sample ", i, " out of range (", size(), ")");
  return {images_[i], tokens_[i], masks_[i], actions_[i], labels_.defined() ? labels_[i] : at::Tensor(),
          ar_masks_.defined() ? ar_masks_[i] : at::Tensor()};
}

}  // namespace lf::vla
