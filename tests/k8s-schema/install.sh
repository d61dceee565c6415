#!/bin/sh
# tests/k8s-schema/install.sh: install the npm packages of the offline
# Kubernetes schema check (package.json / package-lock.json here) into
# tests/k8s-schema/node_modules, for `make deps`. Does nothing when they are
# already installed from the current lock file. Never fails the build: when
# node/npm are missing or the registry cannot be reached, it says so and
# leaves the reason in .install-status, and tests/integration/k8s_manifests.sh
# skips the schema check with that reason.
cd "$(dirname "$0")" || exit 0
if [ -f node_modules/kubernetes-models/package.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
    exit 0
fi
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
    echo "node and npm are not installed (Debian packages nodejs, npm)" > .install-status
    echo "deps: k8s schema check: $(cat .install-status); it will be skipped" >&2
    exit 0
fi
echo "deps: npm ci in tests/k8s-schema (kubernetes-models, for the offline schema check)"
if timeout 300 npm ci --no-audit --no-fund --loglevel=error > .install.log 2>&1; then
    rm -f .install-status
else
    echo "npm ci failed (no registry?): $(grep -m1 -i 'err' .install.log | cut -c1-200)" > .install-status
    echo "deps: k8s schema check: $(cat .install-status); it will be skipped" >&2
fi
exit 0
