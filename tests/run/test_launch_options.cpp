// In-process tests of loongforge-run's flag parsing and worker environment (no processes).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>

#include <unistd.h>

#include "launch_options.h"
#include "worker_env.h"

namespace lf::run {
namespace {

// /bin/sh exists on every machine these tests run on; it stands in for the worker command.
LaunchOptions parse(std::vector<std::string> args) {
  std::string help;
  auto o = parse_launch_options(args, &help);
  EXPECT_TRUE(o.has_value()) << help;
  return o.value_or(LaunchOptions{});
}

// The UsageError text for `args` ("" when parsing succeeded).
std::string usage_error(std::vector<std::string> args) {
  try {
    std::string help;
    parse_launch_options(args, &help);
  } catch (const UsageError& e) {
    return std::string(e.what()) + " | HINT: " + e.hint();
  }
  return "";
}

std::map<std::string, std::string> as_map(const EnvVars& v) { return {v.begin(), v.end()}; }

TEST(LaunchOptions, DefaultsMatchTorchrun) {
  auto o = parse({"/bin/sh", "-c", "true"});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.grace_period_s, 30.0);
  EXPECT_EQ(o.signals_to_handle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(o.command, (std::vector<std::string>{"/bin/sh", "-c", "true"}));
  EXPECT_EQ(o.executable, "/bin/sh");
  EXPECT_TRUE(o.terminal_ranks.includes(0));
  EXPECT_FALSE(o.terminal_ranks.includes(1));
  EXPECT_FALSE(o.terminal_ranks.prefixed());
}

TEST(LaunchOptions, WorkerFlagsAfterTheCommandAreNotTheLaunchers) {
  auto o = parse({"--nproc-per-node", "4", "--no-python", "/bin/sh", "--nproc-per-node", "7",
                  "--tensor-model-parallel-size", "2", "--", "x"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.command, (std::vector<std::string>{"/bin/sh", "--nproc-per-node", "7",
                                                 "--tensor-model-parallel-size", "2", "--", "x"}));
}

TEST(LaunchOptions, UnderscoreSpellingsAndEqualsForm) {
  auto o = parse({"--nnodes=2:2", "--node_rank", "1", "--nproc_per_node=3", "--master_addr", "10.1.2.3",
                  "--master_port=1234", "--log_dir", "/tmp/x", "--", "/bin/sh"});
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.master_addr, "10.1.2.3");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.log_dir, "/tmp/x");
  EXPECT_EQ(o.command, (std::vector<std::string>{"/bin/sh"}));
  EXPECT_EQ(o.world_size(), 6);
  EXPECT_EQ(o.global_rank(2), 5);
}

TEST(LaunchOptions, RdzvEndpointIsTheMasterAddress) {
  auto o = parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "node7:4242", "--rdzv-id", "job9", "/bin/sh"});
  EXPECT_EQ(o.master_addr, "node7");
  EXPECT_EQ(o.master_port, 4242);
  EXPECT_EQ(o.run_id, "job9");
  auto v6 = parse({"--rdzv_endpoint", "[::1]:4243", "/bin/sh"});
  EXPECT_EQ(v6.master_addr, "::1");
  EXPECT_EQ(v6.master_port, 4243);
}

