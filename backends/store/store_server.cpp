// The store's serving thread: one poll loop over the listening socket, the wake pipe and every
// client. Clients send one request at a time; a get on a missing key parks that client until a
// set (or add) makes the key, or until the wait it asked for runs out.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <optional>

#include "backends/store/tcp_store.h"
#include "core/error.h"

namespace llama4d::store {

namespace {

struct Client {
  Fd fd;
  std::vector<uint8_t> in;   // bytes received, not yet a whole request
  std::vector<uint8_t> out;  // answers not yet sent
  std::optional<std::string> parked_key;  // a get waiting for this key
  Clock::time_point parked_until;
  bool closing = false;  // drop once `out` is sent (after a bad request)
  bool admitted = false;  // presented the job token
};

void answer(Client& c, Status status, const std::vector<uint8_t>& value = {}) {
  c.out.push_back(uint8_t(status));
  put_le(c.out, value.size(), 8);
  c.out.insert(c.out.end(), value.begin(), value.end());
}

}  // namespace

void refuse(Client& c, const std::string& why) { answer(c, Status::refused, std::vector<uint8_t>(why.begin(), why.end())); }

struct StoreServer::State {
  StoreLimits limits;
  std::string token;
  std::map<std::string, std::vector<uint8_t>> values;
  uint64_t total_bytes = 0;  // of every key and value held

  // Whether key = value fits the key count and total bytes caps (an existing key's bytes are
  // replaced, not added); refuses the set naming the cap if not.
  bool fits(Client& c, const std::string& key, uint64_t value_bytes) {
    const auto it = values.find(key);
    const uint64_t freed = it == values.end() ? 0 : key.size() + it->second.size();
    if (it == values.end() && values.size() >= limits.max_keys) {
      refuse(c, "the store holds its cap of " + std::to_string(limits.max_keys) + " keys");
      return false;
    }
    if (total_bytes - freed + key.size() + value_bytes > limits.max_total_bytes) {
      refuse(c, "the store would hold more than its cap of " + std::to_string(limits.max_total_bytes) + " bytes");
      return false;
    }
    total_bytes = total_bytes - freed + key.size() + value_bytes;
    return true;
  }
  std::list<Client> clients;

  void wake_parked(const std::string& key) {
    for (Client& c : clients)
      if (c.parked_key == key) {
        answer(c, Status::ok, values[key]);
        c.parked_key.reset();
      }
  }

  // Handles every whole request in c.in (stopping at a parked get, which holds the rest back).
  void serve(Client& c) {
    size_t used = 0;
    while (!c.parked_key && !c.closing && c.in.size() - used >= kRequestHeader) {
      const uint8_t* h = c.in.data() + used;
      auto op = Op(h[0]);
      uint64_t key_len = get_le(h + 1, 4), wait_ms = get_le(h + 5, 4), value_len = get_le(h + 9, 8);
      if (key_len > limits.max_key_bytes || value_len > limits.max_value_bytes) {
        refuse(c, key_len > limits.max_key_bytes
                      ? "a key of " + std::to_string(key_len) + " bytes is over the cap of " +
                            std::to_string(limits.max_key_bytes)
                      : "a value of " + std::to_string(value_len) + " bytes is over the cap of " +
                            std::to_string(limits.max_value_bytes));
        c.closing = true;
        break;
      }
      if (c.in.size() - used < kRequestHeader + key_len + value_len) break;
      std::string key(reinterpret_cast<const char*>(h + kRequestHeader), key_len);
      std::vector<uint8_t> value(h + kRequestHeader + key_len, h + kRequestHeader + key_len + value_len);
      used += kRequestHeader + key_len + value_len;
      if (!c.admitted || op == Op::hello) {
        // Nothing is served to a connection before it shows the job's token.
        c.admitted = op == Op::hello && key == token;
        if (c.admitted) {
          answer(c, Status::ok);
        } else {
          refuse(c, op == Op::hello ? "another job's token" : "a request before the job token");
          c.closing = true;
        }
        continue;
      }
      switch (op) {
        case Op::set:
          if (!fits(c, key, value.size())) break;
          values[key] = std::move(value);
          answer(c, Status::ok);
          wake_parked(key);
          break;
        case Op::get:
          if (auto it = values.find(key); it != values.end()) {
            answer(c, Status::ok, it->second);
          } else {
            c.parked_key = key;
            c.parked_until = Clock::now() + std::chrono::milliseconds(wait_ms);
          }
          break;
        case Op::add: {
          auto it = values.find(key);
          if (value.size() != 8 || (it != values.end() && it->second.size() != 8)) {
            answer(c, Status::bad_request);
            c.closing = true;
            break;
          }
          if (it == values.end() && !fits(c, key, 8)) break;
          int64_t now = (it == values.end() ? 0 : decode_int64(it->second)) + decode_int64(value);
          values[key] = encode_int64(now);
          answer(c, Status::ok, values[key]);
          wake_parked(key);
          break;
        }
        case Op::check:
          answer(c, Status::ok, {uint8_t(values.count(key) ? 1 : 0)});
          break;
        default:
          answer(c, Status::bad_request);
          c.closing = true;
      }
    }
    c.in.erase(c.in.begin(), c.in.begin() + std::ptrdiff_t(used));
  }

