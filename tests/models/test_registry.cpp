// Models assembled from YAML through the registry: every mistake in a model section is a
// configuration error naming the key (unknown types with suggestions, a component in the wrong
// slot, a foundation TP setting, a missing slot, unknown keys), resolved sections carry every
// component's type and settings, a program can register its own types, swapping the backbone is
// one line, and the parameter records of a causal LM come without allocating its weights.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "error_message.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/dist/parallel_layout.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/composites/spliced_lm.h"
#include "loongforge/models/registry.h"
#include "multiprocess.h"
#include "tiny_decoder.h"

namespace {
using lf::config::Node;
using lf::config::parse_yaml_string;

Node yaml(const std::string& text) { return parse_yaml_string(text, lf::config::Origin::from_file("model.yaml", 1)); }

const char* kTinyFoundation = R"(
  num_layers: 2
  hidden_size: 32
  ffn_hidden_size: 48
  num_attention_heads: 4
  num_query_groups: 2
  vocab_size: 64
  max_position_embeddings: 32
)";

std::string config_error(const Node& model, const lf::models::Registry& r = lf::models::Registry::builtin()) {
  try {
    lf::models::load_model_config(model, r);
  } catch (const lf::config::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelRegistry, BuiltinTypesAreRegistered) {
  const auto& r = lf::models::Registry::builtin();
  for (const char* c : {"causal_lm", "spliced_lm", "feature_regression", "flow_matching", "pi05", "groot"})
    EXPECT_NE(r.composite(c), nullptr) << c;
  EXPECT_EQ(r.component_names("foundation"),
            (std::vector<std::string>{"decoder", "feature_transformer", "pi_gemma", "wan"}));
  EXPECT_EQ(r.component_names("encoder"), (std::vector<std::string>{"mlp_encoder", "siglip"}));
}

TEST(ModelRegistry, ResolvedSectionNamesEveryComponentsTypeAndSettings) {
  auto m = lf::models::load_model_config(yaml(std::string("type: causal_lm\nfoundation:\n") + kTinyFoundation));
  EXPECT_EQ(m->type, "causal_lm");
  EXPECT_EQ(m->component("foundation").type, "decoder");  // the slot's default type
  const Node* f = m->resolved.find("foundation");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->find("type")->text(), "decoder");
  EXPECT_EQ(f->find("freeze")->text(), "false");
  EXPECT_EQ(f->find("tensor_model_parallel_size"), nullptr) << "the foundation's TP is the job's";
  EXPECT_EQ(f->find("rotary_base")->text(), "10000");  // defaults filled in
  EXPECT_EQ(m->fields<lf::models::DecoderConfig>("foundation").hidden_size, 32);
}

