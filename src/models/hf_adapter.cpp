// HF safetensors <-> full LoongForge tensors, following a family's mapping (hf_mapping.h).
// Every transform is a pure rearrangement (views, cat, narrow, zero padding), so
// lf2hf(hf2lf(x)) reproduces each tensor bit for bit in its dtype.
#include <ATen/Functions.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "hf_mapping.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_vlm.h"

namespace lf::models::hf {
namespace fs = std::filesystem;
namespace st = lf::safetensors;

namespace {

std::string replace_layer(std::string s, int64_t layer, const char* tag = "<i>") {
  const auto at = s.find(tag);
  return at == std::string::npos ? s : s.replace(at, 3, std::to_string(layer));
}

// One LoongForge tensor and the HF tensors it is made of, for a concrete config.
struct Planned {
  const TensorRule* rule;
  std::string lf;
  std::vector<std::string> hf;
  std::vector<std::vector<int64_t>> shapes;  // HF shapes
};

// Rules in file order; a run of per-layer rules expands layer-major (layer 0's tensors, then
// layer 1's ...), the decoder's parameter order. Rules whose `when` fails are left out (per layer,
// `moe_layer` is whether that layer is MoE). The experts transform lists its HF tensors expert by
// expert (<e> = 0 .. experts - 1), each expert's in the rule's order.
std::vector<Planned> plan(const Mapping::Impl& m, const DecoderConfig& c) {
  json fields = config_fields(c);
  const auto symbols = shape_symbols(c);
  const auto moe_layers = c.moe_layer_pattern();
  std::vector<Planned> out;
  auto add = [&](const TensorRule& r, int64_t layer) {
    Planned p{&r, replace_layer(r.lf, layer), {}, {}};
    const int64_t experts = r.transform == "experts" ? c.num_experts : 1;
    for (int64_t e = 0; e < experts; ++e)
      for (const auto& s : r.hf) {
        p.hf.push_back(replace_layer(replace_layer(s.name, layer), e, "<e>"));
        p.shapes.push_back(eval_shape(s.shape, symbols));
      }
    out.push_back(std::move(p));
  };
  for (size_t i = 0; i < m.tensors.size();) {
    if (m.tensors[i].per_mtp()) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < m.tensors.size() && !m.tensors[j].per_mtp() && m.tensors[j].per_layer() == m.tensors[i].per_layer()) ++j;
    if (m.tensors[i].per_layer()) {
      for (int64_t layer = 0; layer < c.num_layers; ++layer) {
        fields["moe_layer"] = static_cast<bool>(moe_layers[static_cast<size_t>(layer)]);
        for (size_t k = i; k < j; ++k)
          if (holds(m.tensors[k].when, fields, m.tensors[k].origin)) add(m.tensors[k], layer);
      }
      fields.erase("moe_layer");
    } else {
      for (size_t k = i; k < j; ++k)
        if (holds(m.tensors[k].when, fields, m.tensors[k].origin)) add(m.tensors[k], -1);
    }
    i = j;
  }
  // Multi-token prediction layers: HF layers num_layers + k. The decoder-layer rules again (the
  // layer is MoE in a MoE model), then the MTP layer's own tensors.
  LF_CHECK(c.mtp_num_layers == 0 || m.mtp_layers, "mtp_num_layers is ", c.mtp_num_layers, " but the ", m.model_type,
           " mapping (", m.path, ") has no multi-token prediction layers",
           lf::hint("this HF family has no MTP weights; set mtp_num_layers: 0"));
  const std::string decoder_prefix = "decoder.layers.<i>.";
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    const int64_t hf_layer = c.num_layers + k;
    fields["moe_layer"] = c.is_moe();
    const std::string lf_prefix = "mtp.layers." + std::to_string(k) + ".transformer_layer.";
    for (const auto& r : m.tensors) {
      if (!r.per_layer() || r.lf.rfind(decoder_prefix, 0) != 0 || !holds(r.when, fields, r.origin)) continue;
      add(r, hf_layer);
      out.back().lf = lf_prefix + r.lf.substr(decoder_prefix.size());
    }
    fields.erase("moe_layer");
    for (const auto& r : m.tensors) {
      if (!r.per_mtp() || !holds(r.when, fields, r.origin)) continue;
      Planned p{&r, replace_layer(r.lf, k, "<m>"), {}, {}};
      for (const auto& spec : r.hf) {
        p.hf.push_back(replace_layer(spec.name, hf_layer, "<n>"));
        p.shapes.push_back(eval_shape(spec.shape, symbols));
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

at::ScalarType scalar_type(st::DType d, const std::string& what) {
  switch (d) {
    case st::DType::F32: return at::kFloat;
    case st::DType::F16: return at::kHalf;
    case st::DType::BF16: return at::kBFloat16;
    case st::DType::F64: return at::kDouble;
    default: LF_FAIL(what, " has dtype ", st::dtype_name(d), ", not a floating-point weight",
                     lf::hint("bf16, fp16, fp32 and fp64 weights are supported"));
  }
}

st::DType file_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return st::DType::F32;
    case at::kHalf: return st::DType::F16;
    case at::kBFloat16: return st::DType::BF16;
    case at::kDouble: return st::DType::F64;
    default: LF_FAIL("cannot write dtype ", c10::toString(t), " to safetensors");
  }
}

// The weights of an HF directory: every tensor by name, with the file it lives in.
struct Weights {
  std::vector<st::Reader> readers;
  std::map<std::string, std::pair<const st::Reader*, const st::TensorInfo*>> tensors;
  std::string files;  // for messages
  // config.json's quantization_config: FP8 weights in blocks of block_rows x block_cols, each
  // block's scale in <weight>_scale_inv (0: no quantization).
  int64_t block_rows = 0, block_cols = 0;
  std::string config;  // config.json's path, for messages

