// Offline checkpoint writing (single process, CPU): model-only checkpoints from full tensors (the
// HF converter), reading them back whole, and resharding a checkpoint to another layout. Every
// output goes through the same temp-dir + manifest + rename + tracker commit as training saves.
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint_internal.h"
#include "loongforge/core/error.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::train {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace lf::train::ckpt;

namespace {

// decoder.layers.<i>.... -> i, else -1.
int64_t layer_of(const std::string& name) {
  const std::string pre = "decoder.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  size_t i = pre.size();
  int64_t v = 0;
  bool any = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0'), any = true;
  return any ? v : -1;
}

// Megatron's even split of layers over stages; embedding on the first, head on the last.
int stage_of(const std::string& name, int64_t num_layers, int pp) {
  if (pp == 1) return 0;
  const int64_t l = layer_of(name);
  if (l >= 0) return static_cast<int>(l / (num_layers / pp));
  if (name.starts_with("decoder.final_layernorm") || name.starts_with("output_layer")) return pp - 1;
  return 0;
}

using Split = lf::parallel::Sharding;

using FullFn = std::function<at::Tensor(const std::string& name, const std::string& kind)>;

// Writes the tensors of `kinds` for every name, split for tp x pp ("param" into model files, the
// optimizer kinds into dp contiguous ranges of each shard), one output file at a time.
void write_split(const std::string& tmp, const std::vector<std::string>& names,
                 const std::map<std::string, Split>& splits, const std::vector<std::string>& kinds,
                 const FullFn& full_of, int tp, int pp, int dp, std::map<std::string, FileRecord>& records,
                 SaveHooks* hooks = nullptr) {
  int64_t num_layers = 0;
  for (const auto& n : names) num_layers = std::max(num_layers, layer_of(n) + 1);
  LF_CHECK(pp == 1 || (num_layers > 0 && num_layers % pp == 0), "cannot split ", num_layers,
           " layers over ", pp, " pipeline stages", lf::hint("choose --pp dividing the number of layers"));
  for (int ppr = 0; ppr < pp; ++ppr)
    for (int tpr = 0; tpr < tp; ++tpr) {
      std::vector<Entry> model;
      std::vector<std::vector<Entry>> optim(static_cast<size_t>(dp));
      for (const auto& name : names) {
        if (stage_of(name, num_layers, pp) != ppr) continue;
        const Split sp = splits.at(name);
        if (sp.dim < 0 && tpr != 0) continue;  // replicated: TP rank 0 stores it
        for (const auto& kind : kinds) {
          at::Tensor full = full_of(name, kind);
          if (!full.defined()) continue;
          full = full.detach().to(at::kCPU).contiguous();
          ShardSpec s;
          s.global_shape = full.sizes().vec();
          if (sp.dim >= 0) {  // recorded even at TP 1 (reshard needs it)
            LF_CHECK(sp.dim < full.dim(), name, ": split dim ", sp.dim, " of a ", full.dim(), "-d tensor");
            const int64_t size = full.size(sp.dim), unit = sp.blocks * tp;
            if (size % unit != 0 && sp.vocab && sp.dim == 0 && sp.blocks == 1) {
              // Vocabulary rows: pad with zero rows (the loader adapts padding to its layout).
              auto shape = s.global_shape;
              shape[0] = (size + unit - 1) / unit * unit;
              at::Tensor padded = at::zeros(shape, full.options());
              padded.narrow(0, 0, size).copy_(full);
              full = padded;
              s.global_shape = shape;
            }
            s.partition_dim = sp.dim;
            s.blocks = sp.blocks;
            s.vocab = sp.vocab;
            s.tp_rank = tpr;
            s.tp_size = tp;
          }
          s.validate(name);
          at::Tensor local = cut_shard(full, s).reshape({-1});
          const int64_t n = local.numel();
          if (kind == "param" || kind == "ema") {
            model.push_back({Piece{name, kind, s, 0, n}, local});
            continue;
          }
          for (int d = 0; d < dp; ++d) {
            const int64_t b = n * d / dp, e = n * (d + 1) / dp;
            if (e > b) optim[static_cast<size_t>(d)].push_back({Piece{name, kind, s, b, e}, local.narrow(0, b, e - b)});
          }
        }
      }
      if (!model.empty()) records[model_file(tpr, ppr)] = write_file(tmp, model_file(tpr, ppr), model, hooks);
      for (int d = 0; d < dp; ++d)
        if (!optim[static_cast<size_t>(d)].empty())
          records[optim_file(tpr, ppr, d)] = write_file(tmp, optim_file(tpr, ppr, d), optim[static_cast<size_t>(d)], hooks);
    }
}

}  // namespace

