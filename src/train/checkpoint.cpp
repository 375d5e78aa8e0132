// The save/load protocol of a training job. Who writes what (pieces are never duplicated), per
// parameter group (files of groups other than "model" carry the group's name: model_<g>_tp..):
//   model_tp{t}_pp{p}.safetensors       by the DP-rank-0 rank of each (tp, pp) of the group's
//                                       layout: its parameter shards (replicated parameters by
//                                       TP rank 0 only);
//   optim_tp{t}_pp{p}_dp{d}.safetensors the fp32 masters and moments this rank owns: under
//                                       ZeRO-1 every DP rank its ranges, else DP rank 0;
//   rng_rank{g}.safetensors             every rank: backend generator + dropout streams;
//   state.json, config.yaml             rank 0; manifest.json: rank 0 at commit, from the
//                                       fragment.rank{g}.json each rank leaves (size + CRC).
// Commit (rank 0, after every rank reported success): manifest, fsync, rename of the temp dir,
// tracker last. A crash at any point leaves the tracker naming a complete checkpoint.
#include "loongforge/train/checkpoint.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/train/checkpoint_format.h"
#include "checkpoint_internal.h"

namespace lf::train {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace lf::train::ckpt;

namespace {

at::Tensor host_copy(const at::Tensor& t, bool own) {
  at::Tensor c = t.detach();
  if (!c.device().is_cpu()) return c.to(at::kCPU).contiguous().reshape({-1});
  c = c.contiguous().reshape({-1});
  return own ? c.clone() : c;
}

// Element-wise max (or min) over the world; identity for one rank.
std::vector<double> world_reduce(const lf::dist::ParallelContext& ctx, const lf::backend::DeviceBackend& b,
                                 std::vector<double> v, lf::backend::ReduceOp op) {
  if (ctx.world_size() == 1) return v;
  auto t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(b.device());
  ctx.world().all_reduce(t, op);
  t = t.cpu();
  for (size_t i = 0; i < v.size(); ++i) v[i] = t[static_cast<int64_t>(i)].item<double>();
  return v;
}

std::string rng_file(int rank) { return "rng_rank" + std::to_string(rank) + ".safetensors"; }

}  // namespace

namespace ckpt {

std::string model_file(int tp, int pp, const std::string& group) {
  const std::string infix = group == "model" ? "" : group + "_";
  return "model_" + infix + "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + ".safetensors";
}
std::string fp8_file(int pp, const std::string& group, int tp) {
  const std::string infix = group == "model" ? "" : group + "_";
  return "fp8_" + infix + "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + ".safetensors";
}
std::string optim_file(int tp, int pp, int dp, const std::string& group) {
  const std::string infix = group == "model" ? "" : group + "_";
  return "optim_" + infix + "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
         ".safetensors";
}

void prepare_save_dir(const std::string& save_dir, int64_t iteration) {
  fs::create_directories(save_dir);
  // Leftovers of interrupted saves and deletions; a checkpoint moved aside for a re-save of the
  // same iteration is moved back if the new one never arrived.
  for (const auto& e : fs::directory_iterator(save_dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.starts_with("iter_") && n.ends_with(".tmp")) fs::remove_all(e.path());
    if (n.starts_with(".iter_") && n.ends_with(".deleting")) fs::remove_all(e.path());
    if (n.starts_with(".iter_") && n.ends_with(".old")) {
      const std::string orig = n.substr(1, n.size() - 5);
      if (fs::exists(fs::path(save_dir) / orig)) fs::remove_all(e.path());
      else fs::rename(e.path(), fs::path(save_dir) / orig);
    }
  }
  fs::create_directories(temp_dir(save_dir, iteration));
}

std::string temp_dir(const std::string& save_dir, int64_t iteration) {
  return (fs::path(save_dir) / (iteration_dir_name(iteration) + ".tmp")).string();
}

void commit_checkpoint(const std::string& save_dir, int64_t iteration,
                       const std::map<std::string, FileRecord>& files, std::optional<int64_t> keep_last,
                       SaveHooks* hooks) {
  const std::string tmp = temp_dir(save_dir, iteration);
  json m;
  m["format"] = "loongforge-checkpoint";
  m["version"] = kFormatVersion;
  m["iteration"] = iteration;
  m["files"] = json::object();
  for (const auto& [name, r] : files) m["files"][name] = {{"bytes", r.bytes}, {"crc32", r.crc32}};
  write_text((fs::path(tmp) / kManifestFile).string(), m.dump(1) + "\n");
  save_point(hooks, "manifest written");
  fsync_dir(tmp);
  const fs::path final_dir = fs::path(save_dir) / iteration_dir_name(iteration);
  const fs::path old = fs::path(save_dir) / ("." + iteration_dir_name(iteration) + ".old");
  if (fs::exists(final_dir)) {  // a re-save of the same iteration: move the old one aside first
    fs::remove_all(old);
    durable_rename(final_dir.string(), old.string());
  }
  durable_rename(tmp, final_dir.string());
  save_point(hooks, "renamed");
  fs::remove_all(old);
  write_tracker(save_dir, iteration);
  save_point(hooks, "tracker written");
  if (!keep_last || *keep_last <= 0) return;
  std::vector<int64_t> its;
  for (const auto& e : fs::directory_iterator(save_dir))
    if (auto it = parse_iteration_dir(e.path().filename().string()); it && e.is_directory()) its.push_back(*it);
  std::sort(its.rbegin(), its.rend());
  for (size_t i = static_cast<size_t>(*keep_last); i < its.size(); ++i) {
    if (its[i] == iteration) continue;
    // Renamed first, so a half-deleted directory never looks like a checkpoint.
    const fs::path dead = fs::path(save_dir) / ("." + iteration_dir_name(its[i]) + ".deleting");
    fs::rename(fs::path(save_dir) / iteration_dir_name(its[i]), dead);
    fs::remove_all(dead);
  }
}

FileRecord write_file(const std::string& dir, const std::string& name, const std::vector<Entry>& entries,
                      SaveHooks* hooks) {
  auto r = write_entries((fs::path(dir) / name).string(), entries);
  save_point(hooks, name.c_str());
  return r;
}

}  // namespace ckpt

// ---------------------------------------------------------------------------------------------

struct CheckpointSaver::Pending {
  int64_t iteration = 0;
  std::thread thread;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  std::map<std::string, FileRecord> rank0_files;  // rank 0's own records (the others via fragments)
};

CheckpointSaver::CheckpointSaver(SaveOptions options, const lf::dist::ParallelContext& ctx,
                                 const lf::backend::DeviceBackend& backend)
    : options_(std::move(options)), ctx_(ctx), backend_(backend) {
  LF_CHECK(!options_.save_dir.empty(), "checkpoint saving needs a directory (--save)");
}

CheckpointSaver::~CheckpointSaver() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
}

