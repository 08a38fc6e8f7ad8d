#include "dist/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "hone/error.h"

namespace hone {

namespace {

using clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x686f6e65;  // "hone"

struct Socket {
  int fd = -1;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

int remaining_ms(clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return ms > 0 ? int(ms) : 0;
}

// All of n bytes, or a failure naming `what`.
void io_all(int fd, void* p, size_t n, bool send, clock::time_point deadline, const std::string& what) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, short(send ? POLLOUT : POLLIN), 0};
    const int r = ::poll(&pf, 1, remaining_ms(deadline));
    if (r == 0) fail("{}: timed out", what);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("{}: poll: {}", what, std::strerror(errno));
    const ssize_t k = send ? ::send(fd, c, n, MSG_NOSIGNAL) : ::recv(fd, c, n, 0);
    if (k == 0) fail("{}: the other side closed the connection", what);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) fail("{}: {}", what, std::strerror(errno));
    c += k;
    n -= size_t(k);
  }
}

struct Hello {
  uint32_t magic, rank, world_size, bytes;
};

std::vector<char> serve(const ProcessGroup& g, int port, const std::vector<char>& blob, clock::time_point deadline) {
  Socket s(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = s.fd >= 0;
  if (!v6) s = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd < 0) fail("rank 0: cannot open a socket for the rendezvous: {}", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 peers too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(s.fd, 128) != 0)
    fail("rank 0: cannot listen on port {} for the other ranks (MASTER_PORT): {}", port, std::strerror(errno));
  std::vector<bool> seen(size_t(g.world_size), false);
  for (int joined = 1; joined < g.world_size;) {
    pollfd pf{s.fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, remaining_ms(deadline));
    if (r == 0)
      fail("rank 0: only {} of {} ranks reached the rendezvous on port {} within {} s", joined, g.world_size, port,
           collective_timeout_seconds());
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("rank 0: rendezvous: poll: {}", std::strerror(errno));
    }
    Socket c(::accept(s.fd, nullptr, nullptr));
    if (c.fd < 0) continue;
    Hello h{};
    try {
      io_all(c.fd, &h, sizeof h, false, deadline, "rank 0: reading a rank's greeting");
    } catch (const Error&) {
      continue;  // not one of ours (a port scan, a rank that gave up)
    }
    if (h.magic != kMagic) continue;
    if (int(h.world_size) != g.world_size)
      fail("rank 0: rank {} says the job has {} ranks, rank 0 was told {}: two jobs share MASTER_PORT {}?", h.rank,
           h.world_size, g.world_size, port);
    if (h.rank == 0 || int(h.rank) >= g.world_size || seen[h.rank])
      fail("rank 0: a second process says it is rank {} (of {}): two jobs share MASTER_PORT {}?", h.rank,
           g.world_size, port);
    seen[h.rank] = true;
    Hello reply{kMagic, 0, uint32_t(g.world_size), uint32_t(blob.size())};
    io_all(c.fd, &reply, sizeof reply, true, deadline, "rank 0: answering rank " + std::to_string(h.rank));
    io_all(c.fd, const_cast<char*>(blob.data()), blob.size(), true, deadline,
           "rank 0: sending rank " + std::to_string(h.rank) + " the communicator's id");
    ++joined;
  }
  return blob;
}

std::vector<char> fetch(const ProcessGroup& g, int port, clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string where = g.master_addr + ":" + std::to_string(port);
  for (;;) {
    addrinfo* list = nullptr;
    const int e = ::getaddrinfo(g.master_addr.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (e != 0) fail("rank {}: MASTER_ADDR {}: {}", g.rank, g.master_addr, ::gai_strerror(e));
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(list, ::freeaddrinfo);
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (s.fd < 0 || ::connect(s.fd, ai->ai_addr, ai->ai_addrlen) != 0) continue;
      const std::string what = fmt::format("rank {}: rendezvous with rank 0 at {}", g.rank, where);
      Hello h{kMagic, uint32_t(g.rank), uint32_t(g.world_size), 0};
      io_all(s.fd, &h, sizeof h, true, deadline, what);
      Hello reply{};
      io_all(s.fd, &reply, sizeof reply, false, deadline, what);
      if (reply.magic != kMagic || int(reply.world_size) != g.world_size || reply.bytes > (1u << 20))
        fail("{}: the answer is not from a hone job of {} ranks", what, g.world_size);
      std::vector<char> blob(reply.bytes);
      io_all(s.fd, blob.data(), blob.size(), false, deadline, what);
      return blob;
    }
    if (remaining_ms(deadline) == 0)
      fail("rank {}: rank 0 did not answer at {} (MASTER_ADDR:MASTER_PORT) within {} s", g.rank, where,
           collective_timeout_seconds());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 is not listening yet
  }
}

}  // namespace

int rendezvous_port(const ProcessGroup& g) {
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return g.master_port + (agent_store && std::strcmp(agent_store, "True") == 0 ? 1 : 0);
}

std::vector<char> rendezvous_share(const ProcessGroup& g, const std::vector<char>& blob) {
  if (g.master_addr.empty() || g.master_port == 0)
    fail("rank {} of {}: the launcher ({}) set no MASTER_ADDR and MASTER_PORT for the ranks to meet at; set both "
         "(hone launch and torchrun do)",
         g.rank, g.world_size, g.launcher);
  const auto deadline = clock::now() + std::chrono::seconds(collective_timeout_seconds());
  const int port = rendezvous_port(g);
  return g.rank == 0 ? serve(g, port, blob, deadline) : fetch(g, port, deadline);
}

}  // namespace hone
