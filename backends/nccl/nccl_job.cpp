#include "backends/nccl/nccl_job.h"

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "backends/store/launch_env.h"
#include "backends/store/rendezvous.h"
#include "backends/store/store_agreement.h"
#include "core/error.h"
#include "core/parse_number.h"
#ifdef LLAMA4D_HAVE_MPI
#include "backends/mpi/mpi_session.h"
#endif

namespace llama4d {

struct NcclJob::Launcher {
  std::unique_ptr<store::Rendezvous> rdzv;  // torchrun-style: the store the ids went through
#ifdef LLAMA4D_HAVE_MPI
  std::unique_ptr<MpiSession> mpi;  // mpirun: the world the ids went through
#endif
};

NcclJob::NcclJob(const NcclOptions& options, int expected_ranks, const std::vector<RankSetting>& settings)
    : launcher_(std::make_unique<Launcher>()) {
  NcclBootstrap boot;
  // Open MPI (OMPI_*), PMIx and Hydra (PMI_*) launchers set these in every process they start.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
  if (const std::optional<store::LaunchEnv> env = store::launch_env()) {
    launcher_->rdzv = std::make_unique<store::Rendezvous>(*env, options.timeout);
    store::check_ranks_agree(*launcher_->rdzv, settings);
    boot = bootstrap_from_store(*launcher_->rdzv, env->local_rank);
  } else if (under_mpirun) {
#ifdef LLAMA4D_HAVE_MPI
    MpiOptions mo;
    mo.timeout = options.timeout;
    mo.cluster = options.cluster;
    launcher_->mpi = std::make_unique<MpiSession>(mo);
    check_ranks_agree(launcher_->mpi->world(), settings);
    std::optional<int> local;
    if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = parse_number<int>(l, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    boot = bootstrap_from_group(launcher_->mpi->world(), local);
#else
    throw InputError("--backend nccl under mpirun: this build has no MPI to carry NCCL's id (start the processes "
                     "with torchrun-style variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT instead)");
#endif
  } else if (expected_ranks > 1) {
    throw InputError("--backend nccl: the mesh needs " + std::to_string(expected_ranks) +
                     " processes, one per GPU: start them with mpirun -np " + std::to_string(expected_ranks) +
                     " or with torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK)");
  } else {
    boot.broadcast = [](const std::vector<uint8_t>& ids) { return ids; };  // a world of one: nobody to tell
  }
  if (boot.size != expected_ranks)
    throw InputError("the mesh needs " + std::to_string(expected_ranks) + " ranks but the job has " +
                     std::to_string(boot.size) + " processes (one per GPU)");
  session_ = std::make_unique<NcclSession>(options, boot);
}

NcclJob::~NcclJob() {
  session_.reset();
  // Rank 0's store serves until every rank said it is done (bounded by the timeout); while an
  // exception unwinds, it stops at once instead.
  if (launcher_->rdzv && std::uncaught_exceptions() == 0) {
    try {
      launcher_->rdzv->finish();
    } catch (const Error&) {
    }
  }
}

}  // namespace llama4d
