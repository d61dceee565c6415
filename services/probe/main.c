/* main.c: ballast-probe, a gRPC health probe for ballast services.
 *
 * Asks one server grpc.health.v1.Health/Check and exits 0 when it answers
 * SERVING, 1 when it answers anything else or cannot be reached (with a
 * line saying which), 2 on bad flags. Used as the HEALTHCHECK of the
 * ballastd image and by docker/docker-compose.yml, so that "healthy" means
 * the service answers RPCs on the socket workers use, not merely that the
 * process exists. Kubernetes probes the TCP health port natively instead.
 * See docs/deploy.md. */
#include <stdio.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "options.h"
#include "rpc.h"

static const char *o_addr, *o_service;
static double o_timeout;
static bool o_quiet;

static const opt_t opts[] = {
    { "addr", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL,
      "server address: unix:/path or host:port (e.g. ballastd's --health-port)", &o_addr },
    { "service", OPT_STRING, "", 0, 0, NULL, "service name to ask about (\"\" = the whole server)", &o_service },
    { "timeout", OPT_DURATION, "3s", 0.01, 3600, NULL, "how long to wait for the answer", &o_timeout },
    { "quiet", OPT_BOOL, "false", 0, 0, NULL, "print nothing when serving", &o_quiet },
};
#define NOPTS (sizeof opts / sizeof opts[0])

static const char *status_name(int st) {
    switch (st) {
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING: return "SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING: return "NOT_SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN: return "SERVICE_UNKNOWN";
    default: return "UNKNOWN";
    }
}

int main(int argc, char **argv) {
    log_init("ballast-probe", -1);
    opt_set_env_prefix("BALLAST_PROBE_");
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, NOPTS, argc, argv, NULL, 0, &npos,
                       "usage: ballast-probe [--addr unix:/path | host:port] [--service NAME] [--timeout 3s]\n"
                       "Exit 0 when the server answers grpc.health.v1 SERVING, 1 otherwise.",
                       err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ballast-probe: %s\n", err); return 2; }
    if (!o_addr || !o_addr[0]) { fprintf(stderr, "ballast-probe: --addr is empty: give unix:/path or host:port\n"); return 2; }

    char rerr[RPC_ERR_LEN];
    rpc_client_t *c = rpc_client_open(o_addr, NULL, rerr, sizeof rerr);
    if (!c) { fprintf(stderr, "ballast-probe: %s\n", rerr); return 1; }
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(o_service ? o_service : "");
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    char msg[512];
    grpc_status_code st = rpc_call(c, "/grpc.health.v1.Health/Check", (ProtobufCMessage *)&req,
                                   &grpc__health__v1__health_check_response__descriptor, (ProtobufCMessage **)&r,
                                   (int64_t)(o_timeout * 1000), false, msg, sizeof msg);
    if (st != GRPC_STATUS_OK) {
        fprintf(stderr, "ballast-probe: %s: not healthy: %s\n", o_addr, msg);
        rpc_client_close(c);
        return 1;
    }
    int serving = r->status;
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    rpc_client_close(c);
    if (serving != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
        fprintf(stderr, "ballast-probe: %s%s%s answers %s\n", o_addr, o_service[0] ? " service " : "",
                o_service, status_name(serving));
        return 1;
    }
    if (!o_quiet) printf("%s: SERVING\n", o_addr);
    return 0;
}
