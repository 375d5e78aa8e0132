// Models assembled from YAML. The `model:` section names a composite (`type: causal_lm`) and its
// components by slot (`foundation:`, `image_encoder:` ...), each with its own `type:` (a default
// per slot), its own field list, and the settings every component may carry: its
// `tensor_model_parallel_size` (null: the foundation's, i.e. --tensor-model-parallel-size) and
// `freeze`. A Registry maps type names to loaders (components) and planners (composites); the
// built-in one holds every LoongForge type, and a program can add its own. load_model_config()
// validates the whole section (every problem named by key, with its origin); a composite's plan
// knows the layout of every component before any process group exists (--dry-run) and builds
// the Model. See docs/design/model-layer.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/node.h"
#include "loongforge/dist/parallel_layout.h"
#include "loongforge/models/model.h"

namespace lf::backend {
class DeviceBackend;
}
namespace lf::dist {
class ParallelContext;
}

namespace lf::models {

// Settings any component's YAML may carry besides its own fields.
struct ComponentSettings {
  std::optional<int64_t> tensor_model_parallel_size;  // null: the foundation's
  bool freeze = false;                                // no gradients, no optimizer state
};

// One component's configuration, loaded and validated.
class ComponentConfig {
 public:
  virtual ~ComponentConfig() = default;
  std::string slot;  // "foundation", "image_encoder"; "" for a composite's own fields
  std::string type;  // "decoder", "mlp_encoder"
  ComponentSettings settings;
  lf::config::Node resolved;  // its fields with every default filled in (origin: default)
  virtual int64_t num_parameters() const { return 0; }
};

// A component configuration whose fields are one schema struct (with visit(), as DecoderConfig).
template <class Fields>
class ComponentConfigOf : public ComponentConfig {
 public:
  Fields fields;
  int64_t num_parameters() const override {
    if constexpr (requires(const Fields& f) { f.num_parameters(); })
      return fields.num_parameters();
    else
      return 0;
  }
};

using ComponentLoader = std::function<std::unique_ptr<ComponentConfig>(
    const lf::config::Node& node, const std::string& key, lf::config::ErrorList& errors)>;

struct ComponentType {
  std::string name;  // the `type:` value
  std::string kind;  // "foundation", "encoder", "head"
  std::string description;
  // Loads the component's own fields from `node` (type, tensor_model_parallel_size and freeze
  // already taken out); problems go to `errors` under `key`.<field>.
  ComponentLoader load;
};

// The loader of a component whose fields are `Fields`: lf::config::load_into + Fields::validate
// when it has one.
template <class Fields>
ComponentLoader schema_loader();

struct SlotSpec {
  std::string name;          // the key under model:
  std::string kind;          // the kind of component it takes
  std::string default_type;  // "" : `type:` must be given
  bool required = true;
};

class ModelConfig;
class ModelPlan;

// What a composite's plan gets: the job (its sections, the resolved tree for error origins) and
// the job's parallel layout (the foundation's).
struct PlanArgs {
  const lf::config::JobConfig* job = nullptr;
  const lf::config::Node* resolved = nullptr;
  const lf::dist::ParallelLayout* layout = nullptr;
};

struct CompositeType {
  std::string name, description;
  std::vector<SlotSpec> slots;
  // The composite's own keys besides `type` and the slots (null: none).
  ComponentLoader load_own;
  // The plan of a loaded configuration for a layout; layout problems go to `errors`.
  std::function<std::unique_ptr<ModelPlan>(std::shared_ptr<const ModelConfig>, const PlanArgs&, lf::config::ErrorList&)>
      plan;
};

class Registry {
 public:
  // Every built-in type: causal_lm, spliced_lm, feature_regression; decoder, feature_transformer,
  // mlp_encoder. Built once.
  static const Registry& builtin();
  void add(ComponentType type);
  void add(CompositeType type);
  const ComponentType* component(const std::string& name) const;
  const CompositeType* composite(const std::string& name) const;
  std::vector<std::string> component_names(const std::string& kind = "") const;
  std::vector<std::string> composite_names() const;

 private:
  std::map<std::string, ComponentType> components_;
  std::map<std::string, CompositeType> composites_;
};

// The `model:` section, loaded: the composite and one configuration per slot.
class ModelConfig {
 public:
  std::string type;
  const CompositeType* composite = nullptr;
  std::map<std::string, std::shared_ptr<const ComponentConfig>> components;  // by slot
  std::shared_ptr<const ComponentConfig> own;                                  // the composite's fields
  lf::config::Node resolved;  // the section with every default filled in (--dry-run prints it)

