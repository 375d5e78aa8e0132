// A debugging and testing aid: the model's full parameters as one fp32 safetensors file (keys:
// parameter names), so that runs under different layouts can be compared element by element.
// loongforge-train writes it at the end of training when LOONGFORGE_DUMP_PARAMS=PATH is set.
// Not a checkpoint (no optimizer state, no iteration; see train/checkpoint for those).
#pragma once

#include <string>
#include <vector>

#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/model.h"

namespace lf::train {

// Collective over every group's TP group: split parameters are all-gathered by their Sharding.
// The rank with tp_rank 0 and dp_rank 0 of each pipeline stage of the job's context `ctx` writes
// every group's parameters it holds (a component on its own layout is placed so that this rank
// holds its TP rank 0 shards); with pp > 1 stage k writes PATH.pp<k>. Throws lf::Error naming the
// path if it cannot be written.
// Every group's parameters of this rank's stage, full (each group's TP shards gathered over its
// own tp group: the experts' over the expert-parallel group). Collective over every group.
std::vector<std::pair<std::string, at::Tensor>> gather_full_groups(const std::vector<lf::models::ParameterGroup>& groups);

void dump_parameters(const std::string& path, const std::vector<lf::models::ParameterGroup>& groups,
                     const lf::dist::ParallelContext& ctx);

// Collective over the parameters' TP group (`tp`; null or size 1: none): every parameter as its
// full (unsharded) fp32 CPU tensor, in the model's order, on every TP rank (vocabulary tables
// keep this TP size's padding rows). A pipeline stage's tied_copy of the embedding is left out
// (the first stage has it).
std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters(
    const std::vector<lf::parallel::Parameter>& params, lf::backend::Communicator* tp);

// Collective over the pipeline group: each stage's gather_full_parameters() result brought to
// pipeline rank 0, in stage order (the whole model there); the other stages get an empty list.
// Called by the ranks of one pipeline group (e.g. tp_rank 0, dp_rank 0), every stage alike.
std::vector<std::pair<std::string, at::Tensor>> gather_pipeline_parameters(
    std::vector<std::pair<std::string, at::Tensor>> stage_params, const lf::dist::ParallelContext& ctx);

}  // namespace lf::train
