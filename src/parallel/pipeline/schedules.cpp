#include "loongforge/parallel/pipeline/schedules.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {
namespace {

// What a forward leaves for its backward: the received input (a leaf whose gradient goes back)
// and the output (the sent activation or the loss).
struct InFlight {
  int64_t m = 0;
  TensorMap input;
  StageResult output;
};

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Records one compute call into the trace (if any).
class Timed {
 public:
  Timed(ScheduleTrace* trace, char kind, int64_t m, int chunk = 0)
      : trace_(trace), kind_(kind), m_(m), chunk_(chunk), start_(trace ? now_us() : 0) {}
  ~Timed() {
    if (trace_) trace_->events.push_back({kind_, m_, start_, now_us() - start_, chunk_});
  }

 private:
  ScheduleTrace* trace_;
  char kind_;
  int64_t m_;
  int chunk_;
  double start_;
};

// The step span of a trace: a barrier at both ends, so all stages share start and end.
class TracedStep {
 public:
  TracedStep(StageExchange& ex, ScheduleTrace* trace) : ex_(ex), trace_(trace) {
    if (!trace_) return;
    ex_.barrier();
    start_ = now_us();
  }
  void finish() {
    if (!trace_) return;
    ex_.barrier();
    trace_->steps.emplace_back(start_, now_us());
  }

 private:
  StageExchange& ex_;
  ScheduleTrace* trace_;
  double start_ = 0;
};

class Runner {
 public:
  Runner(StageExchange& ex, const StageStep& step, ScheduleTrace* trace = nullptr)
      : ex_(ex), step_(step), trace_(trace) {}

  // Forward of the next micro-batch on `received` (from recv_forward); returns what to send on.
  TensorMap forward(const TensorMap& received) {
    InFlight f;
    f.m = next_forward_++;
    f.input = received;
    {
      Timed t(trace_, 'F', f.m);
      f.output = step_.forward(f.m, f.input);
    }
    if (ex_.is_last()) {
      LF_CHECK(f.output.loss.defined() && f.output.loss.numel() == 1, "pipeline stage ", ex_.stage(),
               ": the last stage's forward step must return the scalar loss, got ",
               f.output.loss.defined() ? f.output.loss.sizes() : c10::IntArrayRef{});
      loss_sum_ += f.output.loss.detach().to(at::kDouble).item<double>();
    } else {
      LF_CHECK(!f.output.activations.empty(), "pipeline stage ", ex_.stage(), ": the forward step of micro-batch ",
               f.m, " returned no activations");
    }
    TensorMap out = ex_.is_last() ? TensorMap() : f.output.activations;
    in_flight_.push_back(std::move(f));
    return out;
  }

  // Backward of the oldest micro-batch in flight with the gradients of its outputs (empty on the
  // last stage); returns the gradients of its inputs (empty on the first stage).
  TensorMap backward(const TensorMap& output_grads) {
    LF_CHECK(!in_flight_.empty(), "pipeline stage ", ex_.stage(), ": backward without a forward");
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (step_.before_backward) step_.before_backward(f.m);
    Timed t(trace_, 'B', f.m);
    return stage_backward(f.output, output_grads, f.input, ex_.is_last(),
                          "pipeline stage " + std::to_string(ex_.stage()) + ", micro-batch " + std::to_string(f.m));
  }

  double loss_sum() const { return loss_sum_; }
  bool idle() const { return in_flight_.empty(); }

 private:
  StageExchange& ex_;
  const StageStep& step_;
  ScheduleTrace* trace_;
  std::deque<InFlight> in_flight_;
  int64_t next_forward_ = 0;
  double loss_sum_ = 0;
};

void check_args(const StageExchange& ex, int64_t micro_batches, const StageStep& step) {
  LF_CHECK(micro_batches >= 1, "pipeline stage ", ex.stage(), ": at least one micro-batch is needed, got ",
           micro_batches);
  LF_CHECK(static_cast<bool>(step.forward), "pipeline schedule: StageStep::forward is not set");
}

}  // namespace

int64_t warmup_forwards(int stage, int stages, int64_t micro_batches, bool paired) {
  return std::min<int64_t>(stages - stage - (paired ? 0 : 1), micro_batches);
}

