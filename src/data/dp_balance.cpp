// Data-parallel load balancing planner: see include/loongforge/data/dp_balance.h and
// docs/data.md ("VLM data-parallel load balancing").
#include "loongforge/data/dp_balance.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "loongforge/core/error.h"

namespace lf::data {

double CostModel::cost(const std::vector<int64_t>& lengths) const {
  double s = 0;
  for (int64_t l : lengths) s += sample_cost(l);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Fit

namespace {

// Least squares on the columns `cols` of the (column-scaled) design matrix by Householder QR.
// Returns false when the columns are numerically dependent.
bool solve_subset(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                  const std::vector<int>& cols, std::array<double, 3>& coef, double& residual) {
  const size_t m = x.size();
  const size_t k = cols.size();
  std::vector<std::vector<double>> a(k, std::vector<double>(m));  // column-major copy
  for (size_t j = 0; j < k; ++j)
    for (size_t i = 0; i < m; ++i) a[j][i] = x[i][static_cast<size_t>(cols[j])];
  std::vector<double> b = y;
  std::vector<double> rdiag(k);
  for (size_t j = 0; j < k; ++j) {
    double norm = 0;
    for (size_t i = j; i < m; ++i) norm += a[j][i] * a[j][i];
    norm = std::sqrt(norm);
    // Columns are scaled to unit norm, so an absolute threshold is a relative one.
    if (norm < 1e-9) return false;
    double alpha = a[j][j] > 0 ? -norm : norm;
    std::vector<double> v(m, 0.0);
    for (size_t i = j; i < m; ++i) v[i] = a[j][i];
    v[j] -= alpha;
    double vv = 0;
    for (size_t i = j; i < m; ++i) vv += v[i] * v[i];
    if (vv > 0) {
      for (size_t c = j; c < k; ++c) {
        double d = 0;
        for (size_t i = j; i < m; ++i) d += v[i] * a[c][i];
        d = 2 * d / vv;
        for (size_t i = j; i < m; ++i) a[c][i] -= d * v[i];
      }
      double d = 0;
      for (size_t i = j; i < m; ++i) d += v[i] * b[i];
      d = 2 * d / vv;
      for (size_t i = j; i < m; ++i) b[i] -= d * v[i];
    }
    rdiag[j] = a[j][j];
  }
  std::array<double, 3> sol{0, 0, 0};
  for (size_t jj = k; jj-- > 0;) {
    double s = b[jj];
    for (size_t c = jj + 1; c < k; ++c) s -= a[c][jj] * sol[c];
    sol[jj] = s / rdiag[jj];
  }
  coef = {0, 0, 0};
  for (size_t j = 0; j < k; ++j) coef[static_cast<size_t>(cols[j])] = sol[j];
  residual = 0;
  for (size_t i = 0; i < m; ++i) {
    double p = 0;
    for (size_t c = 0; c < 3; ++c) p += x[i][c] * coef[c];
    residual += (y[i] - p) * (y[i] - p);
  }
  return true;
}

}  // namespace

CostModel fit_cost_model(const std::vector<CostObservation>& observations) {
  const size_t m = observations.size();
  LF_CHECK(m >= 3, "fit_cost_model: ", m, " observations; a, b and c need at least 3",
           lf::hint("collect more warm-up iterations (--vlm-dp-balance-warmup-iters) or give "
                    "a, b, c"));
  std::vector<std::array<double, 3>> x(m);
  std::vector<double> y(m);
  for (size_t i = 0; i < m; ++i) {
    const auto& o = observations[i];
    for (double v : {o.sum_sq_length, o.sum_length, o.n_samples, o.seconds})
      LF_CHECK(std::isfinite(v) && v >= 0, "fit_cost_model: observation ", i,
               " has a negative or non-finite value (sum_sq_length ", o.sum_sq_length,
               ", sum_length ", o.sum_length, ", n_samples ", o.n_samples, ", seconds ",
               o.seconds, ")");
    x[i] = {o.sum_sq_length, o.sum_length, o.n_samples};
    y[i] = o.seconds;
  }
  // Scale each column to unit norm so that sum len^2 (~1e8) and n (~10) are comparable.
  std::array<double, 3> scale{};
  for (size_t c = 0; c < 3; ++c) {
    double s = 0;
    for (size_t i = 0; i < m; ++i) s += x[i][c] * x[i][c];
    scale[c] = std::sqrt(s);
    LF_CHECK(scale[c] > 0, "fit_cost_model: the ", (c == 0 ? "sum_sq_length" : c == 1 ? "sum_length" : "n_samples"),
             " column is all zero; a, b and c are under-determined");
    for (size_t i = 0; i < m; ++i) x[i][c] /= scale[c];
  }
  std::array<double, 3> full{};
  double full_res = 0;
  LF_CHECK(solve_subset(x, y, {0, 1, 2}, full, full_res),
           "fit_cost_model: the observations' (sum len^2, sum len, n) are linearly dependent, "
           "so a, b and c cannot be told apart (",
           m, " observations)",
           lf::hint("observations need varied sample counts and length mixes (e.g. all ranks "
                    "with the same number of same-length samples are degenerate); or give a, b, c"));
  // Exact non-negative least squares for three unknowns: the optimum is the unconstrained least
  // squares on its support, so the best feasible subset solution is it. Subsets in a fixed order
  // (full first) and strict improvement keep the choice deterministic.
  static const std::vector<std::vector<int>> subsets = {{0, 1, 2}, {0, 1}, {0, 2}, {1, 2},
                                                        {0},       {1},    {2}};
  std::array<double, 3> best{0, 0, 0};
  double best_res = std::numeric_limits<double>::infinity();
  for (const auto& cols : subsets) {
    std::array<double, 3> coef{};
    double res = 0;
    if (!solve_subset(x, y, cols, coef, res)) continue;
    if (std::any_of(coef.begin(), coef.end(), [](double v) { return v < 0; })) continue;
    if (res < best_res * (1 - 1e-12)) {
      best = coef;
      best_res = res;
    }
  }
  LF_CHECK(best_res < std::numeric_limits<double>::infinity() &&
               std::any_of(best.begin(), best.end(), [](double v) { return v > 0; }),
           "fit_cost_model: no non-negative a, b, c fit the measured times (all zero?)");
  return CostModel{best[0] / scale[0], best[1] / scale[1], best[2] / scale[2]};
}

// ---------------------------------------------------------------------------------------------
// Planning

std::vector<std::vector<int64_t>> naive_placement(int64_t n_samples, int dp_size) {
  LF_CHECK(dp_size >= 1 && n_samples >= 0, "naive_placement: n_samples ", n_samples,
           ", dp_size ", dp_size);
  std::vector<std::vector<int64_t>> p(static_cast<size_t>(dp_size));
  for (int r = 0; r < dp_size; ++r)
    for (int64_t i = r * n_samples / dp_size; i < (r + 1) * n_samples / dp_size; ++i)
      p[static_cast<size_t>(r)].push_back(i);
  return p;
}

namespace {

struct Ctx {
  const std::vector<int64_t>& len;
  std::vector<double> w;  // sample costs
  int dp;
  double mean = 0;
};

double max_over_mean(const std::vector<double>& loads, double mean) {
  if (mean <= 0) return 1.0;
  return *std::max_element(loads.begin(), loads.end()) / mean;
}

// Order of the samples: cost descending, then index ascending.
std::vector<int64_t> by_cost_desc(const std::vector<double>& w, const std::vector<int64_t>& ids) {
  std::vector<int64_t> o = ids;
  std::stable_sort(o.begin(), o.end(), [&](int64_t x, int64_t y) {
    double wx = w[static_cast<size_t>(x)], wy = w[static_cast<size_t>(y)];
    if (wx != wy) return wx > wy;
    return x < y;
  });
  return o;
}

// Orders one rank's samples as `m` micro-batches of balanced cost (LPT under a count cap),
// each micro-batch in index order; fills samples and offsets.
void order_micro_batches(const std::vector<double>& w, std::vector<int64_t> ids, int m, bool equal,
                         RankPlan& out) {
  std::sort(ids.begin(), ids.end());
  out.micro_batch_offsets.assign(1, 0);
  if (m <= 1) {
    out.samples = ids;
    out.micro_batch_offsets.push_back(static_cast<int64_t>(ids.size()));
    return;
  }
  // Equal counts: exactly size/m each; free counts: at most ceil(size/m) each.
  const size_t um = static_cast<size_t>(m);
  const size_t cap = equal ? ids.size() / um : (ids.size() + um - 1) / um;
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(m));
  std::vector<double> load(static_cast<size_t>(m), 0.0);
  for (int64_t i : by_cost_desc(w, ids)) {
    size_t best = groups.size();
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].size() >= cap) continue;
      if (best == groups.size() || load[g] < load[best]) best = g;
    }
    groups[best].push_back(i);
    load[best] += w[static_cast<size_t>(i)];
  }
  out.samples.clear();
  for (auto& g : groups) {
    std::sort(g.begin(), g.end());
    out.samples.insert(out.samples.end(), g.begin(), g.end());
    out.micro_batch_offsets.push_back(static_cast<int64_t>(out.samples.size()));
  }
}

