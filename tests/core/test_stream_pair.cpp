// core/stream_pair: two streams take turns only at yield(), in an order fixed by the program,
// the second on its own thread; errors of either come back after both ran to their ends.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loongforge/core/stream_pair.h"

namespace {

TEST(StreamPair, TheStreamsTakeTurnsAtEachYield) {
  lf::StreamPair pair;
  std::vector<std::string> log;  // no lock: one stream runs at a time
  std::thread::id first_id, second_id;
  for (int round = 0; round < 3; ++round) {  // the same order every time, on a reused pair
    log.clear();
    pair.run(
        [&] {
          first_id = std::this_thread::get_id();
          log.push_back("a1");
          pair.yield();
          log.push_back("a2");
          pair.yield();
          log.push_back("a3");
          pair.yield();  // the second stream has returned: no hand-over
          log.push_back("a4");
        },
        [&] {
          second_id = std::this_thread::get_id();
          EXPECT_TRUE(pair.running());
          log.push_back("b1");
          pair.yield();
          log.push_back("b2");
        });
    EXPECT_EQ(log, (std::vector<std::string>{"a1", "b1", "a2", "b2", "a3", "a4"})) << "round " << round;
    EXPECT_EQ(pair.switches(), 3);
    EXPECT_EQ(pair.total_switches(), 3 * (round + 1));
    EXPECT_FALSE(pair.running());
    EXPECT_EQ(first_id, std::this_thread::get_id());
    EXPECT_NE(second_id, first_id);
  }
}

TEST(StreamPair, WhenTheFirstReturnsTheSecondRunsToItsEnd) {
  lf::StreamPair pair;
  std::vector<std::string> log;
  pair.run([&] { log.push_back("a"); },
           [&] {
             log.push_back("b1");
             pair.yield();  // nobody to hand over to
             log.push_back("b2");
           });
  EXPECT_EQ(log, (std::vector<std::string>{"a", "b1", "b2"}));
  EXPECT_EQ(pair.switches(), 0);
}

TEST(StreamPair, YieldOutsideARunOrFromAnotherThreadReturnsAtOnce) {
  lf::StreamPair pair;
  pair.yield();
  bool outsider_returned = false;
  pair.run(
      [&] {
        std::thread([&] {
          pair.yield();  // not a stream of the run
          outsider_returned = true;
        }).join();
      },
      [] {});
  EXPECT_TRUE(outsider_returned);
  EXPECT_EQ(pair.switches(), 0);
}

TEST(StreamPair, AHeldStreamKeepsRunningThroughItsYields) {
  lf::StreamPair pair;
  std::vector<std::string> log;
  lf::StreamPair::Hold nothing(nullptr);  // a null pair: no effect
  pair.run(
      [&] {
        log.push_back("a1");
        pair.yield();
        log.push_back("a2");
      },
      [&] {
        {
          lf::StreamPair::Hold hold(&pair);
          {
            lf::StreamPair::Hold nested(&pair);
            log.push_back("b1");
            pair.yield();  // held: no hand-over
          }
          log.push_back("b2");
          pair.yield();  // still held
        }
        log.push_back("b3");
        pair.yield();  // released: a2 runs
        log.push_back("b4");
      });
  EXPECT_EQ(log, (std::vector<std::string>{"a1", "b1", "b2", "b3", "a2", "b4"}));
  EXPECT_EQ(pair.switches(), 2);
}

TEST(StreamPair, AnErrorComesBackAfterBothStreamsEnded) {
  lf::StreamPair pair;
  std::vector<std::string> log;
  try {
    pair.run(
        [&] {
          log.push_back("a1");
          pair.yield();
          log.push_back("a2");
        },
        [&] {
          log.push_back("b1");
          throw std::runtime_error("second failed");
        });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "second failed");
  }
  EXPECT_EQ(log, (std::vector<std::string>{"a1", "b1", "a2"}));
  log.clear();
  try {
    pair.run(
        [&] {
          log.push_back("a1");
          throw std::runtime_error("first failed");
        },
        [&] {
          log.push_back("b1");
          pair.yield();
          log.push_back("b2");
        });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first failed");
  }
  EXPECT_EQ(log, (std::vector<std::string>{"a1", "b1", "b2"}));
  // Both failing: the first failure by time.
  try {
    pair.run(
        [&] {
          pair.yield();
          throw std::runtime_error("first failed later");
        },
        [&] { throw std::runtime_error("second failed first"); });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "second failed first");
  }
  EXPECT_FALSE(pair.running());
}

}  // namespace