TEST(ModelRegistry, MistakesNameTheKeyAndSuggest) {
  auto m = config_error(yaml(std::string("type: casual_lm\nfoundation:\n") + kTinyFoundation));
  EXPECT_NE(m.find("model.type"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'causal_lm'"), std::string::npos) << m;
  m = config_error(yaml(std::string("type: causal_lm\nfoundation:\n  type: decodr\n") + kTinyFoundation));
  EXPECT_NE(m.find("model.foundation.type"), std::string::npos) << m;
  EXPECT_NE(m.find("'decoder'"), std::string::npos) << m;
  m = config_error(yaml(std::string("type: causal_lm\nfoundation:\n  type: mlp_encoder\n  input_size: 4\n"
                                    "  ffn_hidden_size: 8\n")));
  EXPECT_NE(m.find("'mlp_encoder' is a encoder, the foundation slot takes a foundation"), std::string::npos) << m;
  m = config_error(yaml(std::string("type: causal_lm\nfoundation:\n  tensor_model_parallel_size: 2\n") + kTinyFoundation));
  EXPECT_NE(m.find("model.foundation.tensor_model_parallel_size"), std::string::npos) << m;
  EXPECT_NE(m.find("--tensor-model-parallel-size"), std::string::npos) << m;
  m = config_error(yaml("type: spliced_lm\nimage_token_id: 3\nfeatures_per_sample: 2\nfoundation:\n" +
                        std::string(kTinyFoundation)));
  EXPECT_NE(m.find("model.image_encoder"), std::string::npos) << m;
  EXPECT_NE(m.find("spliced_lm needs a image_encoder"), std::string::npos) << m;
  m = config_error(yaml(std::string("type: causal_lm\nfondation: {}\nfoundation:\n") + kTinyFoundation));
  EXPECT_NE(m.find("model.fondation"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'foundation'"), std::string::npos) << m;
  m = config_error(yaml(std::string("type: causal_lm\nfoundation:\n  num_heads: 4\n") + kTinyFoundation));
  EXPECT_NE(m.find("model.foundation.num_heads"), std::string::npos) << m;
  // Megatron's GQA switch without a group count would silently mean something else.
  m = config_error(yaml(std::string("type: causal_lm\nfoundation:\n  group_query_attention: true\n  num_layers: 2\n"
                                    "  hidden_size: 32\n  ffn_hidden_size: 48\n  num_attention_heads: 4\n"
                                    "  vocab_size: 64\n  max_position_embeddings: 32\n")));
  EXPECT_NE(m.find("model.foundation.num_query_groups"), std::string::npos) << m;
}

// A program registers its own foundation type and composite; the loader and planner use them.
struct EchoFields {
  int64_t width = 0;
  template <class V>
  void visit(V& v) {
    v("width", width, "Width", lf::config::Required{}, lf::config::Min{1});
  }
  int64_t num_parameters() const { return width * width; }
};

class EchoPlan : public lf::models::ModelPlan {
 public:
  explicit EchoPlan(std::shared_ptr<const lf::models::ModelConfig> c) : c_(std::move(c)) {}
  const lf::models::ModelConfig& config() const override { return *c_; }
  std::string describe() const override { return "echo " + std::to_string(num_parameters()); }
  std::string summary() const override { return "echo"; }
  int64_t num_parameters() const override { return c_->component("foundation").num_parameters(); }
  lf::models::DataNeeds data_needs() const override { return {}; }
  std::unique_ptr<lf::models::Model> build(const lf::models::BuildArgs&) const override { return nullptr; }

 private:
  std::shared_ptr<const lf::models::ModelConfig> c_;
};

TEST(ModelRegistry, ProgramsRegisterTheirOwnTypes) {
  lf::models::Registry r = lf::models::Registry::builtin();
  r.add(lf::models::ComponentType{"echo", "foundation", "test", lf::models::schema_loader<EchoFields>()});
  lf::models::CompositeType t;
  t.name = "echo_model";
  t.slots = {{"foundation", "foundation", "echo", true}};
  t.plan = [](std::shared_ptr<const lf::models::ModelConfig> c, const lf::models::PlanArgs&, lf::config::ErrorList&) {
    return std::unique_ptr<lf::models::ModelPlan>(new EchoPlan(std::move(c)));
  };
  r.add(std::move(t));
  auto m = lf::models::load_model_config(yaml("type: echo_model\nfoundation:\n  width: 3\n"), r);
  EXPECT_EQ(m->fields<EchoFields>("foundation").width, 3);
  lf::config::JobConfig job;
  lf::dist::ParallelLayout layout(1, {});
  Node resolved = Node::map();
  auto plan = lf::models::plan_model(m, {&job, &resolved, &layout});
  EXPECT_EQ(plan->describe(), "echo 9");
  EXPECT_NE(config_error(yaml("type: echo_model\nfoundation:\n  width: 0\n"), r).find("model.foundation.width"),
            std::string::npos);
  // A composite that needs a decoder refuses another foundation type, naming it.
  auto wrong = lf::models::load_model_config(yaml("type: causal_lm\nfoundation:\n  type: echo\n  width: 2\n"), r);
  EXPECT_NE(lf::testing::error_message([&] { wrong->fields<lf::models::DecoderConfig>("foundation"); }).find("echo"),
            std::string::npos);
}

// The one-line backbone swap: two job files that differ in the foundation's defaults line only
// give the same composite over another family.
TEST(ModelRegistry, SwappingTheBackboneIsOneLine) {
  auto job_with = [](const std::string& foundation_line) {
    const std::string dir = lf::testing::make_temp_dir("swap");
    const std::string file = dir + "/job.yaml";
    std::ofstream(file) << "defaults:\n  - /train/base@_global_\n  - /models/image_encoder@model.image_encoder: "
                           "mlp_tiny\n  - " << foundation_line << "\n  - _self_\n"
                        << "model:\n  type: spliced_lm\n  image_token_id: 255\n  features_per_sample: 4\n"
                        << "training: {train_iters: 1, seq_length: 16}\noptimizer: {lr: 1.0e-3}\n"
                        << "data: {mock_data: true}\n";
    lf::config::ComposeOptions o;
    o.config_file = file;
    return lf::models::load_model_config(lf::config::load_job(o).job.model);
  };
  auto llama = job_with("/models/llama@model.foundation: tiny");
  auto qwen = job_with("/models/qwen3@model.foundation: tiny");
  EXPECT_FALSE(llama->fields<lf::models::DecoderConfig>("foundation").qk_layernorm);
  EXPECT_TRUE(qwen->fields<lf::models::DecoderConfig>("foundation").qk_layernorm);  // Qwen3's QK norm
  EXPECT_EQ(qwen->component("image_encoder").type, "mlp_encoder");                   // the rest unchanged
  EXPECT_EQ(qwen->own_fields<lf::models::SplicedLmConfig>().features_per_sample, 4);
}

TEST(ModelRegistry, CausalLmParameterSpecsMatchTheModelWithoutAllocating) {
  lf::models::DecoderConfig c = lf::testing::tiny_decoder_config();
  c.add_qkv_bias = true;
  const auto specs = lf::models::causal_lm_parameter_specs(c);
  lf::models::CausalLm m(c, lf::backend::cpu_backend(), 1, at::kFloat);
  ASSERT_EQ(specs.size(), m.parameters().size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    const auto& p = m.parameters()[i];
    EXPECT_EQ(s.name, p.name);
    EXPECT_TRUE(s.tensor.is_meta()) << s.name;
    EXPECT_EQ(s.full_shape(), p.full_shape()) << s.name;
    EXPECT_EQ(s.sharding.dim, p.sharding.dim) << s.name;
    EXPECT_EQ(s.sharding.blocks, p.sharding.blocks) << s.name;
    EXPECT_EQ(s.sharding.vocab, p.sharding.vocab) << s.name;
  }
  // A 70B-shaped model's records come in no time and no memory.
  lf::models::DecoderConfig big = c;
  big.num_layers = 80;
  big.hidden_size = 8192;
  big.ffn_hidden_size = 28672;
  big.num_attention_heads = 64;
  big.num_query_groups = 8;
  big.vocab_size = 128256;
  int64_t n = 0;
  for (const auto& p : lf::models::causal_lm_parameter_specs(big)) n += p.tensor.numel();
  EXPECT_EQ(n, big.num_parameters());
}

}  // namespace
