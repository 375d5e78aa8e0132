// hf2lf and lf2hf: HF transformers directories <-> native LoongForge checkpoints, through the
// family mappings of models/hf_adapter.h and the offline entry points of train/checkpoint.h;
// diffusers' WanTransformer3DModel directories <-> flow_matching checkpoints (wan_diffusers.h,
// wan_checkpoint.h).
#include <ATen/core/Tensor.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/hf_vlm.h"
#include "loongforge/models/lora_io.h"
#include "loongforge/backend/registry.h"
#include "loongforge/models/groot_lerobot.h"
#include "loongforge/models/pi05_lerobot.h"
#include "loongforge/models/wan_checkpoint.h"
#include "loongforge/models/wan_diffusers.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::tools::convert {
namespace {
namespace hf = lf::models::hf;

at::ScalarType parse_dtype(const std::string& s) {
  static const std::map<std::string, at::ScalarType> names{
      {"bf16", at::kBFloat16}, {"bfloat16", at::kBFloat16}, {"fp16", at::kHalf},
      {"float16", at::kHalf},  {"fp32", at::kFloat},        {"float32", at::kFloat}};
  auto it = names.find(s);
  LF_CHECK(it != names.end(), "unknown --dtype '", s, "'", lf::hint("bf16, fp16 or fp32"));
  return it->second;
}

// "5GB", "500MB", "2GiB", "123" (bytes), as HF's max_shard_size.
int64_t parse_size(const std::string& s) {
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.'))
    ++digits;
  static const std::map<std::string, double> units{
      {"", 1},      {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},
      {"KiB", 1024}, {"MiB", 1048576}, {"GiB", 1073741824.0}};
  auto unit = units.find(s.substr(digits));
  LF_CHECK(digits > 0 && unit != units.end(), "cannot read size '", s, "'",
           lf::hint("e.g. 5GB, 500MB, 2GiB or a byte count"));
  const double v = std::stod(s.substr(0, digits)) * unit->second;
  LF_CHECK(v >= 1, "size '", s, "' is too small");
  return static_cast<int64_t>(v);
}

int64_t count(const hf::NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel();
  return n;
}

struct Hf2LfArgs {
  std::string hf_dir, out, dtype = "keep", backbone_config;
  int tp = 1, pp = 1;
};

void check_layout(const lf::models::DecoderConfig& c, int tp, int pp) {
  // The layout checks the decoder would make at load time, made now (before writing anything).
  LF_CHECK(c.num_attention_heads % tp == 0 && c.query_groups() % tp == 0 && c.ffn_hidden_size % tp == 0,
           "--tp ", tp, " must divide num_attention_heads ", c.num_attention_heads, ", the query groups ",
           c.query_groups(), " and ffn_hidden_size ", c.ffn_hidden_size, lf::hint("each TP rank owns whole query groups"));
  LF_CHECK(c.num_layers % pp == 0, "--pp ", pp, " must divide num_layers ", c.num_layers);
}

// A vision-language model (hf_vlm.h): the composite's config.yaml section and every tensor, the
// vision tower's on the first pipeline stage.
void run_hf2lf_vlm(const Hf2LfArgs& a, const hf::ReadOptions& options) {
  hf::VlmHfModel m = hf::read_vlm_hf(a.hf_dir, options);
  check_layout(m.config.foundation, a.tp, a.pp);
  lf::train::write_model_checkpoint(a.out, /*iteration=*/0, m.tensors, hf::vlm_shardings(m.config),
                                    hf::vlm_model_section_yaml(m.config), a.tp, a.pp);
  hf::copy_preprocessor_config(a.hf_dir, a.out);
  std::printf("converted %s (%s: %lld values, %lld layers, vision depth %lld) from %s to %s (tp %d, pp %d)\n",
              m.architecture.c_str(), m.config.type.c_str(), static_cast<long long>(count(m.tensors)),
              static_cast<long long>(m.config.foundation.num_layers),
              static_cast<long long>(m.config.intern()  ? m.config.vision_intern.num_hidden_layers
                                     : m.config.qwen3() ? m.config.vision3.depth
                                                        : m.config.vision.depth),
              a.hf_dir.c_str(), a.out.c_str(), a.tp, a.pp);
}

// A diffusers directory: config.json names its class (_class_name), which HF transformers'
// config.json files do not have. Only WanTransformer3DModel converts; read_wan_config says so.
bool is_diffusers_dir(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  try {
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in);
    return j.is_object() && j.contains("_class_name");
  } catch (const std::exception&) {
    return false;  // not JSON: read_hf reports it
  }
}