  bool is_fp8(const std::string& name) const {
    const auto d = tensors.at(name).second->dtype;
    return d == st::DType::F8_E4M3 || d == st::DType::F8_E5M2;
  }
  // The tensors read with `name` (an FP8 weight's scales).
  std::vector<std::string> companions(const std::string& name) const {
    if (is_fp8(name)) return {name + "_scale_inv"};
    return {};
  }

  // The tensor in its file's dtype; an FP8 weight dequantized, in fp32.
  at::Tensor load(const std::string& name) const {
    const auto& [reader, info] = tensors.at(name);
    if (is_fp8(name)) return dequantize(name);
    auto t = at::empty(info->shape, at::TensorOptions().dtype(scalar_type(
                                        info->dtype, "tensor '" + name + "' in " + reader->source())));
    // A copy (not from_blob): the mapping may be unaligned and must not outlive the reader.
    std::memcpy(t.data_ptr(), reader->data(*info), info->end - info->begin);
    return t;
  }

  // DeepSeek's weight_dequant: w[i, j] x scale_inv[i / r, j / c], in fp32.
  at::Tensor dequantize(const std::string& name) const {
    const auto& [reader, info] = tensors.at(name);
    const std::string what = "FP8 tensor '" + name + "' in " + reader->source();
    LF_CHECK(block_rows > 0, what, ", but ", config, " has no quantization_config {quant_method: fp8, weight_block_size}",
             lf::hint("config.json and the weights disagree; FP8 weights are read only with their block scales"));
    LF_CHECK(info->shape.size() == 2, what, " has shape ", shape_text(info->shape), "; FP8 weights are matrices");
    const std::string sname = name + "_scale_inv";
    auto it = tensors.find(sname);
    LF_CHECK(it != tensors.end(), what, " has no scales: '", sname, "' is missing from ", files,
             lf::hint("a file is incomplete, or the checkpoint is not block-quantized as config.json says"));
    const auto sd = it->second.second->dtype;
    LF_CHECK(sd == st::DType::F32 || sd == st::DType::BF16 || sd == st::DType::F16, "'", sname, "' in ",
             it->second.first->source(), " has dtype ", st::dtype_name(sd), "; block scales are read as F32, BF16 or F16",
             lf::hint("power-of-two (E8M0, MXFP8) scales are not read"));
    const std::vector<int64_t> want{(info->shape[0] + block_rows - 1) / block_rows,
                                    (info->shape[1] + block_cols - 1) / block_cols};
    LF_CHECK(it->second.second->shape == want, "'", sname, "' in ", it->second.first->source(), " has shape ",
             shape_text(it->second.second->shape), ", but ", name, " ", shape_text(info->shape), " in blocks of [",
             block_rows, ", ", block_cols, "] (", config, ": quantization_config.weight_block_size) needs ",
             shape_text(want));
    auto q = at::empty(info->shape, at::TensorOptions().dtype(info->dtype == st::DType::F8_E4M3 ? at::kFloat8_e4m3fn
                                                                                              : at::kFloat8_e5m2));
    std::memcpy(q.data_ptr(), reader->data(*info), info->end - info->begin);
    const at::Tensor scale = load(sname).to(at::kFloat);
    const at::Tensor full = scale.repeat_interleave(block_rows, 0)
                                .repeat_interleave(block_cols, 1)
                                .narrow(0, 0, info->shape[0])
                                .narrow(1, 0, info->shape[1]);
    return q.to(at::kFloat) * full;
  }
};

// config.json's quantization_config into w: FP8 in blocks (quant_method fp8 with weight_block_size,
// transformers' FineGrainedFP8Config, DeepSeek-V3's and Qwen's -FP8 releases); any other
// quantization is refused by name.
void read_quantization(Weights& w, const std::string& dir) {
  const fs::path cfg = fs::path(dir) / "config.json";
  w.config = lf::config::display_path(cfg.string());
  if (!fs::exists(cfg)) return;
  const json j = read_json_file(cfg.string());
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  const json& q = j["quantization_config"];
  const std::string method = q.is_object() ? q.value("quant_method", std::string("(none)")) : q.dump();
  LF_CHECK(method == "fp8", w.config, ": quantization_config.quant_method is '", method,
           "'; of quantized checkpoints only FP8 in blocks (quant_method fp8 with weight_block_size, as DeepSeek-V3 "
           "and Qwen's -FP8 models ship) is read",
           lf::hint("dequantize the weights to bf16 first, or convert the unquantized release"));
  const json b = q.value("weight_block_size", json());
  LF_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
               b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
           w.config, ": quantization_config (fp8) has weight_block_size ", b.dump(), ", not [rows, cols]",
           lf::hint("per-tensor FP8 checkpoints (no weight_block_size) are not read"));
  // Static activation scales (input_scale tensors) are for inference kernels; training reads none.
  const json act = q.value("activation_scheme", json("dynamic"));
  LF_CHECK(act == json("dynamic"), w.config, ": quantization_config.activation_scheme is ", act.dump(),
           "; only dynamic (no input_scale tensors) is read", lf::hint("convert the release with dynamic activation scales"));
  w.block_rows = b[0].get<int64_t>();
  w.block_cols = b[1].get<int64_t>();
}

Weights open_weights(const std::string& dir, const std::string& stem = "model") {
  Weights w;
  const fs::path index = fs::path(dir) / (stem + ".safetensors.index.json");
  const fs::path single = fs::path(dir) / (stem + ".safetensors");
  if (fs::exists(index)) {
    const std::string ipath = lf::config::display_path(index.string());
    const json j = read_json_file(index.string());
    LF_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), ipath,
             ": no weight_map object");
    std::map<std::string, size_t> file_reader;
    for (const auto& [name, file] : j["weight_map"].items()) {
      LF_CHECK(file.is_string(), ipath, ": weight_map['", name, "'] is not a file name");
      const std::string f = file.get<std::string>();
      if (!file_reader.count(f)) {
        const fs::path p = fs::path(dir) / f;
        LF_CHECK(fs::exists(p), ipath, " names shard '", f, "' (for tensor '", name,
                 "'), but ", lf::config::display_path(p.string()), " does not exist",
                 lf::hint("the download is incomplete: fetch every " + stem + "-*.safetensors file"));
        file_reader[f] = w.readers.size();
        w.readers.push_back(st::Reader::open(p.string()));
        w.files += (w.files.empty() ? "" : ", ") + f;
      }
    }
    for (const auto& [name, file] : j["weight_map"].items()) {
      const st::Reader& r = w.readers[file_reader[file.get<std::string>()]];
      const st::TensorInfo* info = r.find(name);
      LF_CHECK(info != nullptr, ipath, " places tensor '", name, "' in ", r.source(),
               ", which does not hold it");
      w.tensors[name] = {&r, info};
    }
  } else {
    LF_CHECK(fs::exists(single), "no ", stem, ".safetensors or ", stem, ".safetensors.index.json in ", dir,
             lf::hint("only safetensors weights are read; re-save the model with "
                      "save_pretrained(..., safe_serialization=True)"));
    w.readers.push_back(st::Reader::open(single.string()));
    w.files = stem + ".safetensors";
    for (const auto& t : w.readers.back().tensors()) w.tensors[t.name] = {&w.readers.back(), &t};
  }
  read_quantization(w, dir);
  return w;
}

