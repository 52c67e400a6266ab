// A product's tiles shared out among the threads that run it, so that a slow thread does not hold the others up.
// Each thread starts on an even share of its own, front to back, a few tiles at a time; once its share is done it
// takes tiles from the back of the share with the most left. With even, fixed shares (what at::parallel_for gives)
// one of the two threads of a VM finished its shares 0.3 to 2.3 ms a token later than the other (Qwen3-1.7B shape,
// one row, summed over the products), and the other waited for it at the end of every product.
//
// Which thread runs a tile changes nothing in its outputs (every tile is computed alone, q4_tiles.h).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace q4 {

class TileShares {
 public:
  // Tiles [0, count) among `threads` (≥ 1); a thread takes `chunk` of its own at a time, `steal` of another's.
  TileShares(int64_t count, int threads, int64_t chunk, int64_t steal)
      : threads_(std::max(threads, 1)), chunk_(std::max<int64_t>(chunk, 1)), steal_(std::max<int64_t>(steal, 1)),
        shares_(new Share[threads_]) {
    for (int t = 0; t < threads_; ++t) shares_[t].range.store(pack(count * t / threads_, count * (t + 1) / threads_));
  }

  // The next run of tiles [begin, end) for thread `me`: its own share first, then the others'. False when none are left.
  bool next(int me, int64_t& begin, int64_t& end) {
    if (take_front(shares_[me % threads_], begin, end)) return true;
    while (true) {
      Share* most = nullptr;
      int64_t most_left = 0;
      for (int t = 0; t < threads_; ++t) {
        const int64_t left = back_of(shares_[t].range.load()) - front_of(shares_[t].range.load());
        if (left > most_left) most = &shares_[t], most_left = left;
      }
      if (!most) return false;
      if (take_back(*most, begin, end)) return true;
    }
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> range;  // front in the low 32 bits, back in the high: the tiles [front, back) left
  };

  static uint64_t pack(int64_t front, int64_t back) { return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32; }
  static int64_t front_of(uint64_t range) { return static_cast<int64_t>(range & 0xFFFFFFFFu); }
  static int64_t back_of(uint64_t range) { return static_cast<int64_t>(range >> 32); }

  bool take_front(Share& share, int64_t& begin, int64_t& end) {
    uint64_t range = share.range.load();
    do {
      begin = front_of(range), end = std::min(back_of(range), begin + chunk_);
      if (begin >= end) return false;
    } while (!share.range.compare_exchange_weak(range, pack(end, back_of(range))));
    return true;
  }

  bool take_back(Share& share, int64_t& begin, int64_t& end) {
    uint64_t range = share.range.load();
    do {
      end = back_of(range), begin = std::max(front_of(range), end - steal_);
      if (begin >= end) return false;
    } while (!share.range.compare_exchange_weak(range, pack(front_of(range), begin)));
    return true;
  }

  int threads_;
  int64_t chunk_, steal_;
  std::unique_ptr<Share[]> shares_;
};

}  // namespace q4
