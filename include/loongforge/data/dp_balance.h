// Data-parallel load balancing for VLM training (--use-vlm-dp-balance, --use-vit-dp-balance):
// the planner, as a pure library piece. Samples of a global batch differ wildly in length (an
// image is 64-1280 tokens, a video up to 16K), so Megatron's contiguous split (rank r takes
// samples [r*n/dp, (r+1)*n/dp)) leaves the slowest rank far behind the mean. The planner
// reassigns the batch's samples across DP ranks to equalise a fitted per-rank cost; a trainer
// whose ranks hold only their own samples moves them with an all-to-all (make_send_plan) before
// the step. loongforge-train's SFT source needs no move: every rank maps the whole store and reads
// its planned samples itself (tools/train/data_source.cpp, docs/data.md). Plain std::vector in
// and out, no LibTorch, no communication: every rank runs the same deterministic planner on the
// same lengths and gets the same plan.
//
// Trainer contract (not done here):
//   * the per-rank cost is a*sum(len^2) + b*sum(len) + c*n_samples; a, b, c are given, or fitted
//     after --vlm-dp-balance-warmup-iters iterations: every rank reports (sum len^2, sum len, n,
//     measured forward seconds) per iteration, rank 0 calls fit_cost_model and broadcasts the
//     three doubles (until then the planner runs with the given or default model);
//   * losses and gradients must be token-weighted over the whole DP group (sum of per-token
//     losses / all-reduced token count), since a balanced plan gives ranks different token
//     counts; then the step is the same whatever the plan;
//   * the ViT variant (plan_image_balance) routes each rank's images to an encoder rank before
//     the vision tower and the features back to their home rank after it (ImageBalancePlan).
#pragma once

#include <cstdint>
#include <vector>