// A diffusers WanTransformer3DModel directory -> a checkpoint of a flow_matching model on the wan
// foundation (the same tensor names), TP-split by the foundation's own shardings.
void run_hf2lf_wan(const Hf2LfArgs& a) {
  namespace dm = lf::models::diffusers;
  const auto c = dm::read_wan_config(a.hf_dir);
  LF_CHECK(a.pp == 1, "--pp ", a.pp, ": a Wan model (flow_matching) runs as one pipeline stage",
           lf::hint("drop --pp"));
  LF_CHECK(c.num_attention_heads % a.tp == 0 && c.ffn_dim % a.tp == 0, "--tp ", a.tp,
           " must divide num_attention_heads ", c.num_attention_heads, " and ffn_dim ", c.ffn_dim, " of ", a.hf_dir,
           "/config.json", lf::hint("each TP rank owns whole heads"));
  std::optional<at::ScalarType> dtype;
  if (a.dtype != "keep") dtype = parse_dtype(a.dtype);
  const auto full = dm::checked_wan_tensors(c, dm::read_wan_weights(a.hf_dir, dtype),
                                            a.hf_dir + "/diffusion_pytorch_model*.safetensors");
  std::map<std::string, lf::parallel::Sharding> shardings;
  for (const auto& r : dm::wan_parameter_records(c)) shardings[r.name] = r.sharding;
  lf::train::write_model_checkpoint(a.out, /*iteration=*/0, full, shardings, dm::flow_matching_model_section_yaml(c),
                                    a.tp, 1);
  int64_t values = 0;
  for (const auto& [name, t] : full) values += t.numel();
  std::printf("converted WanTransformer3DModel (flow_matching on wan: %lld parameters, %lld blocks) from %s to %s "
              "(tp %d)\n",
              static_cast<long long>(values), static_cast<long long>(c.num_layers), a.hf_dir.c_str(), a.out.c_str(),
              a.tp);
}

// A LeRobot pi05 policy directory -> a checkpoint of a pi05 model (the same tensor names without
// the policy's "model." prefix), TP-split by the model's shardings; its config.json is kept beside
// the checkpoint for the way back (lf2hf).
void run_hf2lf_pi05(const Hf2LfArgs& a) {
  namespace lr = lf::models::lerobot;
  const auto s = lr::read_pi05_setup(a.hf_dir);
  LF_CHECK(a.pp == 1, "--pp ", a.pp, ": a pi05 policy runs as one pipeline stage", lf::hint("drop --pp"));
  LF_CHECK(s.vision.num_attention_heads % a.tp == 0 && s.vlm.num_heads % a.tp == 0 && s.vlm.mlp_dim % a.tp == 0 &&
               s.expert.mlp_dim % a.tp == 0 && s.vlm.vocab_size % a.tp == 0 && s.vision.intermediate_size % a.tp == 0,
           "--tp ", a.tp, " must divide the heads (", s.vlm.num_heads, ", SigLIP ", s.vision.num_attention_heads,
           "), the MLP sizes (", s.vlm.mlp_dim, ", ", s.expert.mlp_dim, ", SigLIP ", s.vision.intermediate_size,
           ") and the vocabulary (", s.vlm.vocab_size, ") of ", a.hf_dir, lf::hint("each TP rank owns whole heads"));
  std::optional<at::ScalarType> dtype;
  if (a.dtype != "keep") dtype = parse_dtype(a.dtype);
  const auto full = lr::checked_pi05_tensors(s, lr::read_pi05_weights(a.hf_dir, dtype), a.hf_dir + "/model.safetensors");
  lf::train::write_model_checkpoint(a.out, /*iteration=*/0, full, lr::pi05_shardings(s, a.tp),
                                    lr::pi05_model_section_yaml(s), a.tp, 1);
  std::error_code ec;
  std::filesystem::copy_file(std::filesystem::path(a.hf_dir) / "config.json",
                             std::filesystem::path(a.out) / lr::kLerobotConfigFile,
                             std::filesystem::copy_options::overwrite_existing, ec);
  LF_CHECK(!ec, "cannot copy ", a.hf_dir, "/config.json to ", a.out, ": ", ec.message());
  std::printf("converted LeRobot pi05 policy (%lld values: SigLIP %lldx%lld, PaliGemma width %lld, expert width %lld, "
              "%lld layers) from %s to %s (tp %d)\n",
              static_cast<long long>(count(full)), static_cast<long long>(s.vision.image_size),
              static_cast<long long>(s.vision.image_size), static_cast<long long>(s.vlm.width),
              static_cast<long long>(s.expert.width), static_cast<long long>(s.vlm.depth), a.hf_dir.c_str(),
              a.out.c_str(), a.tp);
}

