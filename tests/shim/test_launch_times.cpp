// LaunchTimes: launch durations by index in the step, from activity records
// matched by correlation id (shim/src/launch_times.h).
#include <gtest/gtest.h>

#include <thread>

#include "launch_times.h"

using spillway::LaunchTimes;

TEST(LaunchTimes, ARecordTimesTheLaunchItsCorrelationIdNamed) {
  LaunchTimes t;
  t.note(101, 0);
  t.note(102, 1);
  t.note(103, 2);
  t.on_record(102, 1000, 4000);    // launch 1: 3 us
  t.on_record(101, 5000, 6000);    // launch 0: 1 us, delivered later
  t.on_record(999, 0, 1'000'000);  // no launch of ours: ignored
  EXPECT_EQ(2u, t.measured());
  // Launch 2 and 3 were not timed: the median of those that were (3 us, the
  // upper of two), and the fallback only when none was.
  EXPECT_EQ(std::vector<uint64_t>({1000, 3000, 3000, 3000}), t.durations(4, 7));
  EXPECT_EQ(std::vector<uint64_t>({7, 7}), LaunchTimes().durations(2, 7));
  // A correlation id is matched once: a second record for it changes nothing.
  t.on_record(101, 0, 9000);
  EXPECT_EQ(1000u, t.durations(1, 7)[0]);
  // The next step's launch 0 replaces the last one's.
  t.note(201, 0);
  t.on_record(201, 0, 2000);
  EXPECT_EQ(2000u, t.durations(1, 7)[0]);
}

// Ids wait in a bounded table: a record that comes after kWaiting more
// launches were noted finds its slot taken by a later id and is dropped.
TEST(LaunchTimes, ARecordTooLateIsDroppedNotMisattributed) {
  LaunchTimes t;
  t.note(7, 0);
  t.note(7 + LaunchTimes::kWaiting, 1);  // the same slot
  t.on_record(7, 0, 500);
  EXPECT_EQ(0u, t.measured());
  t.on_record(7 + LaunchTimes::kWaiting, 0, 800);
  EXPECT_EQ(800u, t.durations(2, 1)[1]);
}

TEST(LaunchTimes, OutOfRangeAndZeroIdsAreIgnored) {
  LaunchTimes t;
  t.note(0, 0);  // no correlation id (work spillway reports itself)
  t.note(5, LaunchTimes::kMaxLaunches);
  t.on_record(0, 0, 100);
  t.on_record(5, 0, 100);
  EXPECT_EQ(0u, t.measured());
}

// The job's threads note while the activity reader's thread delivers.
TEST(LaunchTimes, NotesAndRecordsFromTwoThreads) {
  LaunchTimes t;
  constexpr uint32_t kN = 20000;
  std::thread reader([&] {
    for (uint32_t i = 1; i <= kN; ++i) t.on_record(i, 0, 10);
  });
  for (uint32_t i = 1; i <= kN; ++i) t.note(i, i % 100);
  reader.join();
  for (uint32_t i = 1; i <= kN; ++i)
    t.on_record(i, 0, 10);  // those noted after their record went by
  EXPECT_EQ(100u, t.measured());
}
