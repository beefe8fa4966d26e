#pragma once
// A process's place in an NCCL job, found from how it was started:
//   - torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; store/launch_env.h):
//     the unique ids travel through the rendezvous store;
//   - mpirun: MPI carries them (this build's MPI backend; without it, an error says to use the
//     variables instead);
//   - neither: a world of one.
// It keeps what the bootstrap needs alive and, when it ends, lets rank 0's store serve until
// every rank is done.
//
//   NcclJob job(options, mesh_ranks);
//   train(job.session().world());
#include <memory>
#include <vector>

#include "backends/nccl/nccl_session.h"
#include "core/comm/rank_agreement.h"

namespace llama4d {

class NcclJob {
 public:
  // expected_ranks > 1 and no launcher: InputError saying how to start the processes. Before
  // any NCCL call (libnccl is not even loaded yet), every rank checks that it was launched with
  // the others' `settings` (core/comm/rank_agreement.h; over the store or MPI, whichever carries
  // the ids) and that the job has expected_ranks processes: InputError naming what differs.
  NcclJob(const NcclOptions& options, int expected_ranks, const std::vector<RankSetting>& settings = {});
  ~NcclJob();
  NcclJob(const NcclJob&) = delete;
  NcclJob& operator=(const NcclJob&) = delete;

  NcclSession& session() { return *session_; }

 private:
  struct Launcher;
  std::unique_ptr<Launcher> launcher_;
  std::unique_ptr<NcclSession> session_;
};

}  // namespace llama4d