// Uses the given placement as the result (skipped).
void fill_from_placement(const Ctx& c, const std::vector<std::vector<int64_t>>& placement, int m,
                         BalanceResult& res) {
  res.ranks.assign(static_cast<size_t>(c.dp), {});
  for (int r = 0; r < c.dp; ++r) {
    RankPlan& rp = res.ranks[static_cast<size_t>(r)];
    rp.samples = placement[static_cast<size_t>(r)];
    const int64_t n = static_cast<int64_t>(rp.samples.size());
    rp.micro_batch_offsets.clear();
    for (int k = 0; k <= m; ++k) rp.micro_batch_offsets.push_back(k * n / m);
    for (int64_t i : rp.samples) {
      rp.cost += c.w[static_cast<size_t>(i)];
      rp.packed_length += c.len[static_cast<size_t>(i)];
    }
  }
}

BalanceResult balance(const std::vector<int64_t>& lengths, int dp, const CostModel& model,
                      const BalanceOptions& opt,
                      const std::vector<std::vector<int64_t>>& current) {
  LF_CHECK(dp >= 1, "plan_balance: dp_size ", dp, " must be >= 1");
  for (double v : {model.a, model.b, model.c})
    LF_CHECK(std::isfinite(v) && v >= 0, "plan_balance: cost model (a ", model.a, ", b ", model.b,
             ", c ", model.c, ") must be finite and non-negative");
  LF_CHECK(opt.tolerance >= 0 && opt.trigger_threshold >= 0 && opt.max_refinement_steps >= 0 &&
               opt.micro_batches_per_rank >= 1,
           "plan_balance: bad options (tolerance ", opt.tolerance, ", trigger_threshold ",
           opt.trigger_threshold, ", max_refinement_steps ", opt.max_refinement_steps,
           ", micro_batches_per_rank ", opt.micro_batches_per_rank, ")");
  const int64_t n = static_cast<int64_t>(lengths.size());
  const size_t udp = static_cast<size_t>(dp);
  const int m = opt.micro_batches_per_rank;
  if (opt.equal_counts) {
    LF_CHECK(n % dp == 0, "plan_balance: ", n, " samples cannot be split equally over ", dp,
             " ranks", lf::hint("the global batch must be a multiple of dp_size, or set "
                                "equal_counts = false"));
    LF_CHECK((n / dp) % m == 0, "plan_balance: ", n / dp, " samples per rank cannot form ", m,
             " equal micro-batches");
  }
  Ctx c{lengths, std::vector<double>(static_cast<size_t>(n)), dp};
  int64_t total_len = 0, longest = 0;
  double total = 0, w_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    LF_CHECK(lengths[static_cast<size_t>(i)] >= 0, "plan_balance: sample ", i, " has length ",
             lengths[static_cast<size_t>(i)]);
    c.w[static_cast<size_t>(i)] = model.sample_cost(lengths[static_cast<size_t>(i)]);
    total += c.w[static_cast<size_t>(i)];
    total_len += lengths[static_cast<size_t>(i)];
    longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    w_max = std::max(w_max, c.w[static_cast<size_t>(i)]);
  }
  c.mean = total / dp;

  BalanceResult res;
  res.stats.mean_cost = c.mean;
  // Current placement: validate and measure.
  std::vector<int> cur_rank(static_cast<size_t>(n), -1);
  std::vector<double> cur_load(udp, 0.0);
  LF_CHECK(current.size() == udp, "plan_balance: current placement has ", current.size(),
           " ranks, dp_size is ", dp);
  for (int r = 0; r < dp; ++r)
    for (int64_t i : current[static_cast<size_t>(r)]) {
      LF_CHECK(i >= 0 && i < n && cur_rank[static_cast<size_t>(i)] < 0,
               "plan_balance: current placement: sample ", i, " out of range or held twice");
      cur_rank[static_cast<size_t>(i)] = r;
      cur_load[static_cast<size_t>(r)] += c.w[static_cast<size_t>(i)];
    }
  LF_CHECK(std::find(cur_rank.begin(), cur_rank.end(), -1) == cur_rank.end(),
           "plan_balance: current placement misses samples");
  res.stats.naive_max_over_mean = max_over_mean(cur_load, c.mean);

  // Lower bound on the max rank cost.
  double lb = std::max(c.mean, w_max);
  std::vector<double> ws = c.w;
  std::sort(ws.begin(), ws.end());
  // Pigeonhole: of the t*dp+1 costliest samples some rank holds t+1, at least the t+1 cheapest
  // of them.
  for (int64_t t = 1; t * dp + 1 <= n; ++t) {
    double b = 0;
    for (int64_t j = 0; j <= t; ++j) b += ws[static_cast<size_t>(n - 1 - t * dp + j)];
    lb = std::max(lb, b);
  }
  if (opt.equal_counts && n > 0) {
    const int64_t k = n / dp;
    // The rank holding the costliest sample also holds k-1 others, at least the cheapest ones.
    double b = ws.back();
    for (int64_t j = 0; j < k - 1; ++j) b += ws[static_cast<size_t>(j)];
    lb = std::max(lb, b);
  }
  res.stats.lower_bound_max_over_mean = c.mean > 0 ? lb / c.mean : 1.0;

  if (opt.max_length_ratio > 0 && n > 0) {
    // The floor: the longest sample alone, and with equal counts together with the n/dp-1
    // shortest others (the rank that holds it holds that many more).
    int64_t floor_len = longest;
    if (opt.equal_counts) {
      std::vector<int64_t> ls = lengths;
      std::sort(ls.begin(), ls.end());
      for (int64_t j = 0; j < n / dp - 1; ++j) floor_len += ls[static_cast<size_t>(j)];
    }
    const double mean_len = static_cast<double>(total_len) / dp;
    res.length_cap =
        std::max(floor_len, static_cast<int64_t>(std::floor(opt.max_length_ratio * mean_len)));
  }
  const int64_t cap = res.length_cap > 0 ? res.length_cap : std::numeric_limits<int64_t>::max();
  auto finish_naive = [&]() {
    fill_from_placement(c, current, m, res);
    res.skipped = true;
    res.stats.balanced_max_over_mean = res.stats.naive_max_over_mean;
    res.cap_exceeded = std::any_of(res.ranks.begin(), res.ranks.end(),
                                   [&](const RankPlan& r) { return r.packed_length > cap; });
    return res;
  };
  if (c.mean <= 0 || res.stats.naive_max_over_mean <= 1 + opt.trigger_threshold)
    return finish_naive();

  // 1. LPT: costliest first, to the least loaded rank with room (count, then length cap).
  const int64_t kcap = opt.equal_counts ? n / dp : std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> groups(udp);
  std::vector<double> load(udp, 0.0);
  std::vector<int64_t> plen(udp, 0);
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  for (int64_t i : by_cost_desc(c.w, all)) {
    const int64_t li = lengths[static_cast<size_t>(i)];
    int best = -1, fallback = -1;
    for (int r = 0; r < dp; ++r) {
      const size_t ur = static_cast<size_t>(r);
      if (static_cast<int64_t>(groups[ur].size()) >= kcap) continue;
      if (fallback < 0 || load[ur] < load[static_cast<size_t>(fallback)]) fallback = r;
      if (plen[ur] + li > cap) continue;
      if (best < 0 || load[ur] < load[static_cast<size_t>(best)]) best = r;
    }
    if (best < 0) best = fallback;
    const size_t ub = static_cast<size_t>(best);
    groups[ub].push_back(i);
    load[ub] += c.w[static_cast<size_t>(i)];
    plen[ub] += li;
  }

  // 1b. Cap repair (only when the greedy had to overfill a rank): exchanges that lower an
  // over-cap rank's length while keeping the partner under the cap, the largest decrease first
  // (up to the overflow), then the smaller pair load; bounded by n*dp steps.
  for (int64_t guard = 0; guard < n * dp; ++guard) {
    int R = -1;
    for (int r = 0; r < dp; ++r)
      if (plen[static_cast<size_t>(r)] > cap) {
        R = r;
        break;
      }
    if (R < 0) break;
    const size_t uR = static_cast<size_t>(R);
    const int64_t over = plen[uR] - cap;
    int64_t best_gain = 0;
    double best_load = 0;
    int best_p = -1;
    int64_t best_a = -1, best_b = -1;
    for (int p = 0; p < dp; ++p) {
      const size_t up = static_cast<size_t>(p);
      if (p == R || plen[up] >= cap) continue;
      for (size_t ia = 0; ia < groups[uR].size(); ++ia) {
        const size_t sa = static_cast<size_t>(groups[uR][ia]);
        // ib == gp.size(): a move (free counts only).
        const size_t nb = groups[up].size() + (opt.equal_counts ? 0 : 1);
        for (size_t ib = 0; ib < nb; ++ib) {
          const bool move = ib == groups[up].size();
          const size_t sb = move ? 0 : static_cast<size_t>(groups[up][ib]);
          const int64_t dl = lengths[sa] - (move ? 0 : lengths[sb]);
          if (dl <= 0 || plen[up] + dl > cap) continue;
          const double dw = c.w[sa] - (move ? 0.0 : c.w[sb]);
          const int64_t gain = std::min(dl, over);
          const double pair_load = std::max(load[uR] - dw, load[up] + dw);
          if (gain > best_gain || (gain == best_gain && pair_load < best_load)) {
            best_gain = gain;
            best_load = pair_load;
            best_p = p;
            best_a = static_cast<int64_t>(ia);
            best_b = move ? -1 : static_cast<int64_t>(ib);
          }
        }
      }
    }
    if (best_p < 0) break;  // cannot repair: reported as cap_exceeded
    const size_t up = static_cast<size_t>(best_p);
    const int64_t sa = groups[uR][static_cast<size_t>(best_a)];
    auto shift = [&](int64_t i, size_t from, size_t to) {
      load[from] -= c.w[static_cast<size_t>(i)];
      load[to] += c.w[static_cast<size_t>(i)];
      plen[from] -= lengths[static_cast<size_t>(i)];
      plen[to] += lengths[static_cast<size_t>(i)];
    };
    shift(sa, uR, up);
    if (best_b >= 0) {
      const int64_t sb = groups[up][static_cast<size_t>(best_b)];
      shift(sb, up, uR);
      groups[uR][static_cast<size_t>(best_a)] = sb;
      groups[up][static_cast<size_t>(best_b)] = sa;
    } else {
      groups[uR].erase(groups[uR].begin() + best_a);
      groups[up].push_back(sa);
    }
  }

  // 2. Refinement: the most loaded rank M against every other rank p: the exchange of a subset A
  // of M's samples for a subset B of p's that minimises the pair's new maximum, provided it is
  // below load[M] and both ranks stay under the length cap. Single swaps (|A| = |B| = 1) and,
  // with free counts, single moves (|B| = 0) first; only when none helps, exchanges of up to two
  // samples a side (|A| = |B| with equal counts), on ranks small enough for the pair search.
  // The sorted load vector decreases lexicographically at every step, so this cannot cycle.
  struct Subset {
    std::array<int64_t, 2> pos{-1, -1};  // positions in the group, -1: unused
    int size = 0;
    double w = 0;
    int64_t len = 0;
  };
  auto subsets = [&](const std::vector<int64_t>& g, int size) {
    std::vector<Subset> out;
    if (size == 0) {
      out.push_back({});
    } else if (size == 1) {
      for (size_t i = 0; i < g.size(); ++i)
        out.push_back({{static_cast<int64_t>(i), -1}, 1, c.w[static_cast<size_t>(g[i])],
                       lengths[static_cast<size_t>(g[i])]});
    } else {
      for (size_t i = 0; i < g.size(); ++i)
        for (size_t j = i + 1; j < g.size(); ++j) {
          const size_t si = static_cast<size_t>(g[i]), sj = static_cast<size_t>(g[j]);
          out.push_back({{static_cast<int64_t>(i), static_cast<int64_t>(j)}, 2, c.w[si] + c.w[sj],
                         lengths[si] + lengths[sj]});
        }
    }
    return out;
  };
  // (|A|, |B|) shapes of the two phases.
  std::vector<std::pair<int, int>> phase1 = {{1, 1}}, phase2 = {{2, 2}};
  if (!opt.equal_counts) {
    phase1.push_back({1, 0});
    for (auto s : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 0}}) phase2.push_back(s);
  }
  constexpr size_t kPairSearchLimit = 48;  // samples per rank above which phase 2 is skipped
  int steps = 0;
  const double target = (1 + opt.tolerance) * c.mean;
  while (steps < opt.max_refinement_steps) {
    int M = 0;
    for (int r = 1; r < dp; ++r)
      if (load[static_cast<size_t>(r)] > load[static_cast<size_t>(M)]) M = r;
    const size_t uM = static_cast<size_t>(M);
    if (load[uM] <= target) break;
    double best_max = load[uM];
    int best_p = -1;
    Subset best_a, best_b;
    for (const auto* phase : {&phase1, &phase2}) {
      for (auto [na, nb] : *phase) {
        if ((na == 2 || nb == 2) && groups[uM].size() > kPairSearchLimit) continue;
        const std::vector<Subset> sa_all = subsets(groups[uM], na);
        for (int p = 0; p < dp; ++p) {
          if (p == M) continue;
          const size_t up = static_cast<size_t>(p);
          if (nb == 2 && groups[up].size() > kPairSearchLimit) continue;
          const std::vector<Subset> sb_all = subsets(groups[up], nb);
          for (const Subset& A : sa_all)
            for (const Subset& B : sb_all) {
              const double d = A.w - B.w;
              if (d <= 0) continue;
              const double nm = std::max(load[uM] - d, load[up] + d);
              if (!(nm < best_max)) continue;
              const int64_t dl = A.len - B.len;
              if (plen[up] + dl > cap || plen[uM] - dl > cap) continue;
              best_max = nm;
              best_p = p;
              best_a = A;
              best_b = B;
            }
        }
      }
      if (best_p >= 0) break;
    }
    if (best_p < 0) break;
    const size_t up = static_cast<size_t>(best_p);
    auto take = [&](std::vector<int64_t>& g, const Subset& s) {
      std::vector<int64_t> out;
      for (int k = s.size; k-- > 0;) {  // positions ascending: erase the later one first
        const size_t pos = static_cast<size_t>(s.pos[static_cast<size_t>(k)]);
        out.push_back(g[pos]);
        g.erase(g.begin() + static_cast<std::ptrdiff_t>(pos));
      }
      return out;
    };
    const std::vector<int64_t> from_m = take(groups[uM], best_a);
    const std::vector<int64_t> from_p = take(groups[up], best_b);
    for (int64_t i : from_m) {
      groups[up].push_back(i);
      load[uM] -= c.w[static_cast<size_t>(i)];
      load[up] += c.w[static_cast<size_t>(i)];
      plen[uM] -= lengths[static_cast<size_t>(i)];
      plen[up] += lengths[static_cast<size_t>(i)];
    }
    for (int64_t i : from_p) {
      groups[uM].push_back(i);
      load[up] -= c.w[static_cast<size_t>(i)];
      load[uM] += c.w[static_cast<size_t>(i)];
      plen[up] -= lengths[static_cast<size_t>(i)];
      plen[uM] += lengths[static_cast<size_t>(i)];
    }
    ++steps;
  }
  // Loads recomputed exactly (the incremental updates accumulate rounding).
  for (size_t r = 0; r < udp; ++r) {
    load[r] = 0;
    for (int64_t i : groups[r]) load[r] += c.w[static_cast<size_t>(i)];
  }
  const double balanced = max_over_mean(load, c.mean);
  if (!(balanced < res.stats.naive_max_over_mean)) return finish_naive();

  // 3. Relabel the groups so that each rank keeps as many of its current tokens as possible
  // (greedy on the overlap matrix, ties by lower group then lower rank).
  std::vector<size_t> group_of_rank(udp);
  std::iota(group_of_rank.begin(), group_of_rank.end(), size_t{0});
  if (opt.minimize_movement) {
    std::vector<std::vector<int64_t>> overlap(udp, std::vector<int64_t>(udp, 0));
    for (size_t g = 0; g < udp; ++g)
      for (int64_t i : groups[g])
        overlap[g][static_cast<size_t>(cur_rank[static_cast<size_t>(i)])] +=
            lengths[static_cast<size_t>(i)] + 1;  // +1: a zero-length sample still counts
    std::vector<bool> g_used(udp, false), r_used(udp, false);
    for (size_t step = 0; step < udp; ++step) {
      int64_t bv = -1;
      size_t bg = 0, br = 0;
      for (size_t g = 0; g < udp; ++g) {
        if (g_used[g]) continue;
        for (size_t r = 0; r < udp; ++r) {
          if (r_used[r]) continue;
          if (overlap[g][r] > bv) {
            bv = overlap[g][r];
            bg = g;
            br = r;
          }
        }
      }
      g_used[bg] = r_used[br] = true;
      group_of_rank[br] = bg;
    }
  }

  res.ranks.assign(udp, {});
  for (size_t r = 0; r < udp; ++r) {
    const auto& g = groups[group_of_rank[r]];
    RankPlan& rp = res.ranks[r];
    order_micro_batches(c.w, g, m, opt.equal_counts, rp);
    for (int64_t i : g) {
      rp.cost += c.w[static_cast<size_t>(i)];
      rp.packed_length += lengths[static_cast<size_t>(i)];
      if (cur_rank[static_cast<size_t>(i)] != static_cast<int>(r)) ++res.stats.moved_samples;
    }
    if (rp.packed_length > cap) res.cap_exceeded = true;
  }
  res.stats.balanced_max_over_mean = balanced;
  res.stats.refinement_steps = steps;
  return res;
}

}  // namespace

