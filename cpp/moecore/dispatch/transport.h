// The communication interface of the expert-parallel dispatchers, and the in-process loopback
// that runs R ranks as threads of one process (tests, CI). The dispatchers talk to peers only
// through Transport, so an MPI implementation can replace the loopback without touching them:
// nothing here hands out shared memory, every payload is copied bytes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moecore/core/error.h"

namespace moecore {

/// One rank's view of a group of `size()` ranks. Every collective must be called by all ranks
/// in the same order (as with MPI). Byte buffers are indexed by peer rank.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// send_counts[d]: what this rank will send to rank d → result[s]: what rank s sends here.
  virtual std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts) = 0;
  /// send[d]: the bytes for rank d → result[s]: the bytes rank s sent here.
  virtual std::vector<std::vector<uint8_t>> all_to_all_v(
      const std::vector<std::vector<uint8_t>>& send) = 0;
  /// The capturable all-to-all over fixed-capacity buffers (DeepEP low-latency's and FlashInfer
  /// MoeAlltoAll's), with no allocation: `send` holds size() blocks of block_bytes, block d for
  /// rank d with its first send_bytes[d] bytes used; block s of `recv` gets what rank s sent
  /// here, recv_bytes[s] its length. Every rank passes the same block_bytes.
  virtual void all_to_all_into(const uint8_t* send, const int64_t* send_bytes, uint8_t* recv,
                               int64_t* recv_bytes, int64_t block_bytes) = 0;
  virtual void barrier() = 0;
};
using TransportPtr = std::shared_ptr<Transport>;

/// The buffers of a prepared (capturable) round's all-to-alls, allocated once: a block of
/// block_bytes per peer each way. clear(), append records to the peers' blocks, exchange(), then
/// read what each peer sent; nothing allocates after construction.
class FixedExchange {
 public:
  FixedExchange(TransportPtr transport, int64_t block_bytes);
  /// Empties every send block.
  void clear();
  /// Room for the next `bytes` of peer's send block (the block must have it).
  uint8_t* append(int64_t peer, int64_t bytes);
  /// Transport::all_to_all_into over the blocks.
  void exchange();
  const uint8_t* received(int64_t src) const { return recv_.data() + src * block_bytes_; }
  int64_t received_bytes(int64_t src) const { return recv_bytes_[src]; }

 private:
  TransportPtr transport_;
  int64_t block_bytes_;
  std::vector<uint8_t> send_, recv_;
  std::vector<int64_t> send_bytes_, recv_bytes_;
};

/// Raised by a collective of a group that a failed rank poisoned; the message names that rank.
/// Python: moecore.MoecoreError.
class CollectiveAborted : public Error {
  using Error::Error;
};

/// R loopback transports sharing one rendezvous. Results are deterministic (each rank reads
/// exactly what its peers sent). If a rank fails, poison() makes every blocked or later
/// collective raise CollectiveAborted instead of waiting forever.
class LoopbackGroup : public std::enable_shared_from_this<LoopbackGroup> {
 public:
  static std::shared_ptr<LoopbackGroup> create(int size);
  int size() const { return size_; }
  /// A transport for `rank`; it keeps the group alive.
  TransportPtr transport(int rank);
  void poison(int failed_rank, const std::string& what);
  ~LoopbackGroup();
  /// Runs fn(rank) for every rank, each on its own rank thread (started with the group, so that
  /// a run allocates nothing), and waits for all of them. If any rank throws,
  /// the group is poisoned (the others fail fast) and the lowest-ranked original exception (not
  /// a CollectiveAborted caused by it) is rethrown; once every thread has returned the group is
  /// reset, ready for the next run. Runs from several caller threads take turns. Rank threads
  /// may use the thread pool: it serializes concurrent parallel_for callers, and no collective
  /// runs inside a pool chunk, so ranks cannot deadlock on it.
  void run(const std::function<void(int rank)>& fn);

  /// The collective step behind every Transport call: rank posts one buffer per peer, and gets
  /// the buffers its peers posted for it. Two barriers bracket the read so buffers are reused
  /// safely.
  std::vector<std::vector<uint8_t>> exchange(int rank, std::vector<std::vector<uint8_t>> send);
  /// The same step over caller buffers (Transport::all_to_all_into).
  void exchange_into(int rank, const uint8_t* send, const int64_t* send_bytes, uint8_t* recv,
                     int64_t* recv_bytes, int64_t block_bytes);

 private:
  struct Posted {
    const uint8_t* send = nullptr;
    const int64_t* send_bytes = nullptr;
    int64_t block_bytes = 0;
  };
  explicit LoopbackGroup(int size);
  void arrive_and_wait(std::unique_lock<std::mutex>& lock);
  void throw_if_poisoned() const;
  void rank_thread(int rank);

  int size_;
  std::mutex run_mutex_;  // one run() at a time: concurrent runs would interleave collectives
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool poisoned_ = false;
  std::string poison_message_;
  std::vector<std::vector<std::vector<uint8_t>>> mailbox_;  // [src][dst]
  std::vector<Posted> posted_;                              // [src], exchange_into

  // The rank threads (persistent) and the run they execute.
  std::vector<std::thread> rank_threads_;
  std::mutex job_mutex_;
  std::condition_variable job_posted_, job_done_;
  const std::function<void(int rank)>* job_ = nullptr;
  uint64_t job_generation_ = 0;
  int ranks_running_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;  // [rank], of the current run
};

}  // namespace moecore