// HF tensors -> the LoongForge tensor.
at::Tensor to_lf(const Planned& p, std::vector<at::Tensor> in, const DecoderConfig& c,
                 int64_t vocab_rows) {
  const std::string& t = p.rule->transform;
  if (t == "copy") return in[0];
  if (t == "experts") {  // per expert: its tensors stacked along dim 0; then the experts stacked
    const size_t per = p.rule->hf.size();
    std::vector<at::Tensor> experts;
    for (size_t e = 0; e < in.size(); e += per)
      experts.push_back(per == 1 ? in[e] : at::cat(std::vector<at::Tensor>(in.begin() + e, in.begin() + e + per), 0));
    return at::stack(experts).contiguous();
  }
  if (t == "vocab") {
    if (vocab_rows == in[0].size(0)) return in[0];
    auto pad_shape = in[0].sizes().vec();
    pad_shape[0] = vocab_rows - in[0].size(0);
    return at::cat({in[0], at::zeros(pad_shape, in[0].options())}, 0);
  }
  if (t == "concat") return in.size() == 1 ? in[0] : at::cat(in, 0);
  // qkv: [q; k; v] rows -> per query group g: its nq/ng query heads, its key, its value.
  const int64_t nq = c.num_attention_heads, ng = c.query_groups(), d = c.head_dim();
  if (in.size() == 1) in = in[0].split_with_sizes({nq * d, ng * d, ng * d}, 0);
  auto rest = in[0].sizes().slice(1).vec();
  auto grouped = [&](const at::Tensor& x, int64_t heads) {
    std::vector<int64_t> s{ng, heads, d};
    s.insert(s.end(), rest.begin(), rest.end());
    return x.reshape(s);
  };
  auto out = at::cat({grouped(in[0], nq / ng), grouped(in[1], 1), grouped(in[2], 1)}, 1);
  std::vector<int64_t> flat{(nq + 2 * ng) * d};
  flat.insert(flat.end(), rest.begin(), rest.end());
  return out.reshape(flat).contiguous();
}

