// loongforge-data make-demo-reach: the VLA demo's store of scripted reach-task episodes.
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
  if (o.scene_queries) m.prompt.length = 32;  // 12 words of instruction and state, 4 + 16 queries
  m.sample_every = o.sample_every;
  m = lf::vla::write_reach_demos(o.out, m);
  std::printf("wrote %lld samples of %lld expert episodes (seeds %llu..%llu, %lldx%lld images, chunks of %lld, "
              "prompt vocabulary %lld, prompts of %lld tokens%s%s) to %s\n",
              static_cast<long long>(m.samples), static_cast<long long>(m.episodes),
              static_cast<unsigned long long>(m.seed), static_cast<unsigned long long>(m.seed + m.episodes - 1),
              static_cast<long long>(m.image_size), static_cast<long long>(m.image_size),
              static_cast<long long>(m.chunk), static_cast<long long>(m.prompt.vocab_size()),
              static_cast<long long>(m.prompt.length), m.prompt.position_queries ? ", position queries with labels" : "",
              m.prompt.scene_queries ? ", scene queries with labels" : "", o.out.c_str());
  return 0;
}

}  // namespace lf::data::tools
