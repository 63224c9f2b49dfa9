#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

namespace kvstrand::engine {

namespace {
double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}
double avg(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
}  // namespace

ArmSummary summarize(const std::string& name, const RunStats& st, const CostModel& cost) {
  ArmSummary a;
  a.name = name;
  a.seconds = st.end_at - st.warm_at;
  std::vector<double> ttft, itl;
  // Computed tokens include work a preemption threw away.
  double hbm = 0, tier = 0, computed = 0, prompt = 0, ceiling = 0;
  for (const auto& r : st.done) {
    if (r.finish <= st.warm_at) continue;
    ++a.requests;
    ttft.push_back((r.first_token - r.arrival) * 1e3);
    for (double g : r.itl) itl.push_back(g * 1e3);
    hbm += r.hbm_tokens;
    tier += r.tier_tokens;
    computed += r.computed_tokens;
    prompt += r.prompt_tokens;
    ceiling += r.ceiling;
  }
  if (prompt > 0) a.ceiling_share = 100 * ceiling / prompt;
  const double n = static_cast<double>(std::max<std::uint64_t>(a.requests, 1));
  a.req_per_s = a.seconds > 0 ? static_cast<double>(a.requests) / a.seconds : 0;
  a.ttft_avg = avg(ttft);
  a.ttft_p50 = pct(ttft, 0.5);
  a.ttft_p99 = pct(ttft, 0.99);
  a.itl_avg = avg(itl);
  a.itl_p50 = pct(itl, 0.5);
  a.itl_p99 = pct(itl, 0.99);
  a.computed_per_request = computed / n;
  a.theoretical_req_per_s = cost.req_per_s(a.computed_per_request);
  const double total = hbm + tier + computed;
  if (total > 0) {
    a.hbm_share = 100 * hbm / total;
    a.tier_share = 100 * tier / total;
    a.recomputed_share = 100 * computed / total;
  }
  a.loads = st.loads;
  a.loads_from_zero = st.loads_from_zero;
  a.loads_failed = st.loads_failed;
  a.saves = st.saves;
  a.preemptions = st.preemptions;
  a.resumed = st.resumed;
  a.verified = st.verified;
  a.mismatches = st.mismatches;
  return a;
}

void print_table(const std::vector<ArmSummary>& arms) {
  std::printf("\n%-14s %7s %6s | %21s | %21s | %20s | %10s %6s\n", "arm", "req/s", "reqs", "TTFT ms avg/p50/p99",
              "ITL ms avg/p50/p99", "HBM/tier/computed %", "theory r/s", "ratio");
  for (const auto& a : arms)
    std::printf("%-14s %7.2f %6llu | %6.0f %6.0f %7.0f | %6.1f %6.1f %7.1f | %5.1f / %5.1f / %5.1f | %10.2f %6.2f\n",
                a.name.c_str(), a.req_per_s, static_cast<unsigned long long>(a.requests), a.ttft_avg, a.ttft_p50,
                a.ttft_p99, a.itl_avg, a.itl_p50, a.itl_p99, a.hbm_share, a.tier_share, a.recomputed_share,
                a.theoretical_req_per_s, a.theoretical_req_per_s > 0 ? a.req_per_s / a.theoretical_req_per_s : 0);
  for (const auto& a : arms)
    if (a.loads > 0)
      std::printf("%-14s hit %.1f%% of prompt tokens (ceiling %.1f%%); loads %llu (from token 0: %llu, failed %llu), "
                  "saves %llu, preemptions %llu\n",
                  a.name.c_str(), a.hbm_share + a.tier_share, a.ceiling_share, static_cast<unsigned long long>(a.loads),
                  static_cast<unsigned long long>(a.loads_from_zero), static_cast<unsigned long long>(a.loads_failed),
                  static_cast<unsigned long long>(a.saves), static_cast<unsigned long long>(a.preemptions));
}

std::string to_json(const std::vector<ArmSummary>& arms, const std::string& config) {
  std::ostringstream o;
  o << "{\n  \"config\": " << config << ",\n  \"arms\": [\n";
  for (std::size_t i = 0; i < arms.size(); ++i) {
    const auto& a = arms[i];
    o << "    {\"name\": \"" << a.name << "\", \"requests\": " << a.requests << ", \"seconds\": " << a.seconds
      << ", \"req_per_s\": " << a.req_per_s << ", \"ttft_ms\": {\"avg\": " << a.ttft_avg << ", \"p50\": " << a.ttft_p50
      << ", \"p99\": " << a.ttft_p99 << "}, \"itl_ms\": {\"avg\": " << a.itl_avg << ", \"p50\": " << a.itl_p50
      << ", \"p99\": " << a.itl_p99 << "}, \"prompt_tokens_pct\": {\"hbm\": " << a.hbm_share
      << ", \"tier\": " << a.tier_share << ", \"computed\": " << a.recomputed_share << ", \"ceiling\": " << a.ceiling_share
      << "}, \"computed_per_request\": " << a.computed_per_request
      << ", \"theoretical_req_per_s\": " << a.theoretical_req_per_s << ", \"loads\": " << a.loads
      << ", \"loads_from_zero\": " << a.loads_from_zero << ", \"loads_failed\": " << a.loads_failed
      << ", \"saves\": " << a.saves << ", \"preemptions\": " << a.preemptions << ", \"resumed\": " << a.resumed
      << ", \"verified\": " << a.verified << ", \"mismatches\": " << a.mismatches << "}"
      << (i + 1 < arms.size() ? "," : "") << "\n";
  }
  o << "  ]\n}\n";
  return o.str();
}

std::string plot(const std::vector<ArmSummary>& arms, const std::string& dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return "no PNG: gnuplot is not installed";
  const std::string data = dir + "/engine-demo.dat", script = dir + "/engine-demo.gp", png = dir + "/engine-demo.png";
  {
    std::ofstream d(data);
    for (const auto& a : arms)
      d << '"' << a.name << "\" " << a.req_per_s << ' ' << a.theoretical_req_per_s << ' ' << a.ttft_avg << ' '
        << a.itl_avg << '\n';
    std::ofstream g(script);
    g << "set terminal png size 1200,460\nset output '" << png << "'\nset multiplot layout 1,2\n"
      << "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.8\nset grid ytics\nset xtics rotate by -30\n"
      << "set title 'throughput (modeled)'\nset ylabel 'req/s'\nset yrange [0:*]\n"
      << "plot '" << data << "' using 2:xtic(1) title 'measured', '' using 3 title 'cost model'\n"
      << "set title 'latency'\nset ylabel 'ms'\n"
      << "plot '" << data << "' using 4:xtic(1) title 'TTFT avg', '' using 5 title 'ITL avg'\n"
      << "unset multiplot\n";
  }
  if (std::system(("gnuplot '" + script + "' 2>/dev/null").c_str()) != 0) return "no PNG: gnuplot failed";
  return png;
}

}  // namespace kvstrand::engine
