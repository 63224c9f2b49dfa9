// What most of kvstrand's sources parse before their own code: the core of
// Asio's coroutines, spdlog and the standard library's containers. The test
// builds (`make test`, the sanitizers') compile it once as the libraries'
// precompiled header (-DKVSTRAND_PCH=ON, CMakeLists.txt); every other build
// leaves it out, so a file that forgets an include still fails to compile
// there.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
