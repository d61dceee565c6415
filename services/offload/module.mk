# services/offload/: ballastd. Everything but main.c goes into
# libballast_offload.a so that tests can drive the pieces directly.

OFFLOAD_SRCS := $(filter-out services/offload/main.c,$(wildcard services/offload/*.c))
OFFLOAD_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(OFFLOAD_SRCS))
OFFLOAD_LIB  := $(BUILD)/lib/libballast_offload.a

$(OFFLOAD_LIB): $(OFFLOAD_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

LIBS := $(OFFLOAD_LIB) $(LIBS)
ifneq ($(wildcard services/offload/main.c),)
BINS += $(BUILD)/bin/ballastd
endif

$(BUILD)/bin/ballastd: $(BUILD)/obj/services/offload/main.o $(LIBS)
	$(LINK)