// The LoongForge tensor -> its HF tensors (shapes checked by the caller).
std::vector<at::Tensor> to_hf(const Planned& p, const at::Tensor& x, const DecoderConfig& c) {
  const std::string& t = p.rule->transform;
  if (t == "copy") return {x};
  if (t == "experts") {
    const size_t per = p.rule->hf.size();
    std::vector<int64_t> rows;
    for (size_t k = 0; k < per; ++k) rows.push_back(p.shapes[k][0]);
    std::vector<at::Tensor> out;
    for (int64_t e = 0; e < x.size(0); ++e)
      for (auto& part : x[e].split_with_sizes(rows, 0)) out.push_back(part);
    return out;
  }
  if (t == "vocab") return {x.narrow(0, 0, c.vocab_size)};
  if (t == "concat") {
    std::vector<int64_t> rows;
    for (const auto& s : p.shapes) rows.push_back(s[0]);
    return x.split_with_sizes(rows, 0);
  }
  const int64_t nq = c.num_attention_heads, ng = c.query_groups(), d = c.head_dim(),
                pg = nq / ng;
  auto rest = x.sizes().slice(1).vec();
  std::vector<int64_t> s{ng, pg + 2, d};
  s.insert(s.end(), rest.begin(), rest.end());
  auto g = x.reshape(s);
  auto flat = [&](const at::Tensor& y, int64_t heads) {
    std::vector<int64_t> f{heads * d};
    f.insert(f.end(), rest.begin(), rest.end());
    return y.reshape(f);
  };
  auto q = flat(g.narrow(1, 0, pg), nq), k = flat(g.narrow(1, pg, 1), ng),
       v = flat(g.narrow(1, pg + 1, 1), ng);
  if (p.hf.size() == 1) return {at::cat({q, k, v}, 0)};
  return {q, k, v};
}

