#include "loongforge/parallel/pipeline/stages.h"

#include <cctype>
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

namespace {
// Expands x*N and (...)*N, drops ',' and spaces: "Et*2|(t|)*2L" -> "Ett|t|t|L".
std::string expand_layout(const std::string& layout, size_t& i, bool nested) {
  std::string out;
  while (i < layout.size()) {
    const char c = layout[i];
    if (c == ')') {
      LF_CHECK(nested, "pipeline layout '", layout, "': ')' at position ", i, " has no '('");
      return out;
    }
    std::string unit;
    if (c == '(') {
      ++i;
      unit = expand_layout(layout, i, true);
      LF_CHECK(i < layout.size() && layout[i] == ')', "pipeline layout '", layout, "': '(' is not closed");
      ++i;
    } else if (c == ',' || c == ' ') {
      ++i;
      continue;
    } else {
      LF_CHECK(c == 'E' || c == 't' || c == 'L' || c == '|', "pipeline layout '", layout, "': symbol '",
               std::string(1, c), "' at position ", i,
               c == 'm' ? " (MTP layers) is not supported" : " is not one of E, t, L, |, (, ), *N",
               lf::hint("E = embedding, t = decoder layer, L = loss, | between stages, e.g. Et*3|t*4|t*3L"));
      unit = std::string(1, c);
      ++i;
    }
    int64_t times = 1;
    if (i < layout.size() && layout[i] == '*') {
      size_t j = ++i;
      while (i < layout.size() && std::isdigit(static_cast<unsigned char>(layout[i]))) ++i;
      LF_CHECK(i > j, "pipeline layout '", layout, "': '*' at position ", j - 1, " needs a count");
      times = std::stoll(layout.substr(j, i - j));
    }
    for (int64_t k = 0; k < times; ++k) out += unit;
  }
  LF_CHECK(!nested, "pipeline layout '", layout, "': '(' is not closed");
  return out;
}
}  // namespace

std::vector<std::vector<LayerRange>> split_by_layout(const std::string& layout, int64_t num_layers, int pp) {
  LF_CHECK(pp >= 1, "pipeline-model-parallel size must be >= 1, got ", pp);
  size_t pos = 0;
  const std::string flat = expand_layout(layout, pos, false);
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back() += c;
  }
  const int64_t n = static_cast<int64_t>(stages.size());
  // More stages than ranks are virtual stages (the interleaved schedule), which needs pp > 1.
  LF_CHECK(pp > 1 || n == 1, "parallel.pipeline_model_parallel_layout '", layout, "' has ", n,
           " stages and parallel.pipeline_model_parallel_size is 1: the interleaved schedule needs pipeline "
           "parallelism",
           lf::hint("set --pipeline-model-parallel-size to the stage count (or a divisor of it), or drop the layout"));
  LF_CHECK(n % pp == 0, "parallel.pipeline_model_parallel_layout '", layout, "' has ", n,
           " stages, not a multiple of parallel.pipeline_model_parallel_size ", pp,
           lf::hint("list pp x v stages: every rank's first model chunk, then every rank's second, ..."));
  int64_t layers = 0;
  for (int64_t k = 0; k < n; ++k) {
    const auto& st = stages[static_cast<size_t>(k)];
    for (size_t j = 0; j < st.size(); ++j) {
      if (st[j] == 't') ++layers;
      const bool ok = st[j] == 't' || (st[j] == 'E' && k == 0 && j == 0) || (st[j] == 'L' && k == n - 1 && j + 1 == st.size());
      LF_CHECK(ok, "parallel.pipeline_model_parallel_layout '", layout, "': '", std::string(1, st[j]), "' in stage ", k,
               " must ", st[j] == 'E' ? "open the first stage" : "close the last stage",
               lf::hint("the embedding runs before everything, the loss after everything"));
    }
  }
  LF_CHECK(flat.find('E') != std::string::npos && flat.find('L') != std::string::npos,
           "parallel.pipeline_model_parallel_layout '", layout, "' needs 'E' (embedding) in the first stage and 'L' "
           "(loss) in the last", lf::hint("e.g. Et*3|t*4|t*4|t*3L for 14 layers over 4 stages"));
  LF_CHECK(layers == num_layers, "parallel.pipeline_model_parallel_layout '", layout, "' places ", layers,
           " decoder layers ('t'), model.foundation.num_layers is ", num_layers,
           lf::hint("give exactly one 't' per decoder layer"));
  std::vector<std::vector<LayerRange>> out(static_cast<size_t>(pp));
  int64_t at = 0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t count = 0;
    for (char c : stages[static_cast<size_t>(k)]) count += c == 't';
    out[static_cast<size_t>(k % pp)].push_back({at, at + count});
    at += count;
  }
  return out;
}

std::string PipelineStage::describe() const {
  std::string out = "layers ";
  for (size_t k = 0; k < chunks.size(); ++k)
    out += (k ? " + [" : "[") + std::to_string(chunks[k].begin) + ", " + std::to_string(chunks[k].end) + ")";
  return out;
}

PipelineStage pipeline_stage(int64_t num_layers, int pp, int pp_rank, const StageSplit& split) {
  LF_CHECK(pp_rank >= 0 && pp_rank < pp, "pipeline rank ", pp_rank, " is outside [0, ", pp, ")");
  PipelineStage stage;
  stage.first = pp_rank == 0;
  stage.last = pp_rank == pp - 1;
  const auto r = static_cast<size_t>(pp_rank);
  if (split.layout) {
    LF_CHECK(!split.first_stage_layers && !split.last_stage_layers && !split.layers_per_virtual_stage,
             "parallel.pipeline_model_parallel_layout cannot be combined with "
             "parallel.decoder_first/last_pipeline_num_layers or num_layers_per_virtual_pipeline_stage",
             lf::hint("the layout string says everything: drop the other split flags"));
    stage.chunks = split_by_layout(*split.layout, num_layers, pp)[r];
  } else if (split.layers_per_virtual_stage) {
    LF_CHECK(!split.first_stage_layers && !split.last_stage_layers,
             "parallel.num_layers_per_virtual_pipeline_stage cannot be combined with "
             "parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers",
             lf::hint("use either virtual stages (interleaved schedule) or an uneven split"));
    stage.chunks = split_virtual_layers(num_layers, pp, *split.layers_per_virtual_stage)[r];
  } else {
    stage.chunks = {split_layers(num_layers, pp, split.first_stage_layers, split.last_stage_layers)[r]};
  }
  return stage;
}

}  // namespace lf::parallel::pipeline