  // Parked gets whose wait ran out answer not_found; returns the poll timeout until the next one.
  int expire_parked() {
    auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (Client& c : clients) {
      if (!c.parked_key) continue;
      if (c.parked_until <= now) {
        answer(c, Status::not_found);
        c.parked_key.reset();
        serve(c);  // requests that queued behind the parked one
      } else {
        next = std::min(next, c.parked_until);
      }
    }
    if (next == Clock::time_point::max()) return -1;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
    return int(std::min<int64_t>(ms, 1 << 30));  // a wait of up to 2^32 ms must not overflow poll's int
  }
};

namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Reads what is available; false when the peer has gone.
bool read_some(Client& c) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t r = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (r > 0) {
      c.in.insert(c.in.end(), buf, buf + r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// Sends what the socket takes; false when the peer has gone.
bool write_some(Client& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t w = ::send(c.fd.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (w > 0) {
      sent += size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return false;
  }
  c.out.erase(c.out.begin(), c.out.begin() + std::ptrdiff_t(sent));
  return true;
}

}  // namespace

StoreServer::StoreServer(int port, StoreLimits limits, std::string token)
    : StoreServer(listen_on(port), limits, std::move(token)) {}

StoreServer::StoreServer(const std::string& host, int port, StoreLimits limits, std::string token)
    : StoreServer(listen_on(host, port), limits, std::move(token)) {}

StoreServer::StoreServer(Fd listener, StoreLimits limits, std::string token)
    : listener_(std::move(listener)), state_(std::make_unique<State>()) {
  state_->limits = limits;
  state_->token = std::move(token);
  port_ = bound_port(listener_.get());
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  wake_read_ = Fd(pipe_fds[0]);
  wake_write_ = Fd(pipe_fds[1]);
  set_nonblocking(listener_.get());

  thread_ = std::thread([this] {
    State& s = *state_;
    std::vector<pollfd> fds;
    std::vector<Client*> owners;  // owners[i] is the client of fds[i + 2]
    for (;;) {
      int timeout = s.expire_parked();
      fds.assign({{wake_read_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}});
      owners.clear();
      for (Client& c : s.clients) {
        fds.push_back({c.fd.get(), short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
        owners.push_back(&c);
      }
      if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // the destructor asked us to stop
      if (fds[1].revents & POLLIN) {
        for (;;) {
          int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          s.clients.emplace_back();
          s.clients.back().fd = Fd(fd);
        }
      }
      for (size_t i = 0; i < owners.size(); ++i) {
        Client& c = *owners[i];
        short ev = fds[i + 2].revents;
        bool alive = true;
        if (ev & (POLLIN | POLLHUP | POLLERR)) alive = read_some(c);
        if (alive) s.serve(c);
        if (alive && !c.out.empty()) alive = write_some(c);
        if (!alive || (c.closing && c.out.empty())) c.fd = Fd();  // marks it for removal below
      }
      s.clients.remove_if([](const Client& c) { return c.fd.get() < 0; });
    }
  });
}

StoreServer::~StoreServer() {
  uint8_t stop = 1;
  while (::write(wake_write_.get(), &stop, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

}  // namespace llama4d::store