// The LoongForge shape a rule produces from the expected HF shapes (vocab: `vocab_rows` rows).
std::vector<int64_t> lf_shape(const Planned& p, const DecoderConfig& c, int64_t vocab_rows) {
  auto s = p.shapes[0];
  const std::string& t = p.rule->transform;
  if (t == "experts") {
    for (size_t k = 1; k < p.rule->hf.size(); ++k) s[0] += p.shapes[k][0];
    s.insert(s.begin(), c.num_experts);
    return s;
  }
  if (t == "vocab") s[0] = vocab_rows;
  if (t == "concat" || (t == "qkv" && p.shapes.size() == 3))
    for (size_t i = 1; i < p.shapes.size(); ++i) s[0] += p.shapes[i][0];
  return s;
}

std::string shard_name(size_t i, size_t n, const std::string& stem = "model") {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return stem + buf;
}

bool is_weight_file(const std::string& name, const std::string& stem = "model") {
  const std::regex re(stem + R"((-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?)");
  return std::regex_match(name, re);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  LF_CHECK(out.good(), "cannot write ", path.string());
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_regular_file(d / "config.json", ec) &&
         (fs::is_regular_file(d / "model.safetensors", ec) ||
          fs::is_regular_file(d / "model.safetensors.index.json", ec));
}

HfModel read_hf(const std::string& hf_dir, const ReadOptions& options) {
  LF_CHECK(fs::is_directory(hf_dir), "HF model directory ", hf_dir, " does not exist");
  const std::string cfg_path = (fs::path(hf_dir) / "config.json").string();
  const json j = read_json_file(cfg_path);
  std::string arch, type = j.value("model_type", std::string());
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    arch = j["architectures"][0].get<std::string>();
  Mapping mapping = [&] {
    try {
      return mapping_for_architecture(arch, type, options.configs_root);
    } catch (const lf::Error& e) {
      LF_FAIL(lf::config::display_path(cfg_path), ": ", e.message(), lf::hint(e.hint()));
    }
  }();
  HfModel out;
  out.architecture = mapping.architecture();
  out.config = config_from_json(j, mapping.impl(), lf::config::display_path(cfg_path));
  const DecoderConfig& c = out.config;
  const Weights w = open_weights(hf_dir);
  const int64_t vocab_rows = c.padded_vocab_size(options.vocab_tp);
  std::set<std::string> used;
  for (const auto& p : plan(mapping.impl(), c)) {
    std::vector<at::Tensor> in;
    bool dequantized = false;
    for (size_t k = 0; k < p.hf.size(); ++k) {
      const std::string& name = p.hf[k];
      auto it = w.tensors.find(name);
      LF_CHECK(it != w.tensors.end(), "HF tensor '", name, "' (for ", p.lf, ") is missing from ",
               hf_dir, " (", w.files, ")",
               lf::hint("config.json does not describe these weights, or a file is incomplete"));
      const auto& shape = it->second.second->shape;
      LF_CHECK(shape == p.shapes[k], "HF tensor '", name, "' in ", it->second.first->source(),
               " has shape ", shape_text(shape), ", but config.json implies ",
               shape_text(p.shapes[k]), " (", p.rule->origin, ")",
               lf::hint("config.json and the weights disagree: check hidden_size, "
                        "intermediate_size, head counts, head_dim and vocab_size"));
      in.push_back(w.load(name));
      used.insert(name);
      for (const auto& s : w.companions(name)) used.insert(s);
      if (w.is_fp8(name)) dequantized = true;
    }
    at::Tensor t = to_lf(p, std::move(in), c, vocab_rows);
    if (options.dtype)
      t = t.to(*options.dtype);
    else if (dequantized)
      t = t.to(options.dequantized_dtype);
    if (p.rule->duplicate) {
      // An HF copy of a tensor LoongForge holds once: it must equal that tensor.
      auto same = std::find_if(out.tensors.begin(), out.tensors.end(), [&](const auto& e) { return e.first == p.lf; });
      LF_CHECK(same != out.tensors.end() && same->second.sizes() == t.sizes() && at::equal(same->second, t), "HF tensor '",
               p.hf[0], "' in ", hf_dir, " differs from the tensor it copies (", p.lf, ": ", p.rule->origin, ")",
               lf::hint("LoongForge shares the MTP layers' embedding and output layer with the model's, as Megatron "
                        "does; weights trained with separate copies cannot be loaded"));
      continue;
    }
    out.tensors.emplace_back(p.lf, t);
  }
  const json fields = config_fields(c);
  for (const auto& [name, where] : w.tensors) {
    if (used.count(name)) continue;
    bool ignored = false;
    for (const auto& r : mapping.impl().ignore)
      if (std::regex_match(name, r.pattern) && holds(r.when, fields, mapping.path())) ignored = true;
    LF_CHECK(ignored, "HF tensor '", name, "' in ", where.first->source(),
             " has no place in the ", mapping.model_type(), " mapping (", mapping.path(), ")",
             lf::hint("config.json may not match the weights (e.g. num_hidden_layers), or the "
                      "mapping lacks an entry (docs/conversion.md)"));
  }
  return out;
}