// torchrun takes a flag not given from PET_<NAME> (Kubeflow's PyTorchJob sets PET_NNODES,
// PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT); the command line wins.
class PetEnv {
 public:
  PetEnv(std::initializer_list<std::pair<const std::string, std::string>> vars) : vars_(vars) {
    for (const auto& [k, v] : vars_) {
      if (const char* old = std::getenv(k.c_str())) old_[k] = old;
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~PetEnv() {
    for (const auto& [k, v] : vars_)
      if (old_.count(k))
        setenv(k.c_str(), old_[k].c_str(), 1);
      else
        unsetenv(k.c_str());
  }

 private:
  std::map<std::string, std::string> vars_, old_;
};

TEST(LaunchOptions, PetEnvironmentGivesTheFlagsNotOnTheCommandLine) {
  {
    PetEnv env{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "3"},
                {"PET_MASTER_ADDR", "10.0.0.5"}, {"PET_MASTER_PORT", "1234"}, {"PET_RDZV_ID", "j7"}};
    auto o = parse({"/bin/sh"});
    EXPECT_EQ(o.nnodes, 2);
    EXPECT_EQ(o.node_rank, 1);
    EXPECT_EQ(o.nproc_per_node, 3);
    EXPECT_EQ(o.master_addr, "10.0.0.5");
    EXPECT_EQ(o.master_port, 1234);
    EXPECT_EQ(o.run_id, "j7");
    auto cli = parse({"--node_rank", "0", "--nproc-per-node=2", "/bin/sh"});
    EXPECT_EQ(cli.node_rank, 0);
    EXPECT_EQ(cli.nproc_per_node, 2);
    // An endpoint on the command line replaces PET_MASTER_ADDR/PORT instead of contradicting them.
    auto ep = parse({"--rdzv-endpoint", "node3:4000", "/bin/sh"});
    EXPECT_EQ(ep.master_addr, "node3");
    EXPECT_EQ(ep.master_port, 4000);
  }
  {
    // PET_RDZV_ENDPOINT gives the host and port the command line does not.
    PetEnv env{{"PET_RDZV_ENDPOINT", "node5:4100"}};
    auto o = parse({"--master-port", "4200", "/bin/sh"});
    EXPECT_EQ(o.master_addr, "node5");
    EXPECT_EQ(o.master_port, 4200);
  }
  {
    PetEnv env{{"PET_STANDALONE", "1"}, {"PET_NPROC_PER_NODE", "2"}};
    auto o = parse({"/bin/sh"});
    EXPECT_TRUE(o.standalone);
    EXPECT_NE(o.master_port, 29500);
  }
  {
    PetEnv env{{"PET_NNODES", "two"}};
    EXPECT_NE(usage_error({"/bin/sh"}).find("--nnodes two: expected an integer (from PET_NNODES=two)"), std::string::npos)
        << usage_error({"/bin/sh"});
    EXPECT_EQ(usage_error({"--nnodes", "1", "/bin/sh"}), "");  // the command line's value is the one used
  }
  {
    PetEnv env{{"PET_STANDALONE", "yes"}};
    EXPECT_NE(usage_error({"/bin/sh"}).find("PET_STANDALONE=yes: expected 0 or 1"), std::string::npos);
  }
}

// torchrun's gpu / cpu / auto; Kubeflow passes PET_NPROC_PER_NODE=auto by default.
TEST(LaunchOptions, NprocPerNodeGpuCpuAuto) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(parse({"--nproc-per-node", "cpu", "/bin/sh"}).nproc_per_node, cpus);
  {
    PetEnv env{{"CUDA_VISIBLE_DEVICES", "0,1,2"}};
    EXPECT_EQ(parse({"--nproc-per-node", "gpu", "/bin/sh"}).nproc_per_node, 3);
    EXPECT_EQ(parse({"--nproc-per-node", "auto", "/bin/sh"}).nproc_per_node, 3);
  }
  {
    PetEnv env{{"CUDA_VISIBLE_DEVICES", "GPU-8a1b,-1,3"}, {"PET_NPROC_PER_NODE", "auto"}};  // stops at -1, as CUDA
    EXPECT_EQ(parse({"/bin/sh"}).nproc_per_node, 1);
  }
  {
    PetEnv env{{"CUDA_VISIBLE_DEVICES", ""}};
    EXPECT_EQ(parse({"--nproc-per-node", "auto", "/bin/sh"}).nproc_per_node, cpus);
    EXPECT_NE(usage_error({"--nproc-per-node", "gpu", "/bin/sh"}).find("--nproc-per-node gpu: this node has no visible"),
              std::string::npos);
  }
}

TEST(LaunchOptions, RepeatedFlagsKeepTheLastValueAsArgparse) {
  auto o = parse({"--nproc-per-node", "2", "--master-port", "7000", "--nproc-per-node", "3", "/bin/sh"});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.master_port, 7000);
}