namespace lf::data {

// Cost of a rank's work: a per token^2 (attention, per sample: varlen attention does not cross
// samples), b per token (linear layers), c per sample (launches, per-sample overhead). Any unit;
// only ratios matter to the planner.
struct CostModel {
  double a = 0.0, b = 1.0, c = 0.0;
  double sample_cost(int64_t length) const {
    double l = static_cast<double>(length);
    return a * l * l + b * l + c;
  }
  // The cost of a set of samples (e.g. one rank's): the sum of sample costs.
  double cost(const std::vector<int64_t>& lengths) const;
};

// One measured iteration of one rank: the three features of its samples and the measured time.
struct CostObservation {
  double sum_sq_length = 0;  // sum of len^2
  double sum_length = 0;     // sum of len
  double n_samples = 0;
  double seconds = 0;
};

// Least-squares fit of seconds ~ a*sum_sq_length + b*sum_length + c*n_samples, constrained to
// a, b, c >= 0 (a negative coefficient is noise, and a negative cost would make the planner
// prefer loading a rank): the exact non-negative least-squares solution, found by solving the
// unconstrained problem on every subset of {a, b, c} (columns scaled to unit norm) and keeping
// the feasible one of least residual. Throws lf::Error when the problem is under-determined or
// degenerate: fewer than 3 observations, a non-finite or negative value, the three feature
// columns not linearly independent (e.g. every observation with the same sample count and the
// same total length, so b and c cannot be told apart), an all-zero column, or times that no
// non-negative a, b, c fit (all zero).
CostModel fit_cost_model(const std::vector<CostObservation>& observations);

struct BalanceOptions {
  // Stop refining when the most loaded rank is within (1 + tolerance) of the mean rank cost.
  double tolerance = 0.05;
  // Skip (keep the naive placement, `skipped` = true) when the naive max/mean cost is at most
  // 1 + trigger_threshold. 0: plan whenever the naive split is not perfectly balanced.
  double trigger_threshold = 0.05;
  // Cap on a rank's packed length (sum of its sample lengths): max_length_ratio * the mean packed
  // length per rank, raised to the least any placement can have (the longest sample, plus with
  // equal_counts the n/dp-1 shortest others). <= 0: no cap. The greedy assignment and every
  // refinement step respect it; if the greedy cannot place a sample under the cap (bin packing:
  // possible with a tight ratio) it goes to the least loaded rank with room and
  // BalanceResult::cap_exceeded is set. A skipped plan (the naive placement) is not capped; its
  // cap_exceeded says whether the naive placement is over the cap.
  double max_length_ratio = 1.5;
  // Refinement steps (moves or swaps) after the greedy assignment.
  int max_refinement_steps = 256;
  // Every rank gets n / dp_size samples (n must be divisible by dp_size), as the trainer needs
  // when every rank must run the same number of micro-batches; the refinement then only swaps.
  // false: ranks get any number of samples (at least zero) and the refinement also moves.
  bool equal_counts = true;
  // Each rank's list is ordered as this many consecutive micro-batches of balanced cost (LPT
  // within the rank; RankPlan::micro_batch_offsets). With equal_counts, the rank's count must be
  // divisible by it and the micro-batches get equal counts; without, each gets at most
  // ceil(count / micro_batches_per_rank) (so one is empty only when the rank has fewer samples
  // than micro-batches). A skipped plan keeps the naive order, cut at k*count/micro_batches.
  int micro_batches_per_rank = 1;
  // Relabel the balanced ranks (a permutation, which changes no load) so that each keeps as much
  // of its current samples as possible (greedy on kept tokens): less all-to-all traffic.
  bool minimize_movement = true;
};

struct RankPlan {
  std::vector<int64_t> samples;  // global sample indices, in micro-batch order
  // micro_batch_offsets[k]..[k+1] delimit micro-batch k in `samples` (micro_batches_per_rank+1
  // entries).
  std::vector<int64_t> micro_batch_offsets;
  double cost = 0;
  int64_t packed_length = 0;  // sum of the samples' lengths
};

struct BalanceStats {
  double naive_max_over_mean = 1;     // of the current (naive) placement
  double balanced_max_over_mean = 1;  // of the returned plan
  // A lower bound on any placement's max/mean: the largest of the mean, the costliest sample,
  // the pigeonhole bounds (of the t*dp+1 costliest samples one rank holds t+1) and, with equal
  // counts, the costliest sample plus the n/dp-1 cheapest others. Not tight; the tolerance
  // cannot be met when it exceeds 1 + tolerance.
  double lower_bound_max_over_mean = 1;
  double mean_cost = 0;
  int refinement_steps = 0;
  int64_t moved_samples = 0;  // samples whose rank differs from the current placement
};

struct BalanceResult {
  std::vector<RankPlan> ranks;  // dp_size entries
  BalanceStats stats;
  // The naive placement was returned: below the trigger threshold, or no better plan found.
  bool skipped = false;
  bool cap_exceeded = false;  // some rank's packed length is above the cap (see max_length_ratio)
  int64_t length_cap = 0;     // the cap in tokens (0: none)
};

// Megatron's contiguous split of n samples: rank r takes [r*n/dp, (r+1)*n/dp).
std::vector<std::vector<int64_t>> naive_placement(int64_t n_samples, int dp_size);

// Plans the global batch: sample_lengths[i] is global sample i's length in tokens. Deterministic:
// samples sorted by cost descending with ties broken by index, ranks chosen with ties broken by
// rank, so every rank computes the same plan. The algorithm: LPT (costliest sample first to the
// least loaded rank with room under the count and length caps; a repair pass if it had to
// overfill a rank), then refinement between the most
// loaded rank and each other rank: the swap (or, without equal_counts, the move) that minimises
// the pair's new maximum while lowering it, falling back to exchanges of up to two samples a side
// when no single one helps, until max/mean <= 1 + tolerance, no step helps, or
// max_refinement_steps. The plan is returned only when better than the naive one. The same
// inputs give the same plan on every rank (same binary: the costs are the same doubles).
BalanceResult plan_balance(const std::vector<int64_t>& sample_lengths, int dp_size,
                           const CostModel& model, const BalanceOptions& options = {});

// The all-to-all of a plan: send[src][dst] lists the global indices rank src sends to rank dst
// (send[r][r]: those it keeps), in the order they appear in dst's plan; the counts are the
// all-to-all split sizes. current[r]: the indices rank r holds now (naive_placement for the
// language-model batch). Every index in the plan must be held by exactly one rank.
struct SendPlan {
  std::vector<std::vector<std::vector<int64_t>>> send;  // [src][dst] -> global indices
  int64_t moved_samples = 0;                             // sum over src != dst
};
SendPlan make_send_plan(const std::vector<std::vector<int64_t>>& current,
                        const BalanceResult& plan);

// --use-vit-dp-balance: images (cost len^2 by default) spread over the ranks before the vision
// encoder. image_lengths_per_rank[r][k]: the token count of rank r's k-th image. Images are
// identified by (home rank, local index); encode[e] lists, in encoding order, the images rank e
// encodes; send[src][dst] the local indices rank src sends to encoder rank dst (in encode[dst]
// order); back[r][k] = {encoder rank, position in encode[encoder]} of rank r's image k, the
// inverse permutation that routes the encoder's features home (rank e sends encode[e][j]'s
// features to encode[e][j].home, and rank r finds its image k's features at back[r][k]).
// Counts are free (equal_counts is ignored), no micro-batching (micro_batches_per_rank ignored).
struct ImageRef {
  int home = 0;       // the rank the image belongs to
  int64_t local = 0;  // its index among that rank's images
  bool operator==(const ImageRef&) const = default;
};
struct ImageSlot {
  int encoder = 0;       // the rank that encodes the image
  int64_t position = 0;  // its index in encode[encoder]
  bool operator==(const ImageSlot&) const = default;
};
struct ImageBalancePlan {
  std::vector<std::vector<ImageRef>> encode;             // [encoder rank] -> images, in order
  std::vector<std::vector<std::vector<int64_t>>> send;   // [src][dst] -> src's local indices
  std::vector<std::vector<ImageSlot>> back;              // [home][local] -> where it is encoded
  BalanceStats stats;
  bool skipped = false;
};
ImageBalancePlan plan_image_balance(const std::vector<std::vector<int64_t>>& image_lengths_per_rank,
                                    int dp_size, const CostModel& model = {1.0, 0.0, 0.0},
                                    const BalanceOptions& options = {});

}  // namespace lf::data