NamedTensors decoder_from_hf_tensors(const DecoderConfig& c, const Mapping& mapping,
                                     const std::map<std::string, at::Tensor>& tensors, const std::string& model_prefix,
                                     int64_t vocab_tp, std::vector<std::string>* used) {
  NamedTensors out;
  const int64_t vocab_rows = c.padded_vocab_size(vocab_tp);
  for (const auto& p : plan(mapping.impl(), c)) {
    std::vector<at::Tensor> in;
    for (size_t k = 0; k < p.hf.size(); ++k) {
      std::string name = p.hf[k];
      if (name.rfind("model.", 0) == 0) name = model_prefix + name.substr(6);
      auto it = tensors.find(name);
      LF_CHECK(it != tensors.end(), "HF tensor '", name, "' (for ", p.lf, ", ", mapping.model_type(),
               " mapping) is missing", lf::hint("the checkpoint does not hold this model's language model, or its "
                                               "names carry another prefix than '" + model_prefix + "'"));
      LF_CHECK(it->second.sizes().vec() == p.shapes[k], "HF tensor '", name, "' has shape ", it->second.sizes(),
               ", but the model's configuration implies ", shape_text(p.shapes[k]), " (", p.rule->origin, ")");
      in.push_back(it->second);
      if (used) used->push_back(name);
    }
    at::Tensor t = to_lf(p, std::move(in), c, vocab_rows);
    if (p.rule->duplicate) continue;
    out.emplace_back(p.lf, t);
  }
  return out;
}

DecoderConfig load_hf_into(CausalLm& decoder, const std::string& hf_dir,
                           const std::string& configs_root) {
  if (is_vlm_hf_dir(hf_dir)) return load_vlm_hf_into(decoder, hf_dir);  // a vision-language model (hf_vlm.h)
  const DecoderConfig& want = decoder.config();
  // Checked before the weights are read (config.json is small; the weights may be 100s of GB).
  const DecoderConfig have = read_hf_config(hf_dir, nullptr, configs_root);
  const auto diffs = model_differences(want, have);
  if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += "\n  " + d.field + ": model " + d.ours + ", config.json " + d.theirs;
    LF_FAIL("the HF model in ", hf_dir, " is not the configured model:", list,
            lf::hint("choose the matching preset (configs/models/), or set these model.foundation "
                     "fields to config.json's values"));
  }
  ReadOptions options;
  options.configs_root = configs_root;
  options.vocab_tp = decoder.tp_size();
  if (!decoder.parameters().empty()) options.dequantized_dtype = decoder.parameters().front().tensor.scalar_type();
  HfModel m = read_hf(hf_dir, options);
  decoder.load_full_parameters({m.tensors.begin(), m.tensors.end()});
  return m.config;
}

