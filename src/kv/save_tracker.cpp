#include <kvstrand/save_tracker.hpp>

#include <algorithm>

namespace kvstrand::kv {

void SaveTracker::note_stored(std::uint32_t tokens) { frontier_ = std::max(frontier_, floor_to(tokens, chunk_)); }

void SaveTracker::load_decided(TokenRange load) {
  tier_attempt_spent_ = true;
  loading_ = true;
  if (!floor_) floor_ = load.begin;  // once: a later decision must not raise it
  frontier_ = std::max(frontier_, load.end);
}

void SaveTracker::load_settled(LoadOutcome outcome) {
  loading_ = false;
  if (reopens_saves(outcome) && floor_) frontier_ = std::min(frontier_, floor_to(*floor_, chunk_));
}

std::optional<TokenRange> SaveTracker::next_save(std::uint32_t committed_tokens) {
  if (in_flight_ || loading_) return std::nullopt;
  const TokenRange r{frontier_, floor_to(committed_tokens, chunk_)};
  if (r.empty()) return std::nullopt;
  in_flight_ = r;
  return r;
}

void SaveTracker::save_settled(bool ok) {
  if (!in_flight_) return;
  if (ok) frontier_ = std::max(frontier_, in_flight_->end);
  in_flight_.reset();
}

void SaveTracker::abandon(std::uint32_t end) { frontier_ = std::max(frontier_, end); }

}  // namespace kvstrand::kv
