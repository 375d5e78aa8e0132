#include "loongforge/parallel/pipeline/stages.h"

#include <string>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {

std::vector<LayerRange> split_layers(int64_t num_layers, int pp, std::optional<int64_t> first,
                                     std::optional<int64_t> last) {
  LF_CHECK(pp >= 1, "pipeline-model-parallel size must be >= 1, got ", pp);
  LF_CHECK(num_layers >= 1, "model.foundation.num_layers must be >= 1, got ", num_layers);
  LF_CHECK(pp > 1 || (!first && !last),
           "parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers need "
           "parallel.pipeline_model_parallel_size > 1 (it is 1)",
           lf::hint("drop --decoder-first/last-pipeline-num-layers or set "
                    "--pipeline-model-parallel-size"));
  std::vector<int64_t> sizes(static_cast<size_t>(pp), 0);
  if (!first && !last) {
    LF_CHECK(num_layers % pp == 0, "model.foundation.num_layers ", num_layers,
             " is not divisible by parallel.pipeline_model_parallel_size ", pp,
             lf::hint("pick a pipeline size dividing the layer count, or give the first/last "
                      "stage sizes with --decoder-first-pipeline-num-layers / "
                      "--decoder-last-pipeline-num-layers"));
    for (auto& s : sizes) s = num_layers / pp;
  } else {
    LF_CHECK(!first || *first >= 1, "parallel.decoder_first_pipeline_num_layers must be >= 1, got ",
             *first);
    LF_CHECK(!last || *last >= 1, "parallel.decoder_last_pipeline_num_layers must be >= 1, got ",
             *last);
    int64_t rest = num_layers - first.value_or(0) - last.value_or(0);
    const int64_t others = pp - (first ? 1 : 0) - (last ? 1 : 0);
    const std::string given = (first ? "decoder_first_pipeline_num_layers " + std::to_string(*first) : "") +
                              (first && last ? " + " : "") +
                              (last ? "decoder_last_pipeline_num_layers " + std::to_string(*last) : "");
    LF_CHECK(rest >= 0 && (others > 0 ? rest % others == 0 && rest / others >= 1 : rest == 0),
             "model.foundation.num_layers ", num_layers, " minus parallel.", given, " leaves ", rest,
             " layers for the other ", others, " of parallel.pipeline_model_parallel_size ", pp,
             " stages, which must split evenly with at least one layer each",
             lf::hint("adjust the first/last stage sizes"));
    for (int64_t i = 0; i < pp; ++i) sizes[static_cast<size_t>(i)] = others > 0 ? rest / others : 0;
    if (first) sizes.front() = *first;
    if (last) sizes.back() = *last;
  }
  std::vector<LayerRange> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back({at, at + s});
    at += s;
  }
  return out;
}

std::vector<std::vector<LayerRange>> split_virtual_layers(int64_t num_layers, int pp,
                                                          int64_t layers_per_virtual_stage) {
  LF_CHECK(pp >= 2, "parallel.num_layers_per_virtual_pipeline_stage needs "
           "parallel.pipeline_model_parallel_size >= 2, got ", pp);
  const int64_t l = layers_per_virtual_stage;
  LF_CHECK(l >= 1, "parallel.num_layers_per_virtual_pipeline_stage must be >= 1, got ", l);
  LF_CHECK(num_layers % (pp * l) == 0, "model.foundation.num_layers ", num_layers,
           " is not divisible by parallel.pipeline_model_parallel_size ", pp,
           " x parallel.num_layers_per_virtual_pipeline_stage ", l, " = ", pp * l,
           lf::hint("every rank holds the same number of model chunks of " + std::to_string(l) +
                    " layers: pick the layers per virtual stage so that pp x it divides the layer count"));
  const int64_t v = num_layers / (pp * l);
  std::vector<std::vector<LayerRange>> out(static_cast<size_t>(pp));
  for (int64_t c = 0; c < v; ++c)
    for (int64_t r = 0; r < pp; ++r) {
      const int64_t begin = (c * pp + r) * l;
      out[static_cast<size_t>(r)].push_back({begin, begin + l});
    }
  return out;
}

}  // namespace lf::parallel::pipeline