void write_hf(const std::string& out_dir, const DecoderConfig& c, const NamedTensors& full,
              const WriteOptions& options) {
  const at::ScalarType dtype = options.dtype;
  LF_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
           "HF export dtype must be bf16, fp16 or fp32, got ", c10::toString(dtype));
  const Mapping mapping = options.architecture.empty()
                              ? mapping_for_config(c, options.configs_root)
                              : mapping_for_architecture(options.architecture, "", options.configs_root);
  const std::string config_text = hf_config_json(c, mapping, dtype);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : full)
    LF_CHECK(by_name.emplace(name, t).second, "tensor '", name, "' given twice");

  // Every HF tensor (checked shapes), with its byte size, in mapping order.
  struct Out {
    const Planned* p;
    size_t k;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  const auto planned = plan(mapping.impl(), c);
  std::vector<Out> outs;
  std::set<std::string> used;
  for (const auto& p : planned) {
    auto it = by_name.find(p.lf);
    LF_CHECK(it != by_name.end(), "the model lacks tensor '", p.lf, "', which the ",
             mapping.model_type(), " mapping (", p.rule->origin, ") exports");
    const at::Tensor& x = it->second;
    auto want = lf_shape(p, c, x.dim() > 0 ? x.size(0) : 0);
    const bool vocab_ok = p.rule->transform != "vocab" || x.size(0) >= c.vocab_size;
    LF_CHECK(x.sizes().vec() == want && vocab_ok, "tensor '", p.lf, "' has shape ",
             shape_text(x.sizes().vec()), ", but the configuration implies ", shape_text(want),
             p.rule->transform == "vocab" ? " (at least vocab_size rows)" : "");
    used.insert(p.lf);
    for (size_t k = 0; k < p.hf.size(); ++k) {
      int64_t n = 1;
      for (auto d : p.shapes[k]) n *= d;
      outs.push_back({&p, k, p.shapes[k], static_cast<uint64_t>(n) * c10::elementSize(dtype)});
    }
  }
  for (const auto& [name, t] : full)
    LF_CHECK(used.count(name), "tensor '", name, "' has no place in the ", mapping.model_type(),
             " mapping (", mapping.path(), ")",
             lf::hint("the configuration does not match the tensors (e.g. num_layers, "
                      "untie_embeddings_and_output_weights)"));

  // Shards as HF forms them: in order, a new one when the next tensor would overflow.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!shards.back().empty() && shard_bytes + outs[i].bytes > static_cast<uint64_t>(options.max_shard_bytes))
      shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(i);
    shard_bytes += outs[i].bytes;
    total += outs[i].bytes;
  }
  fs::create_directories(out_dir);
  std::set<std::string> written{"config.json"};
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    // Materialise only this shard's tensors (bounded memory for large models).
    std::vector<at::Tensor> keep;
    st::Writer writer;
    writer.set_metadata("format", "pt");
    const Planned* last = nullptr;
    std::vector<at::Tensor> parts;
    for (size_t i : shards[s]) {
      const Out& o = outs[i];
      if (o.p != last) parts = to_hf(*o.p, by_name.at(o.p->lf).detach().cpu(), c), last = o.p;
      at::Tensor t = parts[o.k].to(dtype).contiguous();
      LF_CHECK(t.sizes().vec() == o.shape, "internal: ", o.p->hf[o.k], " came out as ",
               shape_text(t.sizes().vec()), ", expected ", shape_text(o.shape));
      keep.push_back(t);
      writer.add(o.p->hf[o.k], file_dtype(dtype), o.shape, t.data_ptr());
      weight_map[o.p->hf[o.k]] = file;
    }
    writer.write((fs::path(out_dir) / file).string());
    written.insert(file);
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n");
    written.insert("model.safetensors.index.json");
  }
  write_text(fs::path(out_dir) / "config.json", config_text);
  // Weight files of an earlier export would contradict the new index (or shadow it).
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (is_weight_file(name) && !written.count(name)) fs::remove(e.path());
  }
}

std::map<std::string, at::Tensor> read_hf_weights(const std::string& dir, std::optional<at::ScalarType> dtype,
                                                  const std::string& stem, at::ScalarType dequantized) {
  const Weights w = open_weights(dir, stem);
  std::set<std::string> scales;
  for (const auto& [name, where] : w.tensors)
    for (const auto& s : w.companions(name)) scales.insert(s);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, where] : w.tensors) {
    if (scales.count(name)) continue;  // read with its FP8 weight
    at::Tensor t = w.load(name);
    out.emplace(name, dtype ? t.to(*dtype) : w.is_fp8(name) ? t.to(dequantized) : t);
  }
  return out;
}