double ScheduleTrace::bubble_fraction() const {
  double total = 0, busy = 0;
  for (const auto& [start, end] : steps) total += end - start;
  // Busy time is the union of the compute calls: paired micro-batches (the MoE overlap across
  // micro-batches) interleave a forward and a backward, whose spans overlap.
  std::vector<std::pair<double, double>> spans;
  for (const auto& e : events) spans.emplace_back(e.start_us, e.start_us + e.duration_us);
  std::sort(spans.begin(), spans.end());
  double covered_to = -std::numeric_limits<double>::infinity();
  for (const auto& [start, end] : spans) {
    if (end <= covered_to) continue;
    busy += end - std::max(start, covered_to);
    covered_to = end;
  }
  return total > 0 ? std::max(0.0, 1.0 - busy / total) : 0.0;
}

void ScheduleTrace::write_chrome_trace(const std::string& path, int stage) const {
  std::ofstream out(path);
  LF_CHECK(out.good(), "cannot write the pipeline trace ", path,
           lf::hint("check that --pipeline-trace names a writable path"));
  out << std::fixed << std::setprecision(1) << "{\"traceEvents\": [\n";
  out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << stage
      << ", \"args\": {\"name\": \"stage " << stage << "\"}}";
  for (size_t i = 0; i < steps.size(); ++i)
    out << ",\n{\"name\": \"step " << i << "\", \"ph\": \"X\", \"pid\": " << stage
        << ", \"tid\": 0, \"ts\": " << steps[i].first << ", \"dur\": " << steps[i].second - steps[i].first << "}";
  for (const auto& e : events)
    out << ",\n{\"name\": \"" << e.kind << e.micro_batch
        << (e.chunk > 0 ? "." + std::to_string(e.chunk) : std::string()) << "\", \"cat\": \""
        << (e.kind == 'F' ? "forward" : "backward") << "\", \"ph\": \"X\", \"pid\": " << stage
        << ", \"tid\": 1, \"ts\": " << e.start_us << ", \"dur\": " << e.duration_us << "}";
  std::map<std::string, int> rows;  // the spans' rows: tid 2, 3, .. in order of first appearance
  for (const auto& s : spans.spans) {
    auto [it, fresh] = rows.emplace(s.row, static_cast<int>(rows.size()) + 2);
    if (fresh)
      out << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << stage << ", \"tid\": " << it->second
          << ", \"args\": {\"name\": \"" << s.row << "\"}}";
    out << ",\n{\"name\": \"" << s.name << "\", \"cat\": \"" << s.row << "\", \"ph\": \"X\", \"pid\": " << stage
        << ", \"tid\": " << it->second << ", \"ts\": " << s.start_us << ", \"dur\": " << s.duration_us << "}";
  }
  out << "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"stage\": " << stage
      << ", \"bubble_fraction\": " << std::setprecision(4) << bubble_fraction()
      << (spans.truncated ? ", \"spans_truncated_after\": " + std::to_string(lf::TraceSpans::kLimit) : std::string())
      << "}}\n";
  LF_CHECK(out.good(), "writing the pipeline trace ", path, " failed");
}