BalanceResult plan_balance(const std::vector<int64_t>& sample_lengths, int dp_size,
                           const CostModel& model, const BalanceOptions& options) {
  LF_CHECK(dp_size >= 1, "plan_balance: dp_size ", dp_size, " must be >= 1");
  return balance(sample_lengths, dp_size, model, options,
                 naive_placement(static_cast<int64_t>(sample_lengths.size()), dp_size));
}

SendPlan make_send_plan(const std::vector<std::vector<int64_t>>& current,
                        const BalanceResult& plan) {
  const size_t dp = plan.ranks.size();
  LF_CHECK(current.size() == dp, "make_send_plan: current placement has ", current.size(),
           " ranks, the plan ", dp);
  int64_t n = 0;
  for (const auto& r : current)
    for (int64_t i : r) n = std::max(n, i + 1);
  std::vector<int> holder(static_cast<size_t>(n), -1);
  for (size_t r = 0; r < dp; ++r)
    for (int64_t i : current[r]) {
      LF_CHECK(i >= 0 && holder[static_cast<size_t>(i)] < 0, "make_send_plan: sample ", i,
               " negative or held by two ranks");
      holder[static_cast<size_t>(i)] = static_cast<int>(r);
    }
  SendPlan sp;
  sp.send.assign(dp, std::vector<std::vector<int64_t>>(dp));
  for (size_t dst = 0; dst < dp; ++dst)
    for (int64_t i : plan.ranks[dst].samples) {
      LF_CHECK(i >= 0 && i < n && holder[static_cast<size_t>(i)] >= 0, "make_send_plan: sample ",
               i, " of rank ", dst, "'s plan is held by no rank");
      const size_t src = static_cast<size_t>(holder[static_cast<size_t>(i)]);
      sp.send[src][dst].push_back(i);
      if (src != dst) ++sp.moved_samples;
    }
  return sp;
}

