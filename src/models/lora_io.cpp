#include "loongforge/models/lora_io.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"

namespace lf::models {
namespace {
namespace fs = std::filesystem;
namespace st = lf::safetensors;
using json = nlohmann::json;

const std::regex kPeftName(R"(base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)(?:\.default)?\.weight)");

std::string our_name(int64_t layer, LoraModule m, const std::string& ab) {
  return "decoder.layers." + std::to_string(layer) + (is_attention_module(m) ? ".self_attention." : ".mlp.") +
         lora_module_name(m) + ".lora_" + ab + ".weight";
}

// "decoder.layers.3.self_attention.q_proj.lora_A.weight" -> {3, q_proj, "A"}.
struct Parsed {
  int64_t layer = -1;
  LoraModule module = LoraModule::q_proj;
  std::string ab;
};
Parsed parse_ours(const std::string& name) {
  static const std::regex re(R"(decoder\.layers\.(\d+)\.(self_attention|mlp)\.(\w+)\.lora_(A|B)\.weight)");
  std::smatch m;
  LF_CHECK(std::regex_match(name, m, re), "not a LoRA adapter tensor name: ", name);
  return {std::stoll(m[1]), lora_module_of(m[3]), m[4]};
}

at::Tensor to_float(const st::Reader& r, const st::TensorInfo& t) {
  at::ScalarType s;
  switch (t.dtype) {
    case st::DType::F32: s = at::kFloat; break;
    case st::DType::BF16: s = at::kBFloat16; break;
    case st::DType::F16: s = at::kHalf; break;
    default: LF_FAIL(r.source(), ": tensor ", t.name, " has dtype ", st::dtype_name(t.dtype), lf::hint("LoRA weights are F32, BF16 or F16"));
  }
  at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(s));
  std::memcpy(out.data_ptr(), r.data(t), t.end - t.begin);
  return out.to(at::kFloat);
}

}  // namespace