void write_model_checkpoint(const std::string& save_dir, int64_t iteration,
                            const std::vector<std::pair<std::string, at::Tensor>>& full_tensors,
                            const std::map<std::string, lf::parallel::Sharding>& shardings,
                            const std::string& config_yaml, int tp, int pp, SaveHooks* hooks) {
  LF_CHECK(tp >= 1 && pp >= 1, "write_model_checkpoint: tp ", tp, " and pp ", pp, " must be >= 1");
  LF_CHECK(iteration >= 0, "write_model_checkpoint: negative iteration ", iteration);
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> by_name;
  std::vector<std::string> names;
  for (const auto& [n, t] : full_tensors) {
    LF_CHECK(t.defined(), "write_model_checkpoint: tensor ", n, " is undefined");
    LF_CHECK(by_name.emplace(n, t).second, "write_model_checkpoint: tensor ", n, " given twice");
    names.push_back(n);
  }
  std::map<std::string, Split> splits;
  for (const auto& n : names) {
    auto it = shardings.find(n);
    LF_CHECK(it != shardings.end(), "write_model_checkpoint: tensor ", n, " is not a parameter of the model",
             lf::hint("the tensors belong to another model configuration"));
    splits[n] = it->second;
  }
  prepare_save_dir(save_dir, iteration);
  const std::string tmp = temp_dir(save_dir, iteration);
  std::map<std::string, FileRecord> records;
  write_split(tmp, names, splits, {"param"}, [&](const std::string& n, const std::string&) { return by_name.at(n); },
              tp, pp, 1, records, hooks);
  json s;
  s["iteration"] = iteration;
  s["consumed_samples"] = 0;
  s["optimizer_steps"] = 0;
  s["lr"] = 0.0;
  s["has_optimizer"] = false;
  s["has_rng"] = false;
  s["layout"] = {{"world", tp * pp}, {"tp", tp}, {"pp", pp}, {"dp", 1}, {"cp", 1}, {"zero1", false}};
  s["params"] = names;
  records[kStateFile] = write_text((fs::path(tmp) / kStateFile).string(), s.dump(1) + "\n");
  records[kConfigFile] = write_text((fs::path(tmp) / kConfigFile).string(), config_yaml);
  commit_checkpoint(save_dir, iteration, records, std::nullopt, hooks);
}

FullModel read_model_checkpoint(const std::string& load_dir, int64_t iteration, bool ema) {
  auto dir = resolve_checkpoint_dir(load_dir, iteration);
  LF_CHECK(dir.has_value(), load_dir, " holds no checkpoint (no ", kTrackerFile, " and no ", kManifestFile, ")",
           lf::hint("pass the directory given to --save, or one of its iter_NNNNNNN directories"));
  CheckpointReader reader(*dir);
  FullModel out;
  out.iteration = reader.iteration();
  out.config_yaml = reader.config_yaml();
  if (ema)
    LF_CHECK(!reader.params("ema").empty(), "checkpoint ", *dir, " keeps no EMA weights",
             lf::hint("train with --ema-decay D to keep them, or export the weights (drop --ema)"));
  for (const auto& n : reader.params("param"))
    out.tensors.emplace_back(n, reader.full(n, ema && reader.has(n, "ema") ? "ema" : "param"));
  LF_CHECK(!out.tensors.empty(), "checkpoint ", *dir, " holds no model tensors");
  return out;
}

