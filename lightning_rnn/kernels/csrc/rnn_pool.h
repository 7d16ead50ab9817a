// Big CPU buffers of the kernels (the forward's x W_ih^T, which become the gates saved
// for backward; the backward's scratch), kept mapped between calls.
//
// glibc hands large blocks back to the system when they are freed (munmap, or a trim of
// the heap's top) and maps them again, zero-filled page by page on first touch, when the
// next call asks; whether it does depends on what else the process allocated. A training
// loop then faults the layer's buffers in anew at every step, hundreds to thousands of
// page faults, a cost of the order of a small layer's pointwise work; with the pool a
// step takes none (the benchmark's `alone` section counts them: docs/benchmarks.md).
// BufferPool::empty serves requests of at
// least kMinBytes from blocks that tensors of earlier calls gave back (a block returns
// to the pool when the last tensor using its memory dies; none of them reaches the user),
// and keeps at most capacity() bytes idle: 256 MiB unless LIGHTNING_RNN_POOL_MB says
// otherwise (0: no pool); set_capacity (the extension's set_pool_capacity) changes it and
// frees what no longer fits. Blocks are sized in classes of 1/8 of a power of two, so that
// batches of varying lengths find them too.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace lrnn {

class BufferPool {
 public:
  static constexpr int64_t kMinBytes = int64_t(1) << 18;  // smaller requests: at::empty

  // An uninitialized tensor of `sizes` and `opt`: from the pool on CPU, else at::empty.
  static at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& opt) {
    const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(opt.dtype().itemsize());
    BufferPool& pool = instance();
    if (opt.device().type() != c10::DeviceType::CPU || bytes < kMinBytes || pool.capacity() == 0) {
      return at::empty(sizes, opt);
    }
    const int64_t size = size_class(bytes);
    void* data = pool.take(size);
    return at::from_blob(data, sizes, [size](void* p) { instance().give_back(p, size); }, opt);
  }

  static int64_t idle_bytes() {
    BufferPool& pool = instance();
    std::lock_guard<std::mutex> lock(pool.m_);
    return pool.idle_bytes_;
  }

  static int64_t get_capacity() { return instance().capacity(); }

  // At most `bytes` idle from now on; idle blocks beyond it are freed now.
  static void set_capacity(int64_t bytes) {
    BufferPool& pool = instance();
    std::vector<std::pair<int64_t, void*>> freed;
    {
      std::lock_guard<std::mutex> lock(pool.m_);
      pool.capacity_ = std::max<int64_t>(0, bytes);
      while (pool.idle_bytes_ > pool.capacity_) {
        freed.push_back(pool.idle_.back());
        pool.idle_bytes_ -= pool.idle_.back().first;
        pool.idle_.pop_back();
      }
    }
    for (auto& block : freed) c10::free_cpu(block.second);
  }

  // `bytes` rounded up to its class: a multiple of 1/8 of the power of two below it.
  static int64_t size_class(int64_t bytes) {
    int64_t step = 1;
    while (step * 16 <= bytes) step *= 2;  // step = 2^floor(log2(bytes)) / 8
    return (bytes + step - 1) / step * step;
  }

 private:
  BufferPool() {
    const char* env = std::getenv("LIGHTNING_RNN_POOL_MB");
    capacity_ = (env && env[0]) ? std::max<int64_t>(0, std::atoll(env)) << 20 : int64_t(256) << 20;
  }

  // Never destroyed: tensors holding its blocks may die after static destructors run.
  static BufferPool& instance() {
    static BufferPool* pool = new BufferPool();
    return *pool;
  }

  int64_t capacity() {
    std::lock_guard<std::mutex> lock(m_);
    return capacity_;
  }

  void* take(int64_t size) {
    {
      std::lock_guard<std::mutex> lock(m_);
      for (size_t i = idle_.size(); i-- > 0;) {  // the most recently given back first
        if (idle_[i].first == size) {
          void* data = idle_[i].second;
          idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
          idle_bytes_ -= size;
          return data;
        }
      }
    }
    return c10::alloc_cpu(static_cast<size_t>(size));
  }

  void give_back(void* data, int64_t size) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (idle_bytes_ + size <= capacity_) {
        idle_.emplace_back(size, data);
        idle_bytes_ += size;
        return;
      }
    }
    c10::free_cpu(data);
  }

  std::mutex m_;
  std::vector<std::pair<int64_t, void*>> idle_;  // (size, block)
  int64_t idle_bytes_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace lrnn
