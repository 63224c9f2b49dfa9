// What nearly every test's translation unit parses before its own code:
// Catch2's single header and the core of Asio's coroutines. Compiled once a
// build as the tests' precompiled header (tests/CMakeLists.txt), so that no
// test parses them again; a test still includes what it uses.
#pragma once

#include <catch2/catch.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>
