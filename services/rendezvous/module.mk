# services/rendezvous/: the KV + barrier store (library linked into rank 0,
# and the standalone ballast-rdzv).

RDZV_SRCS := $(filter-out services/rendezvous/main.c,$(wildcard services/rendezvous/*.c))
RDZV_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(RDZV_SRCS))
RDZV_LIB  := $(BUILD)/lib/libballast_rdzv.a

$(RDZV_LIB): $(RDZV_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

LIBS := $(RDZV_LIB) $(LIBS)
ifneq ($(wildcard services/rendezvous/main.c),)
BINS += $(BUILD)/bin/ballast-rdzv
endif

# LINK names every library of the tree, including those of fragments read
# after this one (workers/): depend on all of them, not only on LIBS so far.
$(BUILD)/bin/ballast-rdzv: $(BUILD)/obj/services/rendezvous/main.o $(LIBS) $(BUILD)/lib/libballast_worker.a
	$(LINK)
