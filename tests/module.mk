# tests/: Criterion unit tests (tests/unit/test_*.c), helper programs for the
# integration tests (tests/integration/*.c), benchmarks (tests/bench/*.c).

UNIT_TESTS += $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(wildcard tests/unit/test_*.c))
UNIT_TESTS += $(patsubst tests/integration/%.c,$(BUILD)/tests/integration/%,$(wildcard tests/integration/*.c))
UNIT_TESTS += $(patsubst tests/bench/%.c,$(BUILD)/tests/bench/%,$(wildcard tests/bench/*.c))

$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(LIBS)
	$(LINK) -lcriterion

$(BUILD)/tests/integration/%: $(BUILD)/obj/tests/integration/%.o $(LIBS)
	$(LINK)

$(BUILD)/tests/bench/%: $(BUILD)/obj/tests/bench/%.o $(LIBS)
	$(LINK)

-include tests/gpu/module.mk
