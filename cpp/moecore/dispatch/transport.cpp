// LoopbackGroup: a generation-counted rendezvous. Each collective is post → barrier → read →
// barrier, so a rank never overwrites a mailbox a peer has not read yet.
#include "moecore/dispatch/transport.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

namespace moecore {
namespace {

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts) override {
    check_peers("exchange_counts", send_counts.size());
    std::vector<std::vector<uint8_t>> send(send_counts.size(), std::vector<uint8_t>(8));
    for (size_t d = 0; d < send.size(); ++d) std::memcpy(send[d].data(), &send_counts[d], 8);
    std::vector<std::vector<uint8_t>> recv = group_->exchange(rank_, std::move(send));
    std::vector<int64_t> counts(recv.size());
    for (size_t s = 0; s < recv.size(); ++s) std::memcpy(&counts[s], recv[s].data(), 8);
    return counts;
  }
  std::vector<std::vector<uint8_t>> all_to_all_v(
      const std::vector<std::vector<uint8_t>>& send) override {
    check_peers("all_to_all_v", send.size());
    return group_->exchange(rank_, send);
  }
  void all_to_all_into(const uint8_t* send, const int64_t* send_bytes, uint8_t* recv,
                       int64_t* recv_bytes, int64_t block_bytes) override {
    MOECORE_CHECK(block_bytes >= 0, "Transport.all_to_all_into: expected block_bytes >= 0, got ",
                  block_bytes);
    for (int d = 0; d < group_->size(); ++d)
      MOECORE_CHECK(send_bytes[d] >= 0 && send_bytes[d] <= block_bytes,
                    "Transport.all_to_all_into: send_bytes[", d, "] = ", send_bytes[d],
                    " is outside [0, block_bytes = ", block_bytes, "]");
    group_->exchange_into(rank_, send, send_bytes, recv, recv_bytes, block_bytes);
  }
  void barrier() override {
    group_->exchange(rank_, std::vector<std::vector<uint8_t>>(group_->size()));
  }

 private:
  void check_peers(const char* api, size_t n) const {
    MOECORE_CHECK(static_cast<int>(n) == group_->size(), "Transport.", api,
                  ": expected one entry "
                  "per rank (",
                  group_->size(), "), got ", n);
  }
  std::shared_ptr<LoopbackGroup> group_;
  int rank_;
};

}  // namespace

FixedExchange::FixedExchange(TransportPtr transport, int64_t block_bytes)
    : transport_(std::move(transport)),
      block_bytes_(block_bytes),
      send_(static_cast<size_t>(transport_->size() * block_bytes)),
      recv_(send_.size()),
      send_bytes_(static_cast<size_t>(transport_->size())),
      recv_bytes_(send_bytes_.size()) {}

void FixedExchange::clear() { std::fill(send_bytes_.begin(), send_bytes_.end(), 0); }

uint8_t* FixedExchange::append(int64_t peer, int64_t bytes) {
  MOECORE_INTERNAL_CHECK(send_bytes_[peer] + bytes <= block_bytes_,
                         "a prepared round's block for rank ", peer, " overflows its ",
                         block_bytes_, " bytes");
  uint8_t* at = send_.data() + peer * block_bytes_ + send_bytes_[peer];
  send_bytes_[peer] += bytes;
  return at;
}

void FixedExchange::exchange() {
  transport_->all_to_all_into(send_.data(), send_bytes_.data(), recv_.data(), recv_bytes_.data(),
                              block_bytes_);
}

std::shared_ptr<LoopbackGroup> LoopbackGroup::create(int size) {
  MOECORE_CHECK(size >= 1 && size <= 1024, "LoopbackGroup: expected 1..1024 ranks, got ", size);
  return std::shared_ptr<LoopbackGroup>(new LoopbackGroup(size));
}

LoopbackGroup::LoopbackGroup(int size)
    : size_(size),
      mailbox_(static_cast<size_t>(size), std::vector<std::vector<uint8_t>>(size)),
      posted_(static_cast<size_t>(size)),
      errors_(static_cast<size_t>(size)) {
  rank_threads_.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) rank_threads_.emplace_back([this, r] { rank_thread(r); });
}

LoopbackGroup::~LoopbackGroup() {
  {
    std::lock_guard<std::mutex> lock(job_mutex_);
    stopping_ = true;
  }
  job_posted_.notify_all();
  for (std::thread& t : rank_threads_) t.join();
}

