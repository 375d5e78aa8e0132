// loongforge-data make-demo-reach: the VLA demo's store of scripted reach-task episodes.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "loongforge/vla/reach_demo.h"

namespace lf::data::tools {

int run_make_demo_reach(const ReachDemoOptions& o) {
  lf::vla::ReachDemoMeta m;
  m.episodes = o.episodes;
  m.seed = o.seed;
  m.image_size = o.image_size;
  m.chunk = o.chunk;
  m.noise = o.noise;
  m.prompt.position_queries = o.position_queries;
  m.prompt.scene_queries = o.scene_queries;
  m.prompt.located = o.located;
  // 12 words of instruction and state, then 4 named + 16 scene queries, then 4 located queries and answers.
  // Padded to a multiple of 8 tokens, at least 16.
  const int64_t words = 12 + (o.position_queries ? 4 : 0) + (o.scene_queries ? 16 : 0) + (o.located ? 8 : 0);
  m.prompt.length = std::max<int64_t>(16, (words + 7) / 8 * 8);
  m.sample_every = o.sample_every;
  m = lf::vla::write_reach_demos(o.out, m);
  std::printf("wrote %lld samples of %lld expert episodes (seeds %llu..%llu, %lldx%lld images, chunks of %lld, "
              "prompt vocabulary %lld, prompts of %lld tokens%s%s%s) to %s\n",
              static_cast<long long>(m.samples), static_cast<long long>(m.episodes),
              static_cast<unsigned long long>(m.seed), static_cast<unsigned long long>(m.seed + m.episodes - 1),
              static_cast<long long>(m.image_size), static_cast<long long>(m.image_size),
              static_cast<long long>(m.chunk), static_cast<long long>(m.prompt.vocab_size()),
              static_cast<long long>(m.prompt.length), m.prompt.position_queries ? ", position queries with labels" : "",
              m.prompt.scene_queries ? ", scene queries with labels" : "",
              m.prompt.located ? ", located queries with labels and answers" : "", o.out.c_str());
  return 0;
}

}  // namespace lf::data::tools