// A GR00T N1.7 directory (GR00TN17.save_pretrained; LeRobot's GrootPolicy) -> a checkpoint of a
// groot model: the model is built on the CPU, GR00T's tensors loaded by name (every one used), and
// its parameters written under LoongForge's names (the backbone's as the qwen3_vl composite names
// them, the action head's as GR00T does).
void run_hf2lf_groot(const Hf2LfArgs& a) {
  namespace lr = lf::models::lerobot;
  const auto s = lr::read_groot_setup(a.hf_dir, a.backbone_config);
  LF_CHECK(a.tp == 1 && a.pp == 1, "--tp ", a.tp, " --pp ", a.pp, ": a groot policy trains at TP 1 and PP 1",
           lf::hint("drop --tp / --pp"));
  std::optional<at::ScalarType> want;
  if (a.dtype != "keep") want = parse_dtype(a.dtype);
  auto weights = lr::read_groot_weights(a.hf_dir, want);
  LF_CHECK(!weights.empty(), a.hf_dir, " holds no weights");
  // keep: the files' dtype (their first tensor's), as for the other formats.
  const at::ScalarType dtype = want ? *want : weights.begin()->second.scalar_type();
  lf::models::Groot model(s.backbone, s.config, lf::backend::cpu_backend(), 0, dtype, nullptr);
  model.load_full(weights, a.hf_dir);
  std::vector<std::pair<std::string, at::Tensor>> full;
  std::map<std::string, lf::parallel::Sharding> shardings;
  for (const auto& g : model.parameter_groups())
    for (const auto& p : g.params) {
      full.emplace_back(p.name, p.tensor.detach());
      shardings[p.name] = p.sharding;
    }
  lf::train::write_model_checkpoint(a.out, /*iteration=*/0, full, shardings, lr::groot_model_section_yaml(s), 1, 1);
  std::printf("converted GR00T N1.7 (%lld values: backbone %lld of %lld layers, width %lld; DiT %lld blocks) from %s "
              "to %s\n",
              static_cast<long long>(count(full)), static_cast<long long>(s.config.select_layer),
              static_cast<long long>(s.backbone.foundation.num_layers),
              static_cast<long long>(s.backbone.foundation.hidden_size), static_cast<long long>(s.config.dit_num_layers),
              a.hf_dir.c_str(), a.out.c_str());
}

