#pragma once
// Blocking TCP sockets with deadlines, for the rendezvous store. Every wait is bounded: a read or
// connect that cannot finish by its deadline throws CommError naming what it waited for, so a
// peer that died or never came cannot hang this process.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace llama4d::store {

using Clock = std::chrono::steady_clock;

// An owned file descriptor (closed on destruction; -1 is none).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// "host:port" as messages print it ([v6]:port for IPv6 literals).
std::string endpoint_name(const std::string& host, int port);

// Another process holds the port a store was to listen on: a launcher may pick another and retry.
class PortInUseError : public IoError {
 public:
  using IoError::IoError;
};

// Listens on every interface at `port` (0: the kernel picks a free one). PortInUseError naming
// the port if it is taken, IoError if it cannot be bound otherwise.
Fd listen_on(int port);
// Listens at `port` on the one address `host` resolves to here (IPv4 first: "localhost" is
// 127.0.0.1), so other interfaces of the machine do not reach it. InputError naming host if it
// does not resolve or is not an address of this machine; PortInUseError as above.
Fd listen_on(const std::string& host, int port);
// The port a listening socket is bound to.
int bound_port(int listen_fd);

// Connects to host:port, retrying refused or unreachable attempts until `deadline` (the server may
// start after its clients, as torchrun's ranks do). InputError if the host name does not resolve;
// CommError naming host:port if no connection is made by the deadline.
Fd connect_to(const std::string& host, int port, Clock::time_point deadline);

// Writes all of data. CommError (naming `peer`) if the connection is gone or the deadline passes.
void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& peer);
// Reads exactly n bytes. CommError naming `peer` and `what` if the peer closes the connection or
// the deadline passes first.
void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer,
              const std::string& what);

}  // namespace llama4d::store