TransportPtr LoopbackGroup::transport(int rank) {
  MOECORE_CHECK_INDEX(rank >= 0 && rank < size_, "LoopbackGroup.transport: rank must be in [0, ",
                      size_, "), got ", rank);
  return std::make_shared<LoopbackTransport>(shared_from_this(), rank);
}

void LoopbackGroup::poison(int failed_rank, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (poisoned_) return;  // the first failure is the cause; later ones are its consequences
    poisoned_ = true;
    poison_message_ =
        str_cat("expert-parallel group aborted: rank ", failed_rank, " failed: ", what);
  }
  cv_.notify_all();
}

void LoopbackGroup::throw_if_poisoned() const {
  if (poisoned_) throw CollectiveAborted(poison_message_);
}

void LoopbackGroup::arrive_and_wait(std::unique_lock<std::mutex>& lock) {
  throw_if_poisoned();
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return poisoned_ || generation_ != generation; });
  throw_if_poisoned();
}

std::vector<std::vector<uint8_t>> LoopbackGroup::exchange(int rank,
                                                          std::vector<std::vector<uint8_t>> send) {
  std::unique_lock<std::mutex> lock(mutex_);
  mailbox_[rank] = std::move(send);
  arrive_and_wait(lock);
  std::vector<std::vector<uint8_t>> recv(static_cast<size_t>(size_));
  for (int s = 0; s < size_; ++s) recv[s] = mailbox_[s][rank];
  arrive_and_wait(lock);
  return recv;
}

void LoopbackGroup::exchange_into(int rank, const uint8_t* send, const int64_t* send_bytes,
                                  uint8_t* recv, int64_t* recv_bytes, int64_t block_bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  posted_[rank] = {send, send_bytes, block_bytes};
  arrive_and_wait(lock);
  // Every peer's send buffer stays untouched until the second barrier, so the copies need no lock.
  lock.unlock();
  std::exception_ptr error;
  try {
    for (int s = 0; s < size_; ++s) {
      const Posted& p = posted_[s];
      MOECORE_CHECK(p.block_bytes == block_bytes, "Transport.all_to_all_into: rank ", rank,
                    " passed block_bytes ", block_bytes, " but rank ", s, " passed ",
                    p.block_bytes);
      const int64_t n = p.send_bytes[rank];
      std::memcpy(recv + s * block_bytes, p.send + rank * block_bytes, static_cast<size_t>(n));
      recv_bytes[s] = n;
    }
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  if (error) std::rethrow_exception(error);  // the run poisons the group; peers do not wait
  arrive_and_wait(lock);
}

void LoopbackGroup::rank_thread(int rank) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(job_mutex_);
    job_posted_.wait(lock, [&] { return stopping_ || job_generation_ != seen; });
    if (stopping_) return;
    seen = job_generation_;
    const std::function<void(int)>& fn = *job_;
    lock.unlock();
    try {
      fn(rank);
    } catch (const std::exception& e) {
      errors_[rank] = std::current_exception();
      poison(rank, e.what());
    } catch (...) {
      errors_[rank] = std::current_exception();
      poison(rank, "unknown exception");
    }
    lock.lock();
    if (--ranks_running_ == 0) job_done_.notify_all();
  }
}

void LoopbackGroup::run(const std::function<void(int rank)>& fn) {
  std::lock_guard<std::mutex> one_run(run_mutex_);
  {
    std::unique_lock<std::mutex> lock(job_mutex_);
    for (std::exception_ptr& e : errors_) e = nullptr;
    job_ = &fn;
    ranks_running_ = size_;
    ++job_generation_;
    job_posted_.notify_all();
    job_done_.wait(lock, [&] { return ranks_running_ == 0; });
    job_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);  // no rank is inside a collective now
    poisoned_ = false;
    arrived_ = 0;
    for (auto& boxes : mailbox_) boxes.assign(static_cast<size_t>(size_), {});
  }
  std::exception_ptr consequence;
  for (const std::exception_ptr& e : errors_) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CollectiveAborted&) {
      if (!consequence) consequence = e;
    } catch (...) {
      throw;  // the lowest-ranked original failure
    }
  }
  if (consequence) std::rethrow_exception(consequence);
}

}  // namespace moecore