ImageBalancePlan plan_image_balance(const std::vector<std::vector<int64_t>>& image_lengths_per_rank,
                                    int dp_size, const CostModel& model,
                                    const BalanceOptions& options) {
  LF_CHECK(dp_size >= 1 && image_lengths_per_rank.size() == static_cast<size_t>(dp_size),
           "plan_image_balance: ", image_lengths_per_rank.size(), " ranks' images, dp_size ",
           dp_size);
  const size_t dp = static_cast<size_t>(dp_size);
  // Flatten: global image g = (home, local), ranks in order.
  std::vector<int64_t> lengths;
  std::vector<ImageRef> ref;
  std::vector<std::vector<int64_t>> current(dp);
  for (size_t r = 0; r < dp; ++r)
    for (size_t k = 0; k < image_lengths_per_rank[r].size(); ++k) {
      current[r].push_back(static_cast<int64_t>(lengths.size()));
      lengths.push_back(image_lengths_per_rank[r][k]);
      ref.push_back({static_cast<int>(r), static_cast<int64_t>(k)});
    }
  BalanceOptions opt = options;
  opt.equal_counts = false;
  opt.micro_batches_per_rank = 1;
  BalanceResult b = balance(lengths, dp_size, model, opt, current);
  ImageBalancePlan out;
  out.stats = b.stats;
  out.skipped = b.skipped;
  out.encode.assign(dp, {});
  out.send.assign(dp, std::vector<std::vector<int64_t>>(dp));
  out.back.assign(dp, {});
  for (size_t r = 0; r < dp; ++r) out.back[r].resize(image_lengths_per_rank[r].size());
  for (size_t e = 0; e < dp; ++e)
    for (int64_t g : b.ranks[e].samples) {
      const ImageRef& im = ref[static_cast<size_t>(g)];
      out.back[static_cast<size_t>(im.home)][static_cast<size_t>(im.local)] = {
          static_cast<int>(e), static_cast<int64_t>(out.encode[e].size())};
      out.encode[e].push_back(im);
      out.send[static_cast<size_t>(im.home)][e].push_back(im.local);
    }
  return out;
}

}  // namespace lf::data
