// Collectives over shared memory for the members of a group that share one host: all_reduce,
// reduce_scatter, all_gather and all_to_all (uneven splits: MoE's token dispatch) of contiguous CPU
// tensors go through a segment every member maps (POSIX shm), everything else (broadcast,
// send/recv, barrier, other devices and dtypes) to the communicator it wraps (Gloo). Loopback TCP
// copies every byte through the kernel several times; here each rank copies its data in once, sums
// its 1/N of every chunk in place, and copies the result out: 22-27 ms -> ~4 ms for the 40 MB
// gradient all-reduce of two ranks, 38-49 -> ~4 for its reduce-scatter
// (loongforge-bench-collectives, docs/performance.md).
//
// Whether the members can share memory is found out, not assumed: group rank 0 creates the
// segment, every member opens it and checks a token written through it, and the group uses it
// only if every member succeeded (different hosts, IPC namespaces or a full /dev/shm fall back to
// the wrapped communicator, with a log line). LOONGFORGE_SHM_COLLECTIVES=0 turns it off.
//
// Ops run in issue order on one thread per group (async ones return at once, as Gloo's do). A
// wait that passes the group's timeout, a peer process that has exited, or a peer whose
// collective failed ends the op with an lf::Error naming the op, the group and the ranks waited
// for; the group's shared-memory path then refuses further ops.
#pragma once

#include <cstdint>
#include <memory>

#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/backend/communicator.h"

namespace lf::backend {

struct SharedMemoryOptions {
  // Bytes of one rank's slot (the chunk of data it contributes per step); the segment holds two
  // slots per member, so a group of N maps 2 * N * slot_bytes (+ one page of counters). 256 KiB
  // measured best for a 40 MB all-reduce of 2 ranks here (loongforge-bench-collectives: 64 KiB
  // 5.2 ms, 256 KiB 4.1, 1 MiB 4.8, 4 MiB 7.6): the slots of a chunk stay in the caches.
  int64_t slot_bytes = int64_t{256} << 10;
};

// `inner` over shared memory where every member can map the segment, else `inner` itself. Every
// member of spec's group must call it, in the same order as the group's other collectives
// (spec.store carries the handshake). A group of one is returned unchanged.
std::unique_ptr<Communicator> with_shared_memory(std::unique_ptr<Communicator> inner,
                                                 const CommunicatorSpec& spec,
                                                 const SharedMemoryOptions& options = {});

// LOONGFORGE_SHM_COLLECTIVES: unset, 1, on or auto -> true; 0 or off -> false; anything else
// throws naming the variable. Read it before creating the Gloo group that with_shared_memory will
// wrap, so that a bad value is the same error on every rank (read after Gloo's handshake, the
// first rank to fail closes its connections while a slower rank still connects).
bool shm_collectives_enabled();

// The CPU backend's communicator: Gloo, with shared-memory collectives where they apply.
std::unique_ptr<Communicator> make_cpu_communicator(const CommunicatorSpec& spec,
                                                    const GlooOptions& gloo = {});

// True when `c` runs its all_reduce / reduce_scatter / all_gather / all_to_all over shared memory.
bool uses_shared_memory(const Communicator& c);

}  // namespace lf::backend
