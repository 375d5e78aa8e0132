// detect_launch_env for each launcher convention, by setting the variables in this process.
// (tests/dist/test_launchers.cpp runs the same conventions across real processes.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "loongforge/core/error.h"
#include "loongforge/dist/launch_env.h"

namespace lf::dist {
namespace {

const char* const kVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
    "SLURM_NNODES", "SLURM_RESTART_COUNT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

// Clears every launcher variable for the test and restores them afterwards.
class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  void set(std::map<std::string, std::string> vars) {
    for (auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  std::string error() {
    try {
      detect_launch_env();
    } catch (const lf::Error& e) {
      return e.what();
    }
    return "";
  }
  std::map<std::string, std::string> saved_;
};

TEST_F(LaunchEnvTest, NoVariablesMeansSingleProcess) {
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.source, "single");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_world_size, 1);
}

TEST_F(LaunchEnvTest, Torchrun) {
  set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node01"}, {"MASTER_PORT", "29511"},
       {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "node01");
  EXPECT_EQ(e.master_port, 29511);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_TRUE(e.agent_store);
}

TEST_F(LaunchEnvTest, TorchrunErrorsNameTheVariable) {
  set({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}});
  EXPECT_NE(error().find("RANK=4 is out of range for WORLD_SIZE=4"), std::string::npos) << error();
  set({{"RANK", "x1"}});
  EXPECT_NE(error().find("RANK='x1' is not an integer"), std::string::npos) << error();
  set({{"RANK", "1"}});
  unsetenv("MASTER_PORT");
  EXPECT_NE(error().find("MASTER_PORT is not set"), std::string::npos) << error();
  unsetenv("WORLD_SIZE");
  EXPECT_NE(error().find("WORLD_SIZE is not set"), std::string::npos) << error();
  set({{"WORLD_SIZE", "4"}, {"MASTER_PORT", "99999"}});
  EXPECT_NE(error().find("MASTER_PORT=99999 is not a TCP port"), std::string::npos) << error();
}

TEST_F(LaunchEnvTest, EmptyVariablesCountAsUnset) {
  set({{"RANK", ""}, {"WORLD_SIZE", ""}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(detect_launch_env().source, "slurm");
}

TEST_F(LaunchEnvTest, Slurm) {
  set({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
       {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"SLURM_STEP_NODELIST", "gpu[007-009],login"},
       {"SLURM_JOB_NODELIST", "other"}, {"SLURM_JOB_ID", "4812345"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 2);
  EXPECT_EQ(e.master_addr, "gpu007");  // first host of the step, not of the job
  EXPECT_EQ(e.master_port, 15000 + 2345);
  set({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "23456"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  unsetenv("SLURM_TASKS_PER_NODE");
  e = detect_launch_env();
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 23456);
  EXPECT_EQ(e.local_world_size, 2);
}

TEST_F(LaunchEnvTest, SlurmUnevenTasksPerNode) {
  set({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
       {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_JOB_NODELIST", "n1,n2,n3"},
       {"SLURM_JOB_ID", "77"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "n1");
  EXPECT_EQ(e.master_port, 15077);
  set({{"SLURM_PROCID", "6"}});
  EXPECT_NE(error().find("SLURM_PROCID=6 is out of range for SLURM_NTASKS=5"), std::string::npos)
      << error();
}

TEST_F(LaunchEnvTest, SlurmNodelists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-04],other"),
            (V{"node01", "node02", "node03", "node04", "other"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b"), (V{"a", "b"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[1,3-4]-ib,x[9]"),
            (V{"gpu1-ib", "gpu3-ib", "gpu4-ib", "x9"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-10]"), (V{"n8", "n9", "n10"}));
  EXPECT_THROW(expand_slurm_nodelist("n[1-2"), lf::Error);
  EXPECT_THROW(expand_slurm_nodelist("n[4-2]"), lf::Error);
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("8"), (std::vector<int>{8}));
  EXPECT_THROW(expand_slurm_tasks_per_node("2(3)"), lf::Error);
}

TEST_F(LaunchEnvTest, OpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"MASTER_ADDR", "host-a"}, {"MASTER_PORT", "29600"},
       // Open MPI inside a Slurm allocation: Open MPI's variables win.
       {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "host-a");
  EXPECT_EQ(e.master_port, 29600);
}

TEST_F(LaunchEnvTest, OpenMpiNeedsMaster) {
  set({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  std::string e = error();
  EXPECT_NE(e.find("MASTER_ADDR is not set (Open MPI, rank 0 of WORLD_SIZE=2)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  set({{"MASTER_ADDR", "h"}});
  EXPECT_NE(error().find("MASTER_PORT is not set (Open MPI"), std::string::npos) << error();
  set({{"MASTER_PORT", "1"}, {"OMPI_COMM_WORLD_SIZE", "two"}});
  EXPECT_NE(error().find("OMPI_COMM_WORLD_SIZE='two' is not an integer"), std::string::npos)
      << error();
}

}  // namespace
}  // namespace lf::dist