  bool has(const std::string& slot) const { return components.count(slot) > 0; }
  const ComponentConfig& component(const std::string& slot) const;
  // The fields of `slot` as `Fields`; an lf::Error naming the slot, its type and what the
  // composite needs otherwise.
  template <class Fields>
  const Fields& fields(const std::string& slot) const {
    const auto* c = dynamic_cast<const ComponentConfigOf<Fields>*>(&component(slot));
    if (!c) wrong_kind(slot);
    return c->fields;
  }
  template <class Fields>
  const Fields& own_fields() const {
    const auto* c = dynamic_cast<const ComponentConfigOf<Fields>*>(own.get());
    if (!c) wrong_kind("");
    return c->fields;
  }

 private:
  [[noreturn]] void wrong_kind(const std::string& slot) const;
};

// Loads and validates `model` (every problem at once, in one lf::config::ConfigError naming
// model.<slot>.<field> with origins).
std::shared_ptr<const ModelConfig> load_model_config(const lf::config::Node& model,
                                                     const Registry& registry = Registry::builtin());

// Builds a component's own parallel context over a subset of the job's ranks.
using ContextFactory = std::function<std::unique_ptr<lf::dist::ParallelContext>(
    const std::string& name, const lf::dist::ParallelLayout& layout, const std::vector<int>& world_ranks)>;

struct BuildArgs {
  const lf::backend::DeviceBackend* backend = nullptr;
  const lf::dist::ParallelContext* context = nullptr;  // the job's (the foundation's) context
  ContextFactory make_context;                         // for components with their own layout
  uint64_t seed = 0;
  at::ScalarType dtype = at::kFloat;
};

// What a model needs from the data pipeline.
struct DataNeeds {
  bool token_data = true;      // reads token datasets (--data-path, or the mock token dataset)
  // Reads a latent store (lf::data::LatentStore, `loongforge-data diffusion`: --data-path DIR) or
  // --mock-data; its latent channels, text and image widths must be these.
  bool latents = false;
  int64_t latent_channels = 0, text_dim = 0, image_dim = 0;
  int64_t vocab_size = 0;      // token ids must stay below this
  std::string mock_only_why;   // non-empty: only --mock-data works, for this reason
  // Reads media (pixel_values ...): trains on a multimodal store (--training-phase sft) or
  // --mock-data; the store's placeholder ids must be these.
  bool media = false;
  int64_t image_token_id = -1, video_token_id = -1;
  // The vision tower's patch geometry (0: unchecked): the store's patch rows must be cut alike.
  int64_t patch_size = 0, temporal_patch_size = 0, merge_size = 0;
  std::string store_videos_why;  // non-empty: a store's videos are refused, for this reason
  // Has a vision tower: the VLM parallel flags (--enable-encoder-hetero-dp, --enable-full-hetero-dp,
  // --use-vit-dp-balance) apply.
  bool vision_tower = false;
  // A VLA policy (pi05): reads VLA samples (--data-path: a reach demo store, loongforge-data
  // make-demo-reach) or --mock-data; images of image_size, chunks of chunk x action_dim padded to
  // max_action_dim, prompts below vocab_size.
  bool vla = false;
  int64_t image_size = 0, chunk = 0, action_dim = 0, max_action_dim = 0;
  // The policy ("pi05", "groot"): a LeRobot dataset is read for pi05 only, its prompts padded to
  // prompt_length (model.tokenizer_max_length).
  std::string policy;
  int64_t prompt_length = 0;
  // The keys that set them (the store's errors name them).
  std::string image_size_key = "model.vision_encoder.image_size", chunk_key = "model.chunk_size";
};

// A composite's plan for one layout: every component's parallel layout and size, known before any
// process group exists; then the Model.
class ModelPlan {
 public:
  virtual ~ModelPlan() = default;
  virtual const ModelConfig& config() const = 0;
  // For --dry-run: every component with its type, parameters and parallel layout, the pipeline
  // stages, per-rank estimates.
  virtual std::string describe() const = 0;
  // One line for the log: "model: causal_lm, 240K parameters, ...".
  virtual std::string summary() const = 0;
  virtual int64_t num_parameters() const = 0;
  virtual DataNeeds data_needs() const = 0;
  // --mock-data: the fields the token dataset does not provide (features ...), a deterministic
  // function of the seed and batch.sample_indices (so they do not depend on the DP layout).
  virtual void add_mock_fields(Batch& batch, uint64_t seed) const {}
  virtual std::unique_ptr<Model> build(const BuildArgs& args) const = 0;
};

// composite->plan for `config`; throws one ConfigError with every layout problem.
std::unique_ptr<ModelPlan> plan_model(std::shared_ptr<const ModelConfig> config, const PlanArgs& args);

}  // namespace lf::models

#include "loongforge/models/registry_impl.h"
