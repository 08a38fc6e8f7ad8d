#pragma once
// The one exchange NCCL needs before its communicator exists: rank 0's unique id, handed
// to every rank over TCP at MASTER_ADDR:MASTER_PORT (where rank 0 listens), as torchrun's
// store hands it to PyTorch's processes.
#include <string>
#include <vector>

#include "hone/distributed.h"

namespace hone {

// On rank 0 returns `blob` once every other rank has fetched it; elsewhere returns rank
// 0's blob. Fails with a message after collective_timeout_seconds() without every rank.
std::vector<char> rendezvous_share(const ProcessGroup& g, const std::vector<char>& blob);

// The port this job's rendezvous uses: MASTER_PORT, or the port after it when torchrun's
// own agent store already listens on MASTER_PORT.
int rendezvous_port(const ProcessGroup& g);

}  // namespace hone
