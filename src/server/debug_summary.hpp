// What kvstrand-server's /debug page shows a person above its tables (the
// script common::add_debug_page runs after each refresh): the hit rate and
// the fill as percentages, charts of the last minutes (hit rate; chunks
// loaded, saved and evicted a second) drawn from /debug/history, and the
// levels (arena, disk, L2) side by side with their health. Plain
// JavaScript and inline SVG: the page still loads nothing else.
#pragma once

#include <string>

namespace kvstrand::server {

const std::string& debug_summary_script();

}  // namespace kvstrand::server
