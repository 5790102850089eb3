// The physical-core count and CPU model read from /proc/cpuinfo text (machine.h), on
// hand-written samples: hyper-threaded cores, two sockets reusing core ids, and files
// that do not say which core a processor is on.
#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "util/machine.h"

using namespace barellm;

namespace {

// One /proc/cpuinfo processor block, in the kernel's "key<tab>: value" layout.
std::string processor(int number, int socket, int core) {
    return "processor\t: " + std::to_string(number) +
           "\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ "
           "2.00GHz\nphysical id\t: " +
           std::to_string(socket) + "\nsiblings\t: 4\ncore id\t\t: " + std::to_string(core) +
           "\ncpu cores\t: 2\nflags\t\t: fpu avx2 fma\n\n";
}

}  // namespace

TEST_CASE("two hardware threads of one core count as one core") {
    // Linux numbers the first thread of every core before the second ones.
    const std::string text =
        processor(0, 0, 0) + processor(1, 0, 1) + processor(2, 0, 0) + processor(3, 0, 1);
    CHECK(count_physical_cores(text) == 2);
}

TEST_CASE("the same core id on two sockets is two cores") {
    std::string text;
    for (int cpu = 0; cpu < 12; ++cpu) text += processor(cpu, cpu % 2, (cpu / 2) % 3);
    CHECK(count_physical_cores(text) == 6);  // 2 sockets x 3 cores, each with 2 threads
}

TEST_CASE("one processor per core counts every processor") {
    std::string text;
    for (int cpu = 0; cpu < 5; ++cpu) text += processor(cpu, 0, cpu);
    CHECK(count_physical_cores(text) == 5);
}

TEST_CASE("a processor without a core id leaves the count unknown") {
    const std::string without_ids = "processor\t: 0\nmodel name\t: ARMv8 Processor\n\n";
    CHECK(count_physical_cores(processor(0, 0, 0) + without_ids) == 0);
    CHECK(count_physical_cores(without_ids) == 0);
    CHECK(count_physical_cores("") == 0);
}

TEST_CASE("the model name is the first processor's, trimmed") {
    CHECK(cpu_model_name(processor(0, 0, 0) + processor(1, 0, 1)) ==
          "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz");
    CHECK(cpu_model_name("processor\t: 0\ncore id\t: 0\n") == "");
}

TEST_CASE("this machine has at least one physical core, at most its logical CPUs") {
    const int cores = physical_core_count();
    CHECK(cores >= 1);
    CHECK(cores <= int(std::thread::hardware_concurrency()));
}