TensorMap stage_backward(const StageResult& output, const TensorMap& output_grads, const TensorMap& input,
                         bool last, const std::string& where) {
  std::vector<at::Tensor> roots, grads;
  if (last) {
    roots.push_back(output.loss);
    grads.push_back(at::ones_like(output.loss));
  } else {
    for (const auto& [name, t] : output.activations.items()) {
      if (!t.requires_grad()) continue;
      const at::Tensor* g = output_grads.find(name);
      LF_CHECK(g && g->sizes() == t.sizes(), where, ": the gradient received for '", name, "' has shape ",
               g ? g->sizes() : c10::IntArrayRef{}, ", its activation ", t.sizes(), " (received: ",
               output_grads.describe(), ")");
      roots.push_back(t);
      grads.push_back(g->to(t.scalar_type()));
    }
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  TensorMap input_grads;
  for (const auto& [name, t] : input.items()) {
    if (!t.requires_grad()) continue;
    at::Tensor g = t.grad();
    // An input that does not reach the output still sends a (zero) gradient.
    input_grads.set(name, g.defined() ? g : at::zeros_like(t));
  }
  return input_grads;
}

double run_without_pipelining(StageExchange& ex, int64_t micro_batches, const StageStep& step,
                              ScheduleTrace* trace) {
  check_args(ex, micro_batches, step);
  TracedStep span(ex, trace);
  Runner r(ex, step, trace);
  for (int64_t m = 0; m < micro_batches; ++m) ex.send_forward(r.forward(ex.recv_forward_map()));
  for (int64_t m = 0; m < micro_batches; ++m) ex.send_backward(r.backward(ex.recv_backward_map()));
  ex.flush();
  span.finish();
  return r.loss_sum();
}

double run_1f1b(StageExchange& ex, int64_t micro_batches, const StageStep& step, ScheduleTrace* trace) {
  check_args(ex, micro_batches, step);
  TracedStep span(ex, trace);
  Runner r(ex, step, trace);
  const bool paired = static_cast<bool>(step.run_pair);
  const int64_t warmup = warmup_forwards(ex.stage(), ex.num_stages(), micro_batches, paired);
  const int64_t steady = micro_batches - warmup;
  for (int64_t i = 0; i < warmup; ++i) ex.send_forward(r.forward(ex.recv_forward_map()));
  if (paired) {
    // Forward i + warm-up needs an activation the previous stage sent in its iteration i - 1 (or
    // its warm-up); backward i a gradient the next stage sends in its iteration i, which needs
    // nothing of this stage's iteration i (the last stage's backward i: its forward i of
    // iteration i - 1). So neither stream waits for the other, on any stage.
    for (int64_t i = 0; i < steady; ++i)
      step.run_pair([&] { ex.send_forward(r.forward(ex.recv_forward_map())); },
                    [&] { ex.send_backward(r.backward(ex.recv_backward_map())); });
    for (int64_t i = 0; i < warmup; ++i) ex.send_backward(r.backward(ex.recv_backward_map()));
    ex.flush();
    span.finish();
    LF_DCHECK(r.idle(), "1F1B left micro-batches in flight");
    return r.loss_sum();
  }
  TensorMap input = steady > 0 ? ex.recv_forward_map() : TensorMap();
  for (int64_t i = 0; i < steady; ++i) {
    // One forward, then the backward of the oldest micro-batch in flight. Each send is started
    // (asynchronously) before the blocking receive, so neighbours exchanging in opposite
    // directions never wait on each other.
    ex.send_forward(r.forward(input));
    TensorMap input_grad = r.backward(ex.recv_backward_map());
    ex.send_backward(input_grad);
    if (i != steady - 1) input = ex.recv_forward_map();
  }
  for (int64_t i = 0; i < warmup; ++i) ex.send_backward(r.backward(ex.recv_backward_map()));
  ex.flush();
  span.finish();
  LF_DCHECK(r.idle(), "1F1B left micro-batches in flight");
  return r.loss_sum();
}

std::vector<ScheduledOp> interleaved_1f1b_order(int stage, int stages, int chunks, int64_t m, bool paired) {
  LF_CHECK(stages >= 1 && stage >= 0 && stage < stages && chunks >= 1, "interleaved schedule: stage ", stage,
           " of ", stages, " with ", chunks, " model chunks");
  LF_CHECK(m >= 1 && m % stages == 0, "the interleaved pipeline schedule needs the number of micro-batches (",
           m, ") to be a multiple of parallel.pipeline_model_parallel_size ", stages,
           lf::hint("set --global-batch-size to a multiple of micro-batch size x data-parallel size x " +
                    std::to_string(stages)));
  const int64_t p = stages, v = chunks, total = m * v;
  const int64_t warmup =
      m == p ? total : std::min<int64_t>(2 * (p - stage - 1) + (v - 1) * p + (paired ? 1 : 0), total);
  auto chunk_of = [&](int64_t k, bool forward) {
    const int64_t c = (k % (p * v)) / p;
    return static_cast<int>(forward ? c : v - 1 - c);
  };
  auto micro_batch_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  std::vector<ScheduledOp> ops;
  ops.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) ops.push_back({'F', chunk_of(k, true), micro_batch_of(k)});
  for (int64_t i = 0; i < total - warmup; ++i) {
    ops.push_back({'F', chunk_of(warmup + i, true), micro_batch_of(warmup + i), paired});
    ops.push_back({'B', chunk_of(i, false), micro_batch_of(i)});
  }
  for (int64_t i = total - warmup; i < total; ++i) ops.push_back({'B', chunk_of(i, false), micro_batch_of(i)});
  return ops;
}

