# common/: the shared C library, plus the protobuf-c code generated from proto/.
# proto/X.proto becomes $(BUILD)/gen/X.pb-c.{c,h}; include it as "X.pb-c.h".

PROTOS     := $(shell find proto -name '*.proto' | sort)
GEN_SRCS   += $(patsubst proto/%.proto,$(BUILD)/gen/%.pb-c.c,$(PROTOS))
GEN_HDRS   := $(patsubst proto/%.proto,$(BUILD)/gen/%.pb-c.h,$(PROTOS))

$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	@echo "  PROTOC-C $<"
	$(Q)protoc-c --proto_path=proto --c_out=$(BUILD)/gen $<

COMMON_SRCS := $(wildcard common/*.c)
COMMON_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(COMMON_SRCS)) \
               $(patsubst $(BUILD)/gen/%.c,$(BUILD)/obj/gen/%.o,$(GEN_SRCS))

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c $(GEN_HDRS)
	@mkdir -p $(@D)
	@echo "  CC   $<"
	$(Q)$(CC) $(CFLAGS) -w -c $< -o $@

$(COMMON_LIB): $(COMMON_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^



# ballast_build_info (common/metrics.c): the git commit and the CUDA release
# are baked into metrics.o; a stamp file rebuilds it when either changes.
BALLAST_GIT_SHA  := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
BALLAST_CUDA_REL := $(if $(filter 1,$(HAVE_CUDA)),$(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'),none)
BUILD_INFO_STAMP := $(BUILD)/gen/build_info.stamp
$(shell mkdir -p $(BUILD)/gen && { [ "$$(cat $(BUILD_INFO_STAMP) 2>/dev/null)" = "$(BALLAST_GIT_SHA) $(BALLAST_CUDA_REL)" ] || echo "$(BALLAST_GIT_SHA) $(BALLAST_CUDA_REL)" > $(BUILD_INFO_STAMP); })
$(BUILD)/obj/common/metrics.o: $(BUILD_INFO_STAMP)
$(BUILD)/obj/common/metrics.o: CFLAGS += -DBALLAST_GIT_SHA='"$(BALLAST_GIT_SHA)"' -DBALLAST_CUDA_VERSION='"$(or $(BALLAST_CUDA_REL),unknown)"'