PeftAdapter read_peft_adapter(const std::string& dir, const DecoderConfig& config) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  std::ifstream in(cfg_path);
  LF_CHECK(in.good(), "cannot read ", cfg_path.string(),
           lf::hint("--lora-adapter takes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)"));
  json c;
  try {
    c = json::parse(in);
  } catch (const json::exception& e) {
    LF_FAIL(cfg_path.string(), ": not valid JSON: ", e.what());
  }
  const std::string src = cfg_path.string();
  LF_CHECK(c.value("peft_type", std::string("LORA")) == "LORA", src, ": peft_type ", c.value("peft_type", std::string()),
           " is not LORA", lf::hint("only LoRA adapters are supported"));
  auto refuse_if = [&](bool cond, const std::string& key, const std::string& why) {
    LF_CHECK(!cond, src, ": ", key, " = ", c.contains(key) ? c[key].dump() : "?", ": ", why,
             lf::hint("export the adapter with plain LoRA settings"));
  };
  refuse_if(c.value("use_dora", false), "use_dora", "DoRA is not implemented");
  refuse_if(c.contains("bias") && c["bias"].is_string() && c["bias"] != "none", "bias", "adapter biases are not implemented");
  refuse_if(c.value("fan_in_fan_out", false), "fan_in_fan_out", "transposed (Conv1D) weights are not implemented");
  refuse_if(c.contains("rank_pattern") && !c["rank_pattern"].is_null() && !c["rank_pattern"].empty(), "rank_pattern",
            "per-module ranks are not implemented");
  refuse_if(c.contains("alpha_pattern") && !c["alpha_pattern"].is_null() && !c["alpha_pattern"].empty(),
            "alpha_pattern", "per-module alphas are not implemented");
  refuse_if(c.contains("modules_to_save") && !c["modules_to_save"].is_null() && !c["modules_to_save"].empty(),
            "modules_to_save", "fully trained extra modules are not implemented");
  refuse_if(c.contains("layers_to_transform") && !c["layers_to_transform"].is_null(), "layers_to_transform",
            "adapters on a subset of layers are not implemented");
  LF_CHECK(c.contains("r") && c["r"].is_number_integer() && c["r"].get<int64_t>() > 0, src, ": r must be a positive integer");
  std::vector<std::string> targets;
  if (c.contains("target_modules") && c["target_modules"].is_string()) {
    const std::string t = c["target_modules"];
    LF_CHECK(t == "all-linear", src, ": target_modules \"", t, "\" (a regular expression) is not supported",
             lf::hint("list the modules: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"));
    targets = {"all-linear"};
  } else {
    LF_CHECK(c.contains("target_modules") && c["target_modules"].is_array(), src, ": target_modules is missing");
    std::set<std::string> seen;
    for (const auto& t : c["target_modules"]) {
      // PEFT lists module names (q_proj) or, having expanded all-linear, full paths
      // (model.layers.1.mlp.up_proj): the module is the last component.
      std::string name = t.get<std::string>();
      if (const auto dot = name.rfind('.'); dot != std::string::npos) name = name.substr(dot + 1);
      if (!seen.insert(name).second) continue;
      const bool known = name == "all-linear" || [&] {
        for (LoraModule m : kLoraModules)
          if (name == lora_module_name(m)) return true;
        return false;
      }();
      LF_CHECK(known, src, ": target module '", name, "' is not a decoder projection we adapt",
               lf::hint("q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"));
      targets.push_back(name);
    }
  }
  PeftAdapter out;
  out.spec = LoraSpec::from(c["r"].get<int64_t>(), c.value("lora_alpha", 8.0), c.value("lora_dropout", 0.0),
                            c.value("use_rslora", false), targets);
  out.base_model = c.contains("base_model_name_or_path") && c["base_model_name_or_path"].is_string()
                       ? c["base_model_name_or_path"].get<std::string>()
                       : "";
  const fs::path weights = fs::path(dir) / "adapter_model.safetensors";
  LF_CHECK(fs::exists(weights), "cannot find ", weights.string(),
           lf::hint("PEFT's save_pretrained writes adapter_model.safetensors (an adapter_model.bin is not read)"));
  const st::Reader r = st::Reader::open(weights.string());
  std::set<std::string> have;
  for (const auto& t : r.tensors()) {
    std::smatch m;
    LF_CHECK(std::regex_match(t.name, m, kPeftName), weights.string(), ": tensor ", t.name,
             " is not a decoder layer's LoRA weight",
             lf::hint("expected base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight"));
    const int64_t layer = std::stoll(m[1]);
    LF_CHECK(layer < config.num_layers, weights.string(), ": tensor ", t.name, ": layer ", layer,
             " does not exist in a model of ", config.num_layers, " layers",
             lf::hint("the adapter belongs to another base model"));
    const LoraModule mod = lora_module_of(m[3]);
    LF_CHECK((m[2] == "self_attn") == is_attention_module(mod), weights.string(), ": tensor ", t.name,
             ": ", m[3].str(), " does not belong under ", m[2].str());
    LF_CHECK(out.spec.targets_module(mod), weights.string(), ": tensor ", t.name, " adapts ", m[3].str(),
             ", which adapter_config.json's target_modules does not list");
    const std::string name = our_name(layer, mod, m[4]);
    have.insert(name);
    out.tensors.emplace_back(name, to_float(r, t));
  }
  for (int64_t i = 0; i < config.num_layers; ++i)
    for (LoraModule mod : out.spec.targets)
      for (const char* ab : {"A", "B"})
        LF_CHECK(have.count(our_name(i, mod, ab)), weights.string(), ": no lora_", ab, " for layer ", i, " ",
                 lora_module_name(mod), lf::hint("the adapter covers other layers or modules than its config says"));
  return out;
}