// Runs the order with receives just before the op that needs them and sends started
// asynchronously after it. That only ever waits later than Megatron's pre-posted receives, so the
// order's freedom from deadlock carries over (and tests/parallel/test_pipeline.cpp simulates it).
double run_interleaved_1f1b(StageExchange& ex, int chunks, int64_t micro_batches, const VirtualStageStep& step,
                            ScheduleTrace* trace) {
  LF_CHECK(static_cast<bool>(step.forward), "pipeline schedule: VirtualStageStep::forward is not set");
  const bool pairs = static_cast<bool>(step.run_pair);
  const auto ops = interleaved_1f1b_order(ex.stage(), ex.num_stages(), chunks, micro_batches, pairs);
  const int p = ex.num_stages();
  TracedStep span(ex, trace);
  // Virtual stage of chunk c here, and the message id of (virtual stage, micro-batch).
  auto vstage = [&](int c) { return static_cast<int64_t>(c) * p + ex.stage(); };
  auto id = [&](int64_t vs, int64_t m) { return vs * micro_batches + m; };
  const int64_t last_vs = static_cast<int64_t>(chunks) * p - 1;
  std::vector<std::deque<InFlight>> in_flight(static_cast<size_t>(chunks));
  double loss_sum = 0;
  int64_t backwards_left = static_cast<int64_t>(chunks) * micro_batches;
  // Each op in three parts (receive, compute, send), so that a pair can receive both inputs before
  // computing both and send both after.
  struct Forward {
    ScheduledOp op;
    InFlight f;
  };
  struct Backward {
    ScheduledOp op;
    InFlight f;
    TensorMap output_grads, input_grads;
  };
  auto receive_forward = [&](const ScheduledOp& op) {
    Forward w{op, {}};
    w.f.m = op.micro_batch;
    const int64_t vs = vstage(op.chunk);
    if (vs > 0) w.f.input = ex.recv_forward_map(id(vs - 1, w.f.m), /*ring=*/true);
    return w;
  };
  auto compute_forward = [&](Forward& w) {
    Timed t(trace, 'F', w.f.m, w.op.chunk);
    w.f.output = step.forward(w.op.chunk, w.f.m, w.f.input);
  };
  auto send_forward = [&](Forward& w) {
    const int64_t vs = vstage(w.op.chunk);
    if (vs == last_vs) {
      LF_CHECK(w.f.output.loss.defined() && w.f.output.loss.numel() == 1, "pipeline stage ", ex.stage(),
               ": the last virtual stage's forward step must return the scalar loss");
      loss_sum += w.f.output.loss.detach().to(at::kDouble).item<double>();
    } else {
      LF_CHECK(!w.f.output.activations.empty(), "pipeline stage ", ex.stage(), ": the forward step of chunk ",
               w.op.chunk, ", micro-batch ", w.f.m, " returned no activations");
      ex.send_forward(w.f.output.activations, id(vs, w.f.m), /*ring=*/true);
    }
    in_flight[static_cast<size_t>(w.op.chunk)].push_back(std::move(w.f));
  };
  auto receive_backward = [&](const ScheduledOp& op) {
    auto& queue = in_flight[static_cast<size_t>(op.chunk)];
    LF_CHECK(!queue.empty() && queue.front().m == op.micro_batch, "pipeline stage ", ex.stage(),
             ": backward of chunk ", op.chunk, ", micro-batch ", op.micro_batch, " without its forward");
    Backward w{op, std::move(queue.front()), {}, {}};
    queue.pop_front();
    const int64_t vs = vstage(op.chunk);
    if (vs != last_vs) w.output_grads = ex.recv_backward_map(id(vs, w.f.m), /*ring=*/true);
    return w;
  };
  auto compute_backward = [&](Backward& w) {
    const int64_t vs = vstage(w.op.chunk);
    if (step.before_backward) step.before_backward(w.op.chunk, w.f.m, --backwards_left == 0);
    Timed t(trace, 'B', w.f.m, w.op.chunk);
    w.input_grads = stage_backward(w.f.output, w.output_grads, w.f.input, vs == last_vs,
                                   "pipeline stage " + std::to_string(ex.stage()) + ", chunk " +
                                       std::to_string(w.op.chunk) + ", micro-batch " + std::to_string(w.f.m));
  };
  auto send_backward = [&](Backward& w) {
    const int64_t vs = vstage(w.op.chunk);
    if (vs > 0) ex.send_backward(w.input_grads, id(vs - 1, w.f.m), /*ring=*/true);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const ScheduledOp& op = ops[i];
    if (op.kind == 'F' && op.paired) {
      LF_CHECK(i + 1 < ops.size() && ops[i + 1].kind == 'B', "pipeline stage ", ex.stage(),
               ": a paired forward without a backward after it");
      Forward fw = receive_forward(op);
      Backward bw = receive_backward(ops[++i]);
      step.run_pair([&] { compute_forward(fw); }, [&] { compute_backward(bw); });
      send_forward(fw);
      send_backward(bw);
    } else if (op.kind == 'F') {
      Forward fw = receive_forward(op);
      compute_forward(fw);
      send_forward(fw);
    } else {
      Backward bw = receive_backward(op);
      compute_backward(bw);
      send_backward(bw);
    }
  }
  ex.flush();
  span.finish();
  return loss_sum;
}

}  // namespace lf::parallel::pipeline