void run_hf2lf(const Hf2LfArgs& a) {
  if (lf::models::lerobot::is_groot_dir(a.hf_dir)) return run_hf2lf_groot(a);
  LF_CHECK(a.backbone_config.empty(), "--backbone-config is for GR00T N1.7 directories; ", a.hf_dir,
           "/config.json is not one (\"model_type\": \"Gr00tN1d7\")", lf::hint("drop --backbone-config"));
  if (lf::models::lerobot::is_pi05_dir(a.hf_dir)) return run_hf2lf_pi05(a);
  if (is_diffusers_dir(a.hf_dir)) return run_hf2lf_wan(a);
  std::error_code ec;
  LF_CHECK(!std::filesystem::exists(std::filesystem::path(a.hf_dir) / "model_index.json", ec) ||
               std::filesystem::exists(std::filesystem::path(a.hf_dir) / "config.json", ec),
           a.hf_dir, " is a diffusers pipeline (model_index.json), not one model",
           lf::hint("give its transformer/ directory (WanTransformer3DModel; Wan 2.2 A14B: also transformer_2/)"));
  hf::ReadOptions options;
  options.vocab_tp = a.tp;
  if (a.dtype != "keep") options.dtype = parse_dtype(a.dtype);
  if (hf::is_vlm_hf_dir(a.hf_dir)) return run_hf2lf_vlm(a, options);
  hf::HfModel m = hf::read_hf(a.hf_dir, options);
  const auto& c = m.config;
  check_layout(c, a.tp, a.pp);
  lf::train::write_model_checkpoint(a.out, /*iteration=*/0, m.tensors, lf::models::causal_lm_shardings(c),
                                    hf::model_section_yaml(c), a.tp, a.pp);
  std::printf("converted %s (%lld parameters, %lld layers) from %s to %s (tp %d, pp %d)\n",
              m.architecture.c_str(), static_cast<long long>(c.num_parameters()),
              static_cast<long long>(c.num_layers), a.hf_dir.c_str(), a.out.c_str(), a.tp, a.pp);
}

struct Lf2HfArgs {
  std::string load, out, dtype = "bf16", architecture, max_shard_size = "5GB";
  int64_t iteration = -1;
  bool merge_lora = false;
  bool ema = false;
  bool max_shard_size_given = false;  // --max-shard-size on the command line
};

