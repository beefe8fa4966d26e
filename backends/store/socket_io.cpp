#include "backends/store/socket_io.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"

namespace llama4d::store {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

std::string endpoint_name(const std::string& host, int port) {
  bool v6_literal = host.find(':') != std::string::npos;
  return (v6_literal ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

namespace {

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Waits until fd is ready for `events` or the deadline passes (false). EINTR restarts the wait.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

Fd listen_on(int port) {
  if (port < 0 || port > 65535) throw InputError("port " + std::to_string(port) + " is outside 0..65535");
  // Dual-stack first (IPv6 socket that also takes IPv4), plain IPv4 where IPv6 is off.
  for (int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) continue;
    int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(uint16_t(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(uint16_t(port));
      len = sizeof(sockaddr_in);
    }
    // Two SO_REUSEADDR sockets may both bind a port that neither listens on yet; the second to
    // listen is then refused with EADDRINUSE, which is the same taken port as a refused bind.
    const bool bound = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0;
    if (bound && ::listen(fd.get(), 128) == 0) return fd;
    if (errno == EADDRINUSE)
      throw PortInUseError("the store cannot listen on port " + std::to_string(port) +
                           ": it is in use (another job's MASTER_PORT?)");
    // Otherwise this family is not available here; try the next.
  }
  throw IoError("the store cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno));
}

Fd listen_on(const std::string& host, int port) {
  if (port < 0 || port > 65535) throw InputError("port " + std::to_string(port) + " is outside 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw InputError("cannot resolve '" + host + "', where the store is to listen: " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
  std::string tried;
  for (int family : {AF_INET, AF_INET6})
    for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
      if (ai->ai_family != family) continue;
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (fd.get() < 0) continue;
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.get(), 128) == 0) return fd;
      if (errno == EADDRINUSE)
        throw PortInUseError("the store cannot listen on " + endpoint_name(host, port) +
                             ": the port is in use (another job's MASTER_PORT?)");
      tried = std::strerror(errno);
    }
  throw InputError("the store cannot listen on '" + host + "': it is not an address of this machine (" +
                   (tried.empty() ? "no usable address" : tried) + "); rank 0 serves the store where MASTER_ADDR names it");
}

int bound_port(int listen_fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw IoError(std::string("getsockname: ") + std::strerror(errno));
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

Fd connect_to(const std::string& host, int port, Clock::time_point deadline) {
  const std::string where = endpoint_name(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw InputError("cannot resolve the store's host '" + host + "': " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);

  std::string last_error = "no address";
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (fd.get() < 0) continue;
      int r = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      if (r != 0 && errno == EINPROGRESS) {
        if (!wait_ready(fd.get(), POLLOUT, deadline)) {
          last_error = "no answer";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        r = err == 0 ? 0 : -1;
        errno = err;
      }
      if (r == 0) {
        int one = 1;  // small request/answer messages: send each at once
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last_error = std::strerror(errno);
    }
    if (Clock::now() + pause >= deadline)
      throw CommError("no store answered at " + where + " within the timeout (last attempt: " + last_error +
                      "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_ready(fd, POLLOUT, deadline)) continue;
      throw CommError("sending to " + peer + " timed out");
    }
    throw CommError("lost the connection to " + peer + " while sending (" + std::strerror(errno) + ")");
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer,
              const std::string& what) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) throw CommError("timed out waiting for " + what + " from " + peer);
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    throw CommError(peer + " closed the connection while this process waited for " + what);
  }
}

}  // namespace llama4d::store
