// The public PageStore (include/kvstrand/page_store.hpp): the reactor's
// PageStore behind a boundary that names no Boost type.
#include <kvstrand/page_store.hpp>

#include "data_path/page_store.hpp"

namespace kvstrand {

struct PageStore::Impl {
  explicit Impl(PageStoreOptions o) : store(std::move(o)) {}
  data_path::PageStore store;
};

PageStore::PageStore(PageStoreOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
PageStore::~PageStore() = default;

std::uint32_t PageStore::register_layout(const Registration& registration) {
  return impl_->store.register_layout(registration);
}
std::size_t PageStore::exists(std::uint32_t registration, std::span<const kv::ChunkKey> keys, bool keep_lease) {
  return impl_->store.exists(registration, keys, keep_lease);
}
std::size_t PageStore::get(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                           std::span<const std::uint32_t> pages) {
  return impl_->store.get(registration, keys, pages);
}
std::vector<bool> PageStore::set(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                                 std::span<const std::uint32_t> pages) {
  return impl_->store.set(registration, keys, pages);
}
std::uint64_t PageStore::invalidate(std::uint32_t registration) { return impl_->store.invalidate(registration); }
PageStoreStats PageStore::stats() const { return impl_->store.stats(); }
void PageStore::close() { impl_->store.close(); }

}  // namespace kvstrand
