#include "loongforge/parallel/pipeline/schedules.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <deque>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {
namespace {

// What a forward leaves for its backward: the received input (a leaf whose gradient goes back)
// and the output (the sent activation or the loss).
struct InFlight {
  int64_t m = 0;
  at::Tensor input, output;
};

class Runner {
 public:
  Runner(StageExchange& ex, const StageStep& step) : ex_(ex), step_(step) {}

  // Forward of the next micro-batch on `input` (from recv_forward); returns what to send on.
  at::Tensor forward(const at::Tensor& received) {
    InFlight f;
    f.m = next_forward_++;
    if (received.defined()) f.input = received.detach().set_requires_grad(true);
    f.output = step_.forward(f.m, f.input);
    LF_CHECK(f.output.defined(), "pipeline stage ", ex_.stage(), ": the forward step of micro-batch ",
             f.m, " returned nothing");
    if (ex_.is_last()) {
      LF_CHECK(f.output.numel() == 1, "pipeline stage ", ex_.stage(),
               ": the last stage's forward step must return the scalar loss, got shape ",
               f.output.sizes());
      loss_sum_ += f.output.detach().to(at::kDouble).item<double>();
    }
    in_flight_.push_back(f);
    return ex_.is_last() ? at::Tensor() : f.output;
  }

  // Backward of the oldest micro-batch in flight with the gradient of its output (undefined on
  // the last stage); returns the gradient of its input (undefined on the first stage).
  at::Tensor backward(const at::Tensor& output_grad) {
    LF_CHECK(!in_flight_.empty(), "pipeline stage ", ex_.stage(), ": backward without a forward");
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (step_.before_backward) step_.before_backward(f.m);
    if (ex_.is_last()) {
      f.output.backward();
    } else {
      LF_CHECK(output_grad.defined() && output_grad.sizes() == f.output.sizes(), "pipeline stage ",
               ex_.stage(), ": the gradient received for micro-batch ", f.m, " has shape ",
               output_grad.defined() ? output_grad.sizes() : c10::IntArrayRef{},
               ", its activation ", f.output.sizes());
      f.output.backward(output_grad.to(f.output.scalar_type()));
    }
    if (ex_.is_first()) return {};
    at::Tensor g = f.input.grad();
    // An input that does not reach the output still sends a (zero) gradient: the previous stage
    // waits for one.
    return g.defined() ? g : at::zeros_like(f.input);
  }

  double loss_sum() const { return loss_sum_; }
  bool idle() const { return in_flight_.empty(); }

 private:
  StageExchange& ex_;
  const StageStep& step_;
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

int64_t warmup_forwards(int stage, int stages, int64_t micro_batches) {
  return std::min<int64_t>(stages - stage - 1, micro_batches);
}

double run_without_pipelining(StageExchange& ex, int64_t micro_batches, const StageStep& step) {
  check_args(ex, micro_batches, step);
  Runner r(ex, step);
  for (int64_t m = 0; m < micro_batches; ++m) ex.send_forward(r.forward(ex.recv_forward()));
  for (int64_t m = 0; m < micro_batches; ++m) ex.send_backward(r.backward(ex.recv_backward()));
  ex.flush();
  return r.loss_sum();
}

double run_1f1b(StageExchange& ex, int64_t micro_batches, const StageStep& step) {
  check_args(ex, micro_batches, step);
  Runner r(ex, step);
  const int64_t warmup = warmup_forwards(ex.stage(), ex.num_stages(), micro_batches);
  const int64_t steady = micro_batches - warmup;
  for (int64_t i = 0; i < warmup; ++i) ex.send_forward(r.forward(ex.recv_forward()));
  at::Tensor input = steady > 0 ? ex.recv_forward() : at::Tensor();
  for (int64_t i = 0; i < steady; ++i) {
    // One forward, then the backward of the oldest micro-batch in flight.
    at::Tensor output_grad = ex.send_forward_recv_backward(r.forward(input));
    at::Tensor input_grad = r.backward(output_grad);
    if (i == steady - 1) {
      ex.send_backward(input_grad);
    } else {
      input = ex.send_backward_recv_forward(input_grad);
    }
  }
  for (int64_t i = 0; i < warmup; ++i) ex.send_backward(r.backward(ex.recv_backward()));
  ex.flush();
  LF_DCHECK(r.idle(), "1F1B left micro-batches in flight");
  return r.loss_sum();
}

}  // namespace lf::parallel::pipeline