std::map<std::string, std::vector<int64_t>> read_hf_weight_shapes(const std::string& dir, const std::string& stem) {
  const Weights w = open_weights(dir, stem);
  std::set<std::string> scales;
  for (const auto& [name, where] : w.tensors)
    for (const auto& s : w.companions(name)) scales.insert(s);
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, where] : w.tensors)
    if (!scales.count(name)) out.emplace(name, where.second->shape);
  return out;
}

NamedTensors decoder_to_hf_tensors(const DecoderConfig& c, const Mapping& mapping,
                                   const std::map<std::string, at::Tensor>& full, const std::string& model_prefix,
                                   std::vector<std::string>* used) {
  NamedTensors out;
  for (const auto& p : plan(mapping.impl(), c)) {
    auto it = full.find(p.lf);
    LF_CHECK(it != full.end(), "the model lacks tensor '", p.lf, "', which the ", mapping.model_type(),
             " mapping (", p.rule->origin, ") exports");
    const at::Tensor& x = it->second;
    const auto want = lf_shape(p, c, x.dim() > 0 ? x.size(0) : 0);
    const bool vocab_ok = p.rule->transform != "vocab" || x.size(0) >= c.vocab_size;
    LF_CHECK(x.sizes().vec() == want && vocab_ok, "tensor '", p.lf, "' has shape ", shape_text(x.sizes().vec()),
             ", but the configuration implies ", shape_text(want),
             p.rule->transform == "vocab" ? " (at least vocab_size rows)" : "");
    if (used) used->push_back(p.lf);
    auto parts = to_hf(p, x.detach().cpu(), c);
    for (size_t k = 0; k < p.hf.size(); ++k) {
      std::string name = p.hf[k];
      if (name.rfind("model.", 0) == 0) name = model_prefix + name.substr(6);
      LF_CHECK(parts[k].sizes().vec() == p.shapes[k], "internal: ", name, " came out as ",
               shape_text(parts[k].sizes().vec()), ", expected ", shape_text(p.shapes[k]));
      out.emplace_back(name, parts[k]);
    }
  }
  return out;
}

void write_hf_files(const std::string& out_dir, const std::string& config_text, const NamedTensors& tensors,
                    at::ScalarType dtype, int64_t max_shard_bytes, const std::string& stem) {
  LF_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
           "HF export dtype must be bf16, fp16 or fp32, got ", c10::toString(dtype));
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(tensors[i].second.numel()) * c10::elementSize(dtype);
    if (!shards.back().empty() && shard_bytes + bytes > static_cast<uint64_t>(max_shard_bytes))
      shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(i);
    shard_bytes += bytes;
    total += bytes;
  }
  fs::create_directories(out_dir);
  std::set<std::string> written{"config.json"};
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? stem + ".safetensors" : shard_name(s, shards.size(), stem);
    std::vector<at::Tensor> keep;
    st::Writer writer;
    writer.set_metadata("format", "pt");
    for (size_t i : shards[s]) {
      at::Tensor t = tensors[i].second.detach().cpu().to(dtype).contiguous();
      keep.push_back(t);
      writer.add(tensors[i].first, file_dtype(dtype), t.sizes().vec(), t.data_ptr());
      weight_map[tensors[i].first] = file;
    }
    writer.write((fs::path(out_dir) / file).string());
    written.insert(file);
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(fs::path(out_dir) / (stem + ".safetensors.index.json"), index.dump(2) + "\n");
    written.insert(stem + ".safetensors.index.json");
  }
  write_text(fs::path(out_dir) / "config.json", config_text);
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (is_weight_file(name, stem) && !written.count(name)) fs::remove(e.path());
  }
}

bool copy_preprocessor_config(const std::string& from, const std::string& to) {
  const fs::path src = fs::path(from) / "preprocessor_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(src, ec)) return false;
  fs::create_directories(to);
  fs::copy_file(src, fs::path(to) / "preprocessor_config.json", fs::copy_options::overwrite_existing, ec);
  LF_CHECK(!ec, "cannot copy ", src.string(), " to ", to, ": ", ec.message());
  return true;
}

}  // namespace lf::models::hf