void run_lf2hf(const Lf2HfArgs& a) {
  hf::WriteOptions options;
  options.dtype = parse_dtype(a.dtype);
  options.architecture = a.architecture;
  options.max_shard_bytes = parse_size(a.max_shard_size);
  lf::train::FullModel m = lf::train::read_model_checkpoint(a.load, a.iteration, a.ema);
  const std::string source = a.load + " (iteration " + std::to_string(m.iteration) + ", config.yaml)";
  const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(a.load, a.iteration);
  const auto base = resolved ? lf::train::verified_checkpoint_base(*resolved) : std::nullopt;
  LF_CHECK(!lf::models::lerobot::groot_setup_from_model_section(m.config_yaml, source), a.load,
           " is a groot policy: exporting it to GR00T's layout is not built yet",
           lf::hint("hf2lf imports GR00T N1.7 directories; the way back is not written"));
  if (const auto pi = lf::models::lerobot::pi05_setup_from_model_section(m.config_yaml, source)) {
    // A pi05 policy: LeRobot's save_pretrained layout; the config.json hf2lf kept is the template.
    namespace lr = lf::models::lerobot;
    LF_CHECK(!a.merge_lora && a.architecture.empty(), a.load, " is a pi05 policy; ",
             a.merge_lora ? "--merge-lora" : "--architecture", " is for HF transformers exports",
             lf::hint("drop it: the export is a LeRobot pi05 directory"));
    LF_CHECK(!a.max_shard_size_given, a.load, " is a pi05 policy; LeRobot's from_pretrained reads one "
             "model.safetensors, so --max-shard-size cannot split it", lf::hint("drop --max-shard-size"));
    std::string template_config;
    if (std::ifstream in(std::filesystem::path(a.load) / lr::kLerobotConfigFile); in.good())
      template_config.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::map<std::string, at::Tensor> tensors(m.tensors.begin(), m.tensors.end());
    const auto full = lr::checked_pi05_tensors(*pi, std::move(tensors), source);
    lr::write_pi05(a.out, *pi, full, options.dtype, template_config);
    std::printf("exported iteration %lld of %s (LeRobot pi05, %lld values%s) to %s as %s\n",
                static_cast<long long>(m.iteration), a.load.c_str(), static_cast<long long>(count(m.tensors)),
                template_config.empty() ? ", LeRobot's default features" : "", a.out.c_str(), a.dtype.c_str());
    return;
  }
  if (const auto wan = lf::models::diffusers::wan_config_from_model_section(m.config_yaml, source)) {
    // A flow_matching model: diffusers' WanTransformer3DModel directory (the same tensor names).
    LF_CHECK(!a.merge_lora && a.architecture.empty(), a.load, " is a Wan model (flow_matching); ",
             a.merge_lora ? "--merge-lora" : "--architecture", " is for HF transformers exports",
             lf::hint("drop it: the export is a diffusers WanTransformer3DModel directory"));
    // diffusers' config.json has no key for the RoPE base (WanRotaryPosEmbed's theta is 10000).
    LF_CHECK(wan->rope_theta == 10000, a.load, ": model.foundation.rope_theta ", wan->rope_theta,
             " cannot be expressed in diffusers' WanTransformer3DModel, whose RoPE base is 10000",
             lf::hint("only a model trained with rope_theta 10000 exports to diffusers"));
    std::map<std::string, at::Tensor> tensors(m.tensors.begin(), m.tensors.end());
    const auto full = lf::models::diffusers::checked_wan_tensors(*wan, std::move(tensors), source);
    lf::models::diffusers::write_wan(a.out, *wan, full, options.dtype, options.max_shard_bytes);
    std::printf("exported iteration %lld of %s (WanTransformer3DModel, %lld values%s) to %s as %s\n",
                static_cast<long long>(m.iteration), a.load.c_str(), static_cast<long long>(count(m.tensors)),
                a.ema ? ", EMA weights" : "", a.out.c_str(), a.dtype.c_str());
    return;
  }
  if (const auto vlm = hf::vlm_config_from_model_section(m.config_yaml, source)) {
    LF_CHECK(!base, a.load, " is a LoRA checkpoint of a ", vlm->type, " model; LoRA export is built for causal_lm",
             lf::hint("export a full checkpoint"));
    hf::write_vlm_hf(a.out, *vlm, m.tensors, options);
    hf::copy_preprocessor_config(a.load, a.out);
    std::printf("exported iteration %lld of %s (%s, %lld values) to %s as %s\n", static_cast<long long>(m.iteration),
                a.load.c_str(), vlm->type.c_str(), static_cast<long long>(count(m.tensors)), a.out.c_str(),
                a.dtype.c_str());
    return;
  }
  const auto config = hf::config_from_model_section(m.config_yaml, source);
  LF_CHECK(base || !a.merge_lora, "--merge-lora: ", a.load, " holds no LoRA adapters (a full checkpoint)",
           lf::hint("drop --merge-lora"));
  if (base) {
    // A LoRA run: its adapters here, the frozen base where the checkpoint says.
    const auto spec = lf::models::lora_spec_from_job_yaml(m.config_yaml, *resolved + "/config.yaml");
    LF_CHECK(spec.enabled(), *resolved, " names a base but its config.yaml has no lora section");
    lf::train::FullModel b = lf::train::read_model_checkpoint(base->dir);
    if (a.merge_lora) {
      hf::write_hf(a.out, config, lf::models::merge_lora(b.tensors, spec, m.tensors, config), options);
      std::printf("exported %s merged with the LoRA adapters of iteration %lld of %s to %s as %s\n", base->dir.c_str(),
                  static_cast<long long>(m.iteration), a.load.c_str(), a.out.c_str(), a.dtype.c_str());
    } else {
      hf::write_hf(a.out, config, b.tensors, options);
      const std::string adapter = (std::filesystem::path(a.out) / "adapter").string();
      lf::models::write_peft_adapter(adapter, spec, m.tensors,
                                     std::filesystem::absolute(a.out).lexically_normal().string());
      std::printf("exported the base %s to %s as %s and the LoRA adapters (rank %lld) of iteration %lld to %s\n",
                  base->dir.c_str(), a.out.c_str(), a.dtype.c_str(), static_cast<long long>(spec.rank),
                  static_cast<long long>(m.iteration), adapter.c_str());
    }
    return;
  }
  hf::write_hf(a.out, config, m.tensors, options);
  std::printf("exported iteration %lld of %s (%lld values%s) to %s as %s\n",
              static_cast<long long>(m.iteration), a.load.c_str(),
              static_cast<long long>(count(m.tensors)), a.ema ? ", EMA weights" : "", a.out.c_str(), a.dtype.c_str());
}

}  // namespace