TEST(LaunchOptions, BracketedIpv6MasterAddressAndSignalsToHandle) {
  EXPECT_EQ(parse({"--master-addr", "[::1]", "/bin/sh"}).master_addr, "::1");
  EXPECT_EQ(parse({"--signals-to-handle", "SIGTERM,SIGUSR1", "/bin/sh"}).signals_to_handle,
            (std::vector<int>{SIGTERM, SIGUSR1}));
}

// torchrun's c10d rendezvous assigns node ranks; this launcher does not, so a multi-node c10d
// job must give them (every node would otherwise be node 0: a bind failure or a hang).
TEST(LaunchOptions, C10dWithSeveralNodesNeedsTheNodeRank) {
  EXPECT_NE(usage_error({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400", "/bin/sh"})
                .find("--rdzv-backend c10d with --nnodes 2 and no --node-rank"),
            std::string::npos);
  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400", "/bin/sh"});
  EXPECT_EQ(o.node_rank, 1);
  PetEnv env{{"PET_NODE_RANK", "1"}};
  EXPECT_EQ(parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400", "/bin/sh"}).node_rank, 1);
}

TEST(LaunchOptions, StandalonePicksALoopbackPort) {
  auto o = parse({"--standalone", "--nproc-per-node", "2", "/bin/sh"});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_GT(o.master_port, 0);
  EXPECT_NE(o.master_port, 29500);
}

TEST(LaunchOptions, TerminalRanks) {
  auto some = parse({"--terminal-ranks", "0,3", "/bin/sh"}).terminal_ranks;
  EXPECT_TRUE(some.includes(3));
  EXPECT_FALSE(some.includes(1));
  EXPECT_TRUE(some.prefixed());
  auto all = parse({"--terminal-ranks", "all", "/bin/sh"}).terminal_ranks;
  EXPECT_TRUE(all.includes(17));
  auto none = parse({"--terminal-ranks", "none", "/bin/sh"}).terminal_ranks;
  EXPECT_FALSE(none.includes(0));
}

TEST(LaunchOptions, ErrorsNameTheFlagAndTheFix) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "0", "/bin/sh"}, "--nproc-per-node 0: must be in [1, 4096]"},
      {{"--nproc-per-node", "4x", "/bin/sh"}, "--nproc-per-node 4x: expected an integer"},
      {{"--nnodes", "2", "--node-rank", "2", "/bin/sh"}, "--node-rank 2 is out of range for --nnodes 2"},
      {{"--nnodes", "1:4", "/bin/sh"}, "--nnodes 1:4: elastic node ranges are not supported"},
      {{"--master-port", "0", "/bin/sh"}, "--master-port 0 is not a TCP port"},
      {{"--master-port", "65536", "/bin/sh"}, "--master-port 65536 is not a TCP port"},
      {{"--rdzv-endpoint", "h:99999", "/bin/sh"}, "--rdzv-endpoint 99999: must be in [1, 65535]"},
      {{"--rdzv-endpoint", "h:1", "--master-port", "2", "/bin/sh"}, "--rdzv-endpoint together with"},
      {{"--max-restarts", "-1", "/bin/sh"}, "--max-restarts -1 is negative"},
      {{"--grace-period", "-2", "/bin/sh"}, "--grace-period -2 is out of range"},
      {{"--nnodes", "2", "--max-restarts", "1", "/bin/sh"}, "--max-restarts 1 with --nnodes 2 is not supported"},
      {{"--standalone", "--nnodes", "2", "/bin/sh"}, "--standalone with --nnodes 2"},
      {{"--terminal-ranks", "0,x", "/bin/sh"}, "--terminal-ranks x: expected an integer"},
      {{"--signals-to-handle", "SIGTERM,SIGKILL", "/bin/sh"}, "--signals-to-handle SIGTERM,SIGKILL: unknown signal 'SIGKILL'"},
      {{"--nproc-per-node", "2"}, "missing the worker command"},
      {{"--nproc-per-node", "2", "--bogus", "/bin/sh"}, "unknown flag --bogus"},
      {{"/no/such/program"}, "command '/no/such/program' is not an executable file"},
      {{"no-such-program-in-path-lf"}, "command 'no-such-program-in-path-lf' not found in PATH"},
  };
  for (const auto& c : cases) {
    std::string e = usage_error(c.args);
    EXPECT_NE(e.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in '" << e << "'";
    EXPECT_NE(e.find("HINT: "), std::string::npos);
  }
}