void write_peft_adapter(const std::string& dir, const LoraSpec& spec, const NamedTensorList& adapters,
                        const std::string& base_model) {
  fs::create_directories(dir);
  json targets = json::array();
  for (LoraModule m : spec.targets) targets.push_back(lora_module_name(m));
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", spec.rank},
            {"lora_alpha", spec.alpha},
            {"lora_dropout", spec.dropout},
            {"target_modules", targets},
            {"use_rslora", spec.rslora},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"base_model_name_or_path", base_model}};
  std::ofstream(fs::path(dir) / "adapter_config.json") << c.dump(2) << "\n";
  st::Writer w;
  w.set_metadata("format", "pt");
  std::vector<at::Tensor> keep;
  for (const auto& [name, t] : adapters) {
    const Parsed p = parse_ours(name);
    keep.push_back(t.detach().to(at::kFloat).cpu().contiguous());
    const std::string peft = "base_model.model.model.layers." + std::to_string(p.layer) +
                             (is_attention_module(p.module) ? ".self_attn." : ".mlp.") + lora_module_name(p.module) +
                             ".lora_" + p.ab + ".weight";
    w.add(peft, st::DType::F32, keep.back().sizes().vec(), keep.back().data_ptr());
  }
  w.write((fs::path(dir) / "adapter_model.safetensors").string());
}

LoraSpec lora_spec_from_job_yaml(const std::string& yaml_text, const std::string& source) {
  using namespace lf::config;
  const Node root = parse_yaml_string(yaml_text, Origin::from_file(source, 1));
  const Node* section = root.find("lora");
  if (!section) return {};
  ErrorList errors;
  LoraConfig c;
  Loader l(section, "lora", Origin{}, errors);
  c.visit(l);
  l.finish();
  errors.throw_if_any();
  if (c.rank == 0) return {};
  return LoraSpec::from(c.rank, c.alpha, c.dropout, c.use_rslora, c.target_modules);
}

NamedTensorList merge_lora(const NamedTensorList& base, const LoraSpec& spec, const NamedTensorList& adapters,
                           const DecoderConfig& config) {
  std::map<std::string, at::Tensor> a;
  for (const auto& [name, t] : adapters) a[name] = t.to(at::kFloat);
  const int64_t nq = config.num_attention_heads, ng = config.query_groups(), d = config.head_dim(),
                f = config.ffn_hidden_size;
  NamedTensorList out;
  for (const auto& [name, w] : base) {
    static const std::regex re(R"(decoder\.layers\.(\d+)\.(self_attention\.linear_qkv|self_attention\.linear_proj|mlp\.linear_fc1|mlp\.linear_fc2)\.weight)");
    std::smatch m;
    if (!std::regex_match(name, m, re)) {
      out.emplace_back(name, w);
      continue;
    }
    const int64_t layer = std::stoll(m[1]);
    auto delta = [&](LoraModule mod) -> at::Tensor {
      if (!spec.targets_module(mod)) return {};
      const auto& A = a.at(our_name(layer, mod, "A"));
      const auto& B = a.at(our_name(layer, mod, "B"));
      return at::matmul(B, A) * spec.scale();  // [out, in]
    };
    at::Tensor merged = w.to(at::kFloat).clone();
    const std::string kind = m[2];
    if (kind == "self_attention.linear_qkv") {
      // Rows per query group: its nq/ng query heads, its key head, its value head.
      auto v = merged.view({ng, nq / ng + 2, d, merged.size(1)});
      if (auto dq = delta(LoraModule::q_proj); dq.defined()) v.narrow(1, 0, nq / ng).add_(dq.view({ng, nq / ng, d, -1}));
      if (auto dk = delta(LoraModule::k_proj); dk.defined()) v.select(1, nq / ng).add_(dk.view({ng, d, -1}));
      if (auto dv = delta(LoraModule::v_proj); dv.defined()) v.select(1, nq / ng + 1).add_(dv.view({ng, d, -1}));
    } else if (kind == "self_attention.linear_proj") {
      if (auto dx = delta(LoraModule::o_proj); dx.defined()) merged.add_(dx);
    } else if (kind == "mlp.linear_fc1") {
      if (auto dg = delta(LoraModule::gate_proj); dg.defined()) merged.narrow(0, 0, f).add_(dg);
      if (auto du = delta(LoraModule::up_proj); du.defined()) merged.narrow(0, f, f).add_(du);
    } else {
      if (auto dd = delta(LoraModule::down_proj); dd.defined()) merged.add_(dd);
    }
    out.emplace_back(name, merged.to(w.scalar_type()));
  }
  return out;
}

}  // namespace lf::models
