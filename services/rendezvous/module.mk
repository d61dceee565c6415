# services/rendezvous/: the KV + barrier store (library linked into rank 0,
# and the standalone ballast-rdzv).

RDZV_SRCS := $(filter-out services/rendezvous/main.c,$(wildcard services/rendezvous/*.c))
RDZV_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(RDZV_SRCS))
RDZV_LIB  := $(BUILD)/lib/libballast_rdzv.a

$(RDZV_LIB): $(RDZV_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

BINS += $(BUILD)/bin/ballast-rdzv

# ballast-rdzv is the store and common, nothing of workers/.
$(BUILD)/bin/ballast-rdzv: LINK_LIBS = $(RDZV_LIB) $(COMMON_LIB)
$(BUILD)/bin/ballast-rdzv: $(BUILD)/obj/services/rendezvous/main.o $(RDZV_LIB) $(COMMON_LIB)
	$(LINK)