bool CheckpointSaver::pending() const { return pending_ != nullptr; }

void CheckpointSaver::save(const TrainingProgress& progress, const std::vector<CheckpointGroup>& groups,
                           const Optimizer* optimizer, const std::map<std::string, at::Tensor>& rng,
                           const LossScaler* scaler) {
  if (pending_) commit();
  const int rank = ctx_.global_rank();
  const std::string tmp = temp_dir(options_.save_dir, progress.iteration);
  // Rank 0 prepares the temp directory; everyone learns whether that worked.
  std::string prep_error;
  if (rank == 0) {
    try {
      prepare_save_dir(options_.save_dir, progress.iteration);
    } catch (const std::exception& e) {
      prep_error = e.what();
    }
  }
  const double prep_ok = world_reduce(ctx_, backend_, {prep_error.empty() ? 1.0 : 0.0},
                                      lf::backend::ReduceOp::min)[0];
  LF_CHECK(prep_ok > 0, "cannot prepare checkpoint directory ", tmp,
           prep_error.empty() ? std::string(" (failed on rank 0)") : ": " + prep_error,
           lf::hint("check that --save names a writable directory on a file system every rank sees"));

  // This rank's share, as CPU tensors (copies when written in the background).
  const bool own = options_.async;
  std::vector<std::pair<std::string, std::vector<Entry>>> files;
  at::NoGradGuard no_grad;
  const bool with_optimizer = optimizer && options_.save_optimizer;
  bool any_zero1 = false;
  std::vector<std::string> names;
  for (const auto& g : groups) {
    const auto& gctx = *g.context;
    const int tpr = gctx.tp_rank(), ppr = gctx.pp_rank();
    // Delayed FP8 scaling: equal on every TP/DP/CP rank of the stage that holds the same weights
    // (reduced each step); one copy, also of a frozen base's (the run's own state, not the base
    // checkpoint's). Experts over EP ranks: each EP rank's part of the whole weight's columns.
    if (g.fp8 && gctx.dp_rank() == 0 && gctx.cp_rank() == 0) {
      std::vector<Entry> f;
      // Every part of a weight in parts (the whole is read back from all of them), even one whose
      // experts had no tokens yet; of the others those in use.
      const auto used = g.fp8->used();
      for (const auto& entry : g.fp8->entries()) {
        const auto* e = &entry;
        if (e->parts == 1 && std::find(used.begin(), used.end(), e) == used.end()) continue;
        if (tpr % (gctx.tp_size() / e->parts) != 0) continue;  // TP ranks beside the part's first
        auto [h, sc] = g.fp8->state(*e);
        const int part = static_cast<int>(e->part), parts = static_cast<int>(e->parts);
        ShardSpec hs{{h.size(0), h.size(1) * parts}, 1}, ss{{sc.size(0) * parts}, 0};
        hs.tp_rank = ss.tp_rank = part;
        hs.tp_size = ss.tp_size = parts;
        f.push_back({Piece{e->name, "fp8_amax_history", hs, 0, h.numel()}, h.reshape({-1})});
        f.push_back({Piece{e->name, "fp8_scale", ss, 0, sc.numel()}, sc});
      }
      if (!f.empty()) files.emplace_back(fp8_file(ppr, g.name, tpr), std::move(f));
    }
    if (g.from_base) continue;  // the base checkpoint holds these
    for (const auto& p : *g.params) names.push_back(p.name);
    // One writer per (tp, pp) of the group's layout: its data-parallel rank 0.
    if (gctx.dp_rank() == 0 && gctx.cp_rank() == 0) {
      std::vector<Entry> model;
      for (size_t i = 0; i < g.params->size(); ++i) {
        const auto& p = (*g.params)[i];
        // The last pipeline stage's tied copy of the embedding equals the first stage's (their
        // gradients are summed): stored once, by the first stage; loading fills both by name.
        if (p.tied_copy) continue;
        if (!p.is_split() && p.tp_rank != 0) continue;  // replicated: TP rank 0 stores it
        model.push_back({Piece{p.name, "param", ShardSpec::of(p), 0, p.tensor.numel()}, host_copy(p.tensor, own)});
        if (g.ema)
          model.push_back({Piece{p.name, "ema", ShardSpec::of(p), 0, p.tensor.numel()}, host_copy((*g.ema)[i], own)});
      }
      if (!model.empty()) files.emplace_back(model_file(tpr, ppr, g.name), std::move(model));
    }
    if (!with_optimizer || g.buffer < 0) continue;
    const auto& st = optimizer->buffers()[static_cast<size_t>(g.buffer)];
    const GradBuffer& grads = *st.grads;
    const bool zero1 = grads.options().distributed_optimizer && grads.dp_size() > 1;
    any_zero1 = any_zero1 || zero1;
    if (!zero1 && grads.dp_rank() != 0) continue;
    std::vector<Entry> optim;
    const auto& params = grads.parameters();
    const auto kinds = optimizer->moment_kinds();
    for (const auto& piece : grads.owned_pieces()) {
      const auto& p = params[static_cast<size_t>(piece.param)];
      if (p.tied_copy) continue;  // the first stage stores the tied embedding's state
      if (!p.is_split() && p.tp_rank != 0) continue;
      const ShardSpec spec = ShardSpec::of(p);
      const auto b = static_cast<size_t>(piece.bucket);
      auto add = [&](const std::string& kind) {
        const at::Tensor& state = optimizer->state(static_cast<size_t>(g.buffer), kind)[b];
        optim.push_back({Piece{p.name, kind, spec, piece.param_offset, piece.param_offset + piece.numel},
                         host_copy(state.narrow(0, piece.reduced_offset, piece.numel), own)});
      };
      add("master");
      for (const auto& k : kinds) add(k);
    }
    if (!optim.empty()) files.emplace_back(optim_file(tpr, ppr, grads.dp_rank(), g.name), std::move(optim));
  }
  if (options_.save_rng) {
    std::vector<Entry> rngs;
    auto add_bytes = [&](const std::string& key, at::Tensor bytes) {
      bytes = bytes.to(at::kCPU).contiguous().reshape({-1}).clone();
      rngs.push_back({Piece{key, "rng", ShardSpec{{bytes.numel()}}, 0, bytes.numel()}, bytes});
    };
    const auto state = backend_.rng_state();
    at::Tensor t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(t.data_ptr(), state.data(), state.size());
    add_bytes("backend", t);
    for (const auto& [name, st] : rng) add_bytes("tracker." + name, st);
    files.emplace_back(rng_file(rank), std::move(rngs));
  }
  std::vector<std::pair<std::string, std::string>> texts;
  if (rank == 0) {
    json s;
    s["iteration"] = progress.iteration;
    s["consumed_samples"] = progress.consumed_samples;
    s["optimizer_steps"] = progress.optimizer_steps;
    s["lr"] = progress.lr;
    s["has_optimizer"] = with_optimizer;
    s["optimizer"] = optimizer ? optimizer->name() : std::string("none");
    s["has_rng"] = options_.save_rng;
    s["layout"] = {{"world", ctx_.world_size()}, {"tp", ctx_.tp_size()}, {"pp", ctx_.pp_size()},
                   {"dp", ctx_.dp_size()}, {"cp", ctx_.cp_size()}, {"zero1", any_zero1}};
    s["training"] = {{"global_batch_size", options_.global_batch_size}, {"seq_length", options_.seq_length}};
    if (scaler && scaler->active()) {
      const auto ls = scaler->state();
      s["loss_scaler"] = {{"scale", ls.scale}, {"growth_tracker", ls.growth_tracker},
                          {"hysteresis_tracker", ls.hysteresis_tracker}};
    }
    s["params"] = names;
    if (options_.base) s["base"] = {{"dir", options_.base->dir}, {"manifest_crc32", options_.base->manifest_crc32}};
    texts.emplace_back(kStateFile, s.dump(1) + "\n");
    texts.emplace_back(kConfigFile, options_.config_yaml);
  }

  pending_ = std::make_unique<Pending>();
  pending_->iteration = progress.iteration;
  Pending* pd = pending_.get();
  auto work = [pd, tmp, rank, hooks = options_.hooks, files = std::move(files), texts = std::move(texts)]() {
    try {
      std::map<std::string, FileRecord> records;
      for (const auto& [name, entries] : files) records[name] = write_file(tmp, name, entries, hooks);
      for (const auto& [name, text] : texts) records[name] = write_text((fs::path(tmp) / name).string(), text);
      if (rank == 0) {
        pd->rank0_files = records;
      } else {
        json frag = json::object();
        for (const auto& [name, r] : records) frag[name] = {{"bytes", r.bytes}, {"crc32", r.crc32}};
        write_text((fs::path(tmp) / ("fragment.rank" + std::to_string(rank) + ".json")).string(),
                   frag.dump());
      }
    } catch (...) {
      pd->error = std::current_exception();
    }
    pd->done.store(true);
  };
  if (options_.async) {
    pending_->thread = std::thread(std::move(work));
  } else {
    work();
    commit();
  }
}