void add_hf2lf_command(CLI::App& app) {
  auto args = std::make_shared<Hf2LfArgs>();
  auto* c = app.add_subcommand("hf2lf", "HF transformers (or diffusers Wan, or LeRobot pi05, or GR00T N1.7) directory -> native LoongForge checkpoint");
  c->add_option("--hf-dir", args->hf_dir,
                "HF model directory (config.json + safetensors), a diffusers WanTransformer3DModel directory, or a "
                "LeRobot pi05 policy (config.json with \"type\": \"pi05\" + model.safetensors), or a GR00T N1.7 model "
                "(config.json with \"model_type\": \"Gr00tN1d7\": what GR00TN17.save_pretrained writes)")
      ->required()->check(CLI::ExistingDirectory);
  c->add_option("--out", args->out, "checkpoint directory to write (iter_0000000 inside)")->required();
  c->add_option("--tp", args->tp, "tensor-parallel size of the written shards")->check(CLI::PositiveNumber);
  c->add_option("--pp", args->pp, "pipeline-parallel size of the written shards")->check(CLI::PositiveNumber);
  c->add_option("--dtype", args->dtype, "keep (the files' dtype), bf16, fp16 or fp32");
  c->add_option("--backbone-config", args->backbone_config,
                "GR00T only: directory holding the backbone's Qwen3-VL config.json (default: the config's model_name, "
                "a directory or nvidia/Cosmos-Reason2-2B, built in)")
      ->check(CLI::ExistingDirectory);
  c->callback([args] { run_hf2lf(*args); });
}

void add_lf2hf_command(CLI::App& app) {
  auto args = std::make_shared<Lf2HfArgs>();
  auto* c = app.add_subcommand("lf2hf",
                               "native LoongForge checkpoint -> HF transformers (a Wan model: diffusers; a pi05 policy: LeRobot) directory");
  c->add_option("--load", args->load, "checkpoint directory (its latest iteration by default)")
      ->required()->check(CLI::ExistingDirectory);
  c->add_option("--out", args->out, "HF directory to write (config.json + safetensors)")->required();
  c->add_option("--dtype", args->dtype, "bf16 (default), fp16 or fp32");
  c->add_option("--iteration", args->iteration, "iteration to export (default: the latest)");
  c->add_option("--architecture", args->architecture,
                "HF architecture, e.g. Qwen3ForCausalLM (default: the one family that fits)");
  auto* shard = c->add_option("--max-shard-size", args->max_shard_size,
                               "largest safetensors file (HF style: 5GB; a pi05 policy is one file, as LeRobot reads it)");
  c->add_flag("--merge-lora", args->merge_lora,
              "a LoRA run: write the base with the adapters merged (default: the base, plus OUT/adapter/ in PEFT's "
              "format)");
  c->add_flag("--ema", args->ema,
              "export the EMA weights the run kept (--ema-decay) instead of the weights (LoRA: the adapters' EMA)");
  c->callback([args, shard] {
    args->max_shard_size_given = shard->count() > 0;
    run_lf2hf(*args);
  });
}

}  // namespace lf::tools::convert