void reshard_checkpoint(const std::string& load_dir, const std::string& save_dir, int tp, int pp, int dp,
                        int64_t iteration) {
  LF_CHECK(tp >= 1 && pp >= 1 && dp >= 1, "reshard: --tp ", tp, ", --pp ", pp, ", --dp ", dp, " must be >= 1");
  auto dir = resolve_checkpoint_dir(load_dir, iteration);
  LF_CHECK(dir.has_value(), load_dir, " holds no checkpoint (no ", kTrackerFile, " and no ", kManifestFile, ")",
           lf::hint("pass the directory given to --save, or one of its iter_NNNNNNN directories"));
  LF_CHECK(fs::weakly_canonical(save_dir) != fs::weakly_canonical(load_dir), "reshard: --save ", save_dir,
           " is the directory being read", lf::hint("write the resharded checkpoint to a new directory"));
  at::NoGradGuard no_grad;
  CheckpointReader reader(*dir);
  json state = json::parse(reader.state_json());
  const auto names = reader.params("param");
  std::map<std::string, Split> splits;
  for (const auto& n : names) {
    splits[n] = reader.layout_of(n, "param").sharding();
  }
  std::vector<std::string> kinds = {"param"};
  const bool optim = state.value("has_optimizer", false);
  if (optim) kinds.insert(kinds.end(), {"master", "exp_avg", "exp_avg_sq"});
  if (!reader.params("ema").empty()) kinds.push_back("ema");  // EMA weights go with the weights
  const int64_t it = reader.iteration();
  prepare_save_dir(save_dir, it);
  const std::string tmp = temp_dir(save_dir, it);
  std::map<std::string, FileRecord> records;
  // Parameters without optimizer state (frozen groups, MoE's expert biases: model state) keep
  // their weights only; loading checks that every trained parameter has its state.
  write_split(tmp, names, splits, kinds,
              [&](const std::string& n, const std::string& k) {
                return k == "param" || reader.has(n, k) ? reader.full(n, k) : at::Tensor();
              },
              tp, pp, dp, records);
  // Delayed FP8 scaling: the same on every TP/DP rank of a stage; each weight's to its new stage.
  const auto fp8_names = reader.params("fp8_amax_history");
  if (!fp8_names.empty()) {
    int64_t num_layers = 0;
    for (const auto& n : names) num_layers = std::max(num_layers, layer_of(n) + 1);
    for (int ppr = 0; ppr < pp; ++ppr) {
      std::vector<Entry> f;
      for (const auto& n : fp8_names) {
        if (stage_of(n, num_layers, pp) != ppr) continue;
        for (const char* kind : {"fp8_amax_history", "fp8_scale"}) {
          at::Tensor t = reader.full(n, kind).contiguous();
          f.push_back({Piece{n, kind, ShardSpec{t.sizes().vec()}, 0, t.numel()}, t.reshape({-1})});
        }
      }
      if (!f.empty()) records[fp8_file(ppr)] = write_file(tmp, fp8_file(ppr), f, nullptr);
    }
  }
  // RNG states belong to ranks: kept only when the ranks stay the same.
  auto& layout = state["layout"];
  const bool same = layout.value("tp", 0) == tp && layout.value("pp", 0) == pp && layout.value("dp", 0) == dp;
  if (same && state.value("has_rng", false)) {
    for (const auto& [name, rec] : reader.files())
      if (name.starts_with("rng_rank")) {
        fs::copy_file(fs::path(*dir) / name, fs::path(tmp) / name);
        records[name] = rec;
      }
  } else {
    state["has_rng"] = false;
  }
  layout = {{"world", tp * pp * dp}, {"tp", tp}, {"pp", pp}, {"dp", dp}, {"cp", 1}, {"zero1", dp > 1}};
  records[kStateFile] = write_text((fs::path(tmp) / kStateFile).string(), state.dump(1) + "\n");
  records[kConfigFile] = write_text((fs::path(tmp) / kConfigFile).string(), reader.config_yaml());
  commit_checkpoint(save_dir, it, records, std::nullopt);
}

}  // namespace lf::train
