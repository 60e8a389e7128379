#pragma once
/// \file
/// `shared_blocks`: small objects handed out of blocks, each object sharing its
/// block's ownership (std::shared_ptr's aliasing constructor), so that a trace makes
/// one allocation per block rather than one per traced op (its symbols, its captured
/// scalars).

#include <cstddef>
#include <memory>
#include <utility>

namespace kiln::detail {

/// Objects of type `T` made `BlockSize` to an allocation; a block lives while any of
/// its objects is held.
/// \code
/// kiln::detail::shared_blocks<int, 32> ints;
/// std::shared_ptr<const int> one = ints.make(1);  // its block lives while `one` does
/// \endcode
template <class T, std::size_t BlockSize>
class shared_blocks {
 public:
  shared_blocks() = default;
  // A copy starts blocks of its own: two owners (two graphs, perhaps on two
  // threads) never fill one block.
  shared_blocks(const shared_blocks&) noexcept {}
  shared_blocks& operator=(const shared_blocks&) noexcept { return *this; }
  shared_blocks(shared_blocks&&) noexcept = default;
  shared_blocks& operator=(shared_blocks&&) noexcept = default;
  ~shared_blocks() = default;

  /// A new object holding `value`, owned with the rest of its block.
  std::shared_ptr<const T> make(T value) {
    if (!block_ || used_ == BlockSize) {
      block_ = std::make_shared<T[]>(BlockSize);
      used_ = 0;
    }
    T& made = block_[used_++];
    made = std::move(value);
    return std::shared_ptr<const T>(block_, &made);
  }

 private:
  std::shared_ptr<T[]> block_;  ///< the block make() hands objects out of
  std::size_t used_ = 0;
};

}  // namespace kiln::detail
