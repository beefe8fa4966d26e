// The client side of the store: one request, one answer, each bounded by the client's timeout.
#include "backends/store/tcp_store.h"
#include "core/error.h"

namespace llama4d::store {

StoreClient::StoreClient(std::string host, int port, std::chrono::milliseconds timeout, const std::string& token)
    : address_(endpoint_name(host, port)), timeout_(timeout) {
  if (timeout.count() <= 0) throw InputError("the store's timeout must be positive");
  fd_ = connect_to(host, port, Clock::now() + timeout);
  std::vector<uint8_t> answer;
  round_trip(Op::hello, token, {}, std::chrono::milliseconds(0), answer);
}

uint8_t StoreClient::round_trip(Op op, const std::string& key, const std::vector<uint8_t>& value,
                                std::chrono::milliseconds wait, std::vector<uint8_t>& answer) {
  if (broken_) throw CommError("the connection to the store at " + address_ + " broke in an earlier request");
  // The default server's caps, found before sending (a server with smaller ones refuses by name).
  constexpr StoreLimits caps;
  if (key.size() > caps.max_key_bytes)
    throw InputError("store key longer than the cap of " + std::to_string(caps.max_key_bytes) + " bytes");
  if (value.size() > caps.max_value_bytes)
    throw InputError("store value of '" + key + "' is over the cap of " + std::to_string(caps.max_value_bytes) + " bytes");
  std::vector<uint8_t> request;
  request.reserve(kRequestHeader + key.size() + value.size());
  request.push_back(uint8_t(op));
  put_le(request, key.size(), 4);
  put_le(request, uint64_t(std::min<int64_t>(wait.count(), UINT32_MAX)), 4);
  put_le(request, value.size(), 8);
  request.insert(request.end(), key.begin(), key.end());
  request.insert(request.end(), value.begin(), value.end());

  const std::string what = "the store's answer to '" + key + "'";
  broken_ = true;  // until the whole answer is in
  // A get's answer may take its wait; beyond that, the timeout is the server's time to answer.
  auto deadline = Clock::now() + timeout_ + wait;
  send_all(fd_.get(), request.data(), request.size(), deadline, "the store at " + address_);
  uint8_t header[kAnswerHeader];
  recv_all(fd_.get(), header, sizeof header, deadline, "the store at " + address_, what);
  uint64_t len = get_le(header + 1, 8);
  if (len > kMaxValueBytes) throw CommError("the store at " + address_ + " sent a malformed answer");
  answer.resize(len);
  recv_all(fd_.get(), answer.data(), len, deadline, "the store at " + address_, what);
  broken_ = false;
  if (Status(header[0]) == Status::refused)
    throw CommError("the store at " + address_ + " refused " + (op == Op::hello ? std::string("this process") : "'" + key + "'") +
                    ": " + std::string(answer.begin(), answer.end()));
  if (Status(header[0]) == Status::bad_request)
    throw CommError("the store at " + address_ + " refused the request for '" + key + "' (mixed llama4d versions?)");
  return header[0];
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> answer;
  round_trip(Op::set, key, value, std::chrono::milliseconds(0), answer);
}

bool StoreClient::try_get(const std::string& key, std::chrono::milliseconds wait, std::vector<uint8_t>& value) {
  std::vector<uint8_t> answer;
  if (Status(round_trip(Op::get, key, {}, wait, answer)) != Status::ok) return false;
  value = std::move(answer);
  return true;
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  std::vector<uint8_t> value;
  if (!try_get(key, timeout_, value))
    throw CommError("store key '" + key + "' was not set within " + std::to_string(timeout_.count()) + " ms (store at " +
                    address_ + ")");
  return value;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> answer;
  round_trip(Op::add, key, encode_int64(delta), std::chrono::milliseconds(0), answer);
  if (answer.size() != 8) throw CommError("the store at " + address_ + " sent a malformed answer to add('" + key + "')");
  return decode_int64(answer);
}

bool StoreClient::check(const std::string& key) {
  std::vector<uint8_t> answer;
  round_trip(Op::check, key, {}, std::chrono::milliseconds(0), answer);
  return !answer.empty() && answer[0] == 1;
}

}  // namespace llama4d::store
