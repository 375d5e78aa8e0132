// LaunchEnv: who this process is in the job (rank, world, node, master address), read from the
// variables a launcher sets: torchrun / loongforge-run, Slurm (srun) or Open MPI (mpirun).
// Pure environment parsing, no LibTorch and no sockets; dist::Rendezvous does the connecting.
#pragma once

#include <string>
#include <vector>

namespace lf::dist {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          // 0 only when world_size == 1
  int restart_count = 0;        // how many times the launcher restarted this job
  std::string source = "single";  // "torchrun", "slurm", "openmpi" or "single"
  // torchrun's agent already hosts the TCPStore at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects as a client.
  bool agent_store = false;
};

// Reads the process environment. Precedence: torchrun variables (RANK, WORLD_SIZE) first, then
// Open MPI (OMPI_COMM_WORLD_RANK), then Slurm (SLURM_PROCID), else a single process.
// An empty variable counts as unset. Inconsistent or non-numeric values throw lf::Error naming
// the variable and its value.
LaunchEnv detect_launch_env();

// Expands a Slurm hostlist of the simple forms "a,b", "node[01-04]", "gpu[1,3-5]-ib,login":
// one bracket group per host name, zero padding kept. Throws lf::Error on a malformed list.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

// Expands SLURM_TASKS_PER_NODE ("2(x3),1") into one task count per node.
std::vector<int> expand_slurm_tasks_per_node(const std::string& value);

// The MASTER_PORT used under Slurm when none is given: 15000 + the last four digits of the job
// id, so every rank of a job derives the same port and concurrent jobs rarely collide.
int slurm_port_from_job_id(const std::string& job_id);

}  // namespace lf::dist
