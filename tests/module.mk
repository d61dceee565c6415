# tests/: Criterion unit tests (tests/unit/test_*.c), helper programs for the
# integration tests (tests/integration/*.c), benchmarks (tests/bench/*.c).
# Tests may drive any layer, so they link every library of the tree, top down,
# and run on jemalloc like the programs whose code they drive.

TEST_LIBS := $(WORKER_LIBS) $(OFFLOAD_LIB) $(RDZV_LIB) $(COMMON_LIB)

UNIT_TESTS += $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(wildcard tests/unit/test_*.c))
UNIT_TESTS += $(patsubst tests/integration/%.c,$(BUILD)/tests/integration/%,$(wildcard tests/integration/*.c))
UNIT_TESTS += $(patsubst tests/bench/%.c,$(BUILD)/tests/bench/%,$(wildcard tests/bench/*.c))

$(BUILD)/tests/%: LINK_LIBS = $(TEST_LIBS)
$(BUILD)/tests/%: MALLOC_LIBS = $(JEMALLOC_LIBS)

$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(TEST_LIBS)
	$(LINK) -lcriterion

$(BUILD)/tests/integration/%: $(BUILD)/obj/tests/integration/%.o $(TEST_LIBS)
	$(LINK)

$(BUILD)/tests/bench/%: $(BUILD)/obj/tests/bench/%.o $(TEST_LIBS)
	$(LINK)

-include tests/gpu/module.mk