void CheckpointSaver::commit() {
  Pending& pd = *pending_;
  if (pd.thread.joinable()) pd.thread.join();
  std::string local_error;
  if (pd.error) {
    try {
      std::rethrow_exception(pd.error);
    } catch (const std::exception& e) {
      local_error = e.what();
    }
  }
  const int64_t iteration = pd.iteration;
  std::map<std::string, FileRecord> files = std::move(pd.rank0_files);
  pending_.reset();
  const double wrote = world_reduce(ctx_, backend_, {local_error.empty() ? 1.0 : 0.0},
                                    lf::backend::ReduceOp::min)[0];
  std::string commit_error;
  if (ctx_.global_rank() == 0 && wrote > 0) {
    try {
      const std::string tmp = temp_dir(options_.save_dir, iteration);
      for (int r = 1; r < ctx_.world_size(); ++r) {
        const fs::path frag = fs::path(tmp) / ("fragment.rank" + std::to_string(r) + ".json");
        std::ifstream in(frag);
        LF_CHECK(in.good(), "rank ", r, "'s part of checkpoint ", tmp, " is missing (", frag.string(), ")",
                 lf::hint("every rank must see the same --save directory (a shared file system)"));
        json j = json::parse(in);
        for (const auto& [name, rec] : j.items())
          files[name] = FileRecord{rec.at("bytes").get<uint64_t>(), rec.at("crc32").get<uint32_t>()};
        in.close();
        fs::remove(frag);
      }
      commit_checkpoint(options_.save_dir, iteration, files, options_.keep_last, options_.hooks);
    } catch (const std::exception& e) {
      commit_error = e.what();
    }
  }
  const double committed = world_reduce(ctx_, backend_, {commit_error.empty() ? 1.0 : 0.0},
                                        lf::backend::ReduceOp::min)[0];
  LF_CHECK(local_error.empty(), "saving checkpoint iteration ", iteration, " failed: ", local_error);
  LF_CHECK(wrote > 0, "saving checkpoint iteration ", iteration, " failed on another rank (see its log)");
  LF_CHECK(committed > 0, "committing checkpoint iteration ", iteration, " failed",
           commit_error.empty() ? std::string(" on rank 0") : ": " + commit_error);
  last_committed_ = iteration;
  if (ctx_.global_rank() == 0)
    LF_INFO("saved checkpoint ", (fs::path(options_.save_dir) / iteration_dir_name(iteration)).string());
}

