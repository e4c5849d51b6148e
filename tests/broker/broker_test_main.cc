// main() of the tests that need a real RabbitMQ: one broker for the whole
// binary (its startup takes seconds), started before the first test and
// stopped after the last.
#include <gtest/gtest.h>

#include "broker_fixture.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new postspool::testing::BrokerEnvironment);
  return RUN_ALL_TESTS();
}
