// Spans of work inside a traced training step (--pipeline-trace): what a layer does between the
// schedule's forward and backward calls, on rows of their own (the MoE layers' overlapped
// all-to-alls and expert computation, CCT). Times: microseconds of the steady clock, as the
// schedule's own events (parallel/pipeline/schedules.h), so both land on one timeline.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace lf {

struct TraceSpan {
  std::string name;  // e.g. "dispatch 1"
  std::string row;   // the timeline row it is drawn on, e.g. "MoE all-to-all"
  double start_us = 0, duration_us = 0;
};

struct TraceSpans {
  // The first this many spans are kept (a long run under --pipeline-trace must not grow without
  // bound: ~100 bytes a span, a few hundred a step); later ones only set `truncated`.
  static constexpr size_t kLimit = 200000;
  std::vector<TraceSpan> spans;
  bool truncated = false;

  static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void add(std::string name, std::string row, double start_us, double end_us) {
    if (spans.size() >= kLimit) {
      truncated = true;
      return;
    }
    spans.push_back({std::move(name), std::move(row), start_us, end_us - start_us});
  }
};

}  // namespace lf
