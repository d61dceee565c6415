# services/offload/: ballastd. Everything but main.c goes into
# libballastd.a so that tests can drive the pieces directly.

OFFLOAD_SRCS := $(filter-out services/offload/main.c,$(wildcard services/offload/*.c))
OFFLOAD_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(OFFLOAD_SRCS))
OFFLOAD_LIB  := $(BUILD)/lib/libballastd.a

$(OFFLOAD_LIB): $(OFFLOAD_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

BINS += $(BUILD)/bin/ballastd

# ballastd is its service code and common, nothing of workers/; its malloc
# is jemalloc's (Makefile, JEMALLOC_LIBS).
$(BUILD)/bin/ballastd: LINK_LIBS = $(OFFLOAD_LIB) $(COMMON_LIB)
$(BUILD)/bin/ballastd: MALLOC_LIBS = $(JEMALLOC_LIBS)
$(BUILD)/bin/ballastd: $(BUILD)/obj/services/offload/main.o $(OFFLOAD_LIB) $(COMMON_LIB)
	$(LINK)
