// Spans of work inside a traced training step (--pipeline-trace): what a layer does between the
// schedule's forward and backward calls, on rows of their own (the MoE layers' overlapped
// all-to-alls and expert computation, CCT). Times: microseconds of the steady clock, as the
// schedule's own events (parallel/pipeline/schedules.h), so both land on one timeline.
#pragma once

#include <chrono>
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
  std::vector<TraceSpan> spans;

  static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void add(std::string name, std::string row, double start_us, double end_us) {
    spans.push_back({std::move(name), std::move(row), start_us, end_us - start_us});
  }
};

}  // namespace lf
