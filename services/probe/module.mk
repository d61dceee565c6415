# services/probe/: ballast-probe, the health probe the container images use
# (Docker HEALTHCHECK, compose healthcheck). One program, main.c.

BINS += $(BUILD)/bin/ballast-probe

$(BUILD)/bin/ballast-probe: LINK_LIBS = $(COMMON_LIB)
$(BUILD)/bin/ballast-probe: $(BUILD)/obj/services/probe/main.o $(COMMON_LIB)
	$(LINK)