bool CheckpointSaver::step_end(bool stop_requested) {
  const bool busy = pending_ && !pending_->done.load();
  auto flags = world_reduce(ctx_, backend_, {stop_requested ? 1.0 : 0.0, busy ? 1.0 : 0.0},
                            lf::backend::ReduceOp::max);
  if (pending_ && flags[1] == 0) commit();
  return flags[0] > 0;
}

void CheckpointSaver::finish() {
  if (pending_) commit();
}

// ---------------------------------------------------------------------------------------------

BaseCheckpoint base_checkpoint_of(const std::string& load_dir) {
  auto dir = resolve_checkpoint_dir(load_dir);
  LF_CHECK(dir.has_value(), "base checkpoint ", load_dir, " holds no checkpoint (no ", kTrackerFile, " or ",
           kManifestFile, ")", lf::hint("pass the directory a training run or loongforge-convert hf2lf saved to"));
  const fs::path manifest = fs::path(*dir) / kManifestFile;
  std::ifstream in(manifest, std::ios::binary);
  LF_CHECK(in.good(), "base checkpoint ", *dir, ": cannot read ", manifest.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {fs::absolute(*dir).lexically_normal().string(), crc32_of(bytes.data(), bytes.size())};
}

std::optional<BaseCheckpoint> checkpoint_base(const std::string& checkpoint_dir) {
  CheckpointReader reader(checkpoint_dir);
  json state;
  try {
    state = json::parse(reader.state_json());
  } catch (const json::exception& e) {
    LF_FAIL("checkpoint ", checkpoint_dir, ": state.json is missing or malformed: ", e.what());
  }
  if (!state.contains("base")) return std::nullopt;
  const auto& b = state["base"];
  return BaseCheckpoint{b.value("dir", std::string()), b.value("manifest_crc32", uint32_t{0})};
}

std::optional<BaseCheckpoint> verified_checkpoint_base(const std::string& checkpoint_dir) {
  auto base = checkpoint_base(checkpoint_dir);
  if (!base) return base;
  std::optional<BaseCheckpoint> now;
  try {
    now = base_checkpoint_of(base->dir);
  } catch (const lf::Error& e) {
    LF_FAIL("the LoRA checkpoint ", checkpoint_dir, " names the base ", base->dir, ", which cannot be read: ",
            e.message(), lf::hint("restore the base checkpoint at that path (the adapters are only meaningful on it)"));
  }
  LF_CHECK(now->manifest_crc32 == base->manifest_crc32, "the LoRA checkpoint ", checkpoint_dir,
           " was trained on the base ", base->dir, " (manifest CRC-32 ", base->manifest_crc32,
           "), which now holds different weights (CRC-32 ", now->manifest_crc32, ")",
           lf::hint("restore the original base checkpoint; adapters trained on other weights do not transfer"));
  return base;
}

std::optional<LoadResult> load_checkpoint(const std::string& load_dir, const LoadOptions& options,
                                          const std::vector<CheckpointGroup>& groups, Optimizer& optimizer,
                                          const lf::dist::ParallelContext& ctx,
                                          const lf::backend::DeviceBackend& backend,
                                          const std::map<std::string, at::Tensor>& rng_names) {
  auto dir = resolve_checkpoint_dir(load_dir);
  if (!dir) return std::nullopt;
  CheckpointReader reader(*dir);
  json state;
  try {
    state = json::parse(reader.state_json());
  } catch (const json::exception& e) {
    LF_FAIL("checkpoint ", *dir, ": state.json is missing or malformed: ", e.what());
  }
  LoadResult result;
  result.dir = *dir;
  at::NoGradGuard no_grad;
  const bool has_optim = state.value("has_optimizer", false);
  const bool want_optim = options.load_optimizer && !options.finetune;
  LF_CHECK(!want_optim || has_optim, "checkpoint ", *dir, " has no optimizer state",
           lf::hint("pass --no-load-optim (fresh optimizer, keeps the iteration) or --finetune "
                    "(weights only, iteration 0)"));
  const std::string saved_optimizer = state.value("optimizer", std::string("adam"));
  LF_CHECK(!want_optim || saved_optimizer == optimizer.name(), "checkpoint ", *dir, " holds the state of optimizer '",
           saved_optimizer, "', this run uses '", optimizer.name(), "'",
           lf::hint("use --optimizer " + saved_optimizer + ", or --no-load-optim to start the optimizer afresh"));
  // Weights: always (under ZeRO-1 publish() only rewrites them from the masters afterwards).
  for (const auto& g : groups)
    for (const auto& p : *g.params)
      p.tensor.detach().copy_(reader.shard(p.name, "param", ShardSpec::of(p), p.tensor.scalar_type()));
  // EMA weights: the checkpoint's (not under --finetune), else the weights just loaded.
  for (const auto& g : groups) {
    if (!g.ema) continue;
    for (size_t i = 0; i < g.params->size(); ++i) {
      const auto& p = (*g.params)[i];
      at::Tensor& e = (*g.ema)[i];
      if (!options.finetune && reader.has(p.name, "ema"))
        e.copy_(reader.shard(p.name, "ema", ShardSpec::of(p), at::kFloat));
      else
        e.copy_(p.tensor.detach().to(at::kFloat));
    }
  }
  if (want_optim) {
    std::vector<std::string> kinds = optimizer.moment_kinds();
    kinds.insert(kinds.begin(), "master");
    for (const auto& g : groups) {
      if (g.buffer < 0) continue;
      const GradBuffer& grads = *optimizer.buffers()[static_cast<size_t>(g.buffer)].grads;
      const auto& params = grads.parameters();
      std::map<int, std::vector<const lf::parallel::OwnedPiece*>> by_param;
      for (const auto& piece : grads.owned_pieces()) by_param[piece.param].push_back(&piece);
      for (const auto& [pi, pieces] : by_param) {
        const auto& p = params[static_cast<size_t>(pi)];
        const ShardSpec want = ShardSpec::of(p);
        for (const auto& kind : kinds) {
          at::Tensor flat = reader.shard(p.name, kind, want, at::kFloat).reshape({-1});
          auto& dst = optimizer.state(static_cast<size_t>(g.buffer), kind);
          for (const auto* piece : pieces)
            dst[static_cast<size_t>(piece->bucket)]
                .narrow(0, piece->reduced_offset, piece->numel)
                .copy_(flat.narrow(0, piece->param_offset, piece->numel));
        }
      }
    }
    optimizer.set_steps_taken(state.value("optimizer_steps", int64_t{0}));
    optimizer.publish();
    result.optimizer_loaded = true;
    if (state.contains("loss_scaler")) {
      const auto& ls = state["loss_scaler"];
      result.loss_scaler = LossScaler::State{ls.value("scale", 1.0), ls.value("growth_tracker", int64_t{0}),
                                             ls.value("hysteresis_tracker", int64_t{0})};
    }
  } else {
    optimizer.reset_masters_from_model();
  }
  if (!options.finetune) {
    result.progress.iteration = state.value("iteration", reader.iteration());
    result.progress.consumed_samples = state.value("consumed_samples", int64_t{0});
    result.progress.optimizer_steps = result.optimizer_loaded ? state.value("optimizer_steps", int64_t{0}) : 0;
    result.progress.lr = state.value("lr", 0.0);
  }
  if (options.load_rng && !options.finetune && state.value("has_rng", false)) {
    const auto& l = state.at("layout");
    const bool same = l.value("world", 0) == ctx.world_size() && l.value("tp", 0) == ctx.tp_size() &&
                      l.value("pp", 0) == ctx.pp_size() && l.value("dp", 0) == ctx.dp_size();
    const std::string file = rng_file(ctx.global_rank());
    if (same && reader.has_file(file)) {
      backend.set_rng_state(reader.bytes(file, "backend"));
      bool complete = true;
      for (const auto& [name, t] : rng_names) {
        if (!reader.has("tracker." + name, "rng")) {
          complete = false;
          break;
        }
        auto b = reader.bytes(file, "tracker." + name);
        at::Tensor s = at::empty({static_cast<int64_t>(b.size())}, at::kByte);
        std::memcpy(s.data_ptr(), b.data(), b.size());
        result.rng[name] = s;
      }
      if (!complete) result.rng.clear();
      result.rng_loaded = true;
    } else if (ctx.global_rank() == 0) {
      LF_WARN("checkpoint ", *dir, " was saved with another parallel layout: random number generator "
              "states are not restored (seeded from --seed instead)");
    }
  }
  return result;
}

bool load_fp8_scaling(const std::string& checkpoint_dir, const std::vector<CheckpointGroup>& groups) {
  CheckpointReader reader(checkpoint_dir);
  const bool has_state = !reader.params("fp8_scale").empty();
  for (const auto& g : groups) {
    if (!g.fp8) continue;
    for (const auto& e : g.fp8->entries()) {
      if (!reader.has(e.name, "fp8_amax_history") || !reader.has(e.name, "fp8_scale")) continue;
      g.fp8->set_state(e, reader.full(e.name, "fp8_amax_history").to(at::kFloat),
                       reader.full(e.name, "fp8_scale").to(at::kFloat), "checkpoint " + checkpoint_dir);
    }
  }
  // Weights this rank runs in FP8 that the checkpoint has no state for are named after the first
  // step (also on a rank that read none: e.g. a stage whose layers were all kept out of FP8).
  if (has_state)
    for (const auto& g : groups)
      if (g.fp8) g.fp8->expect_state_from("checkpoint " + checkpoint_dir);
  return has_state;
}

// ---------------------------------------------------------------------------------------------

void install_sigterm_handler() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { sigterm_flag() = 1; };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool sigterm_received() { return sigterm_flag() != 0; }

volatile std::sig_atomic_t& ckpt::sigterm_flag() {
  static volatile std::sig_atomic_t flag = 0;
  return flag;
}

}  // namespace lf::train