TEST(LaunchOptions, HelpListsTheFlags) {
  std::string help;
  EXPECT_FALSE(parse_launch_options({"--help"}, &help).has_value());
  for (const char* flag : {"--nnodes", "--node-rank", "--nproc-per-node", "--master-addr", "--master-port",
                           "--max-restarts", "--log-dir", "--grace-period", "--standalone", "--rdzv-endpoint"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}

TEST(WorkerEnv, SecondNodeRanks) {
  auto o = parse({"--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "4", "--master-addr", "n0",
                  "--master-port", "777", "/bin/sh"});
  auto env = as_map(worker_env_overrides(o, 2, 3));
  std::map<std::string, std::string> expected = {
      {"RANK", "6"},
      {"LOCAL_RANK", "2"},
      {"WORLD_SIZE", "12"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "3"},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", "6"},
      {"ROLE_WORLD_SIZE", "12"},
      {"MASTER_ADDR", "n0"},
      {"MASTER_PORT", "777"},
      {"TORCHELASTIC_RESTART_COUNT", "3"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
      {"TORCHELASTIC_RUN_ID", "none"},
      {"LOONGFORGE_RESTART_COUNT", "3"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},  // never inherited: workers host their store
  };
  EXPECT_EQ(env, expected);
}

TEST(WorkerEnv, OverridesWinOverDefaultsAndTheInheritedEnvironment) {
  setenv("LF_TEST_INHERITED", "kept", 1);
  setenv("RANK", "99", 1);
  auto env = build_worker_environment({{"A_DEFAULT", "d"}, {"RANK", "default"}}, {{"RANK", "5"}});
  unsetenv("RANK");
  auto has = [&](const std::string& kv) { return std::find(env.begin(), env.end(), kv) != env.end(); };
  EXPECT_TRUE(has("LF_TEST_INHERITED=kept"));
  EXPECT_TRUE(has("A_DEFAULT=d"));
  EXPECT_TRUE(has("RANK=5"));
  EXPECT_EQ(std::count_if(env.begin(), env.end(), [](const std::string& s) { return s.rfind("RANK=", 0) == 0; }), 1);
}

TEST(WorkerEnv, OmpDefaultOnlyForSeveralProcessesAndOnlyWhenUnset) {
  unsetenv("OMP_NUM_THREADS");
  std::vector<std::string> notes;
  auto four = as_map(worker_env_defaults(parse({"--nproc-per-node", "4", "/bin/sh"}), &notes));
  EXPECT_EQ(four["OMP_NUM_THREADS"], "1");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("OMP_NUM_THREADS=1"), std::string::npos);
  EXPECT_EQ(as_map(worker_env_defaults(parse({"/bin/sh"}), nullptr)).count("OMP_NUM_THREADS"), 0u);
  setenv("OMP_NUM_THREADS", "8", 1);
  EXPECT_EQ(as_map(worker_env_defaults(parse({"--nproc-per-node", "4", "/bin/sh"}), nullptr)).count("OMP_NUM_THREADS"), 0u);
  unsetenv("OMP_NUM_THREADS");
}

TEST(WorkerEnv, NcclAsyncErrorHandlingDefaultsToTorchruns) {
  unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  EXPECT_EQ(as_map(worker_env_defaults(parse({"/bin/sh"}), nullptr))["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", 1);
  EXPECT_EQ(as_map(worker_env_defaults(parse({"/bin/sh"}), nullptr)).count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 0u);
  unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
}

}  // namespace
}  // namespace lf::run
