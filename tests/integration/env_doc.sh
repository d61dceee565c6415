#!/usr/bin/env bash
# env_doc.sh: docs/environment.md lists exactly the environment variables
# the programs read (tests/env_doc.py check), and the check catches each
# kind of mistake, planted in a copy of the tree: a variable read in code
# that the page lacks (a getenv literal; a new option), a row for a variable
# nothing reads, and a getenv of a computed name the check cannot follow.
source "$(dirname "$0")/../lib.sh"
CHK=$ROOT/tests/env_doc.py
out=$("$T_PY" "$CHK" check 2>&1)
if [ $? -eq 0 ]; then t_ok "docs/environment.md matches the sources: $out"
else t_fail "docs/environment.md matches the sources" "$out"; fi

D=$(t_tmpdir)
copy() { rm -rf "$D/t"; mkdir -p "$D/t"; cp -r "$ROOT/common" "$ROOT/services" "$ROOT/workers" "$ROOT/docs" "$D/t/"; }
# a random, never-documented name
V=BALLAST_PLANTED_$(tr -dc 'A-Z' < /dev/urandom | head -c 8)
planted() {  # NAME PATTERN: the check of the planted copy fails, saying PATTERN
    local out rc
    out=$("$T_PY" "$CHK" --root "$D/t" check 2>&1); rc=$?
    if [ $rc -ne 0 ] && echo "$out" | grep -q -- "$2"; then t_ok "$1"
    else t_fail "$1" "exit $rc: $(echo "$out" | tail -3)"; fi
}
copy
sed -i "s|^void log_init(const char \*prog, int rank) {|&\n    (void)getenv(\"$V\");|" "$D/t/common/log.c"
planted "an undocumented getenv(\"$V\") fails" "$V is read (common/log.c:[0-9]*) but docs/environment.md does not list it"
copy
S=${V#BALLAST_PLANTED_}
sed -i "s|^ *{ \"threads\", OPT_INT, \"4\"|        { \"planted-${S,,}\", OPT_BOOL, \"false\", 0, 0, NULL, \"x\", \&threads },\n&|" \
    "$D/t/services/rendezvous/main.c"
planted "an undocumented ballast-rdzv option fails (BALLAST_RDZV_PLANTED_...)" "BALLAST_RDZV_PLANTED_$S is read (services/rendezvous/main.c:[0-9]* (option --planted-"
copy
echo "| \`$V\` | nothing | unset | none | planted |" >> "$D/t/docs/environment.md"
planted "a row for a variable nothing reads fails" "lists $V, which no program reads"
copy
sed -i "s|^void log_init(const char \*prog, int rank) {|&\n    const char *nm = prog; (void)getenv(nm);|" "$D/t/common/log.c"
planted "a getenv of a computed name fails, naming the line" "common/log.c:[0-9]*: getenv(nm) reads a variable whose name the check cannot see"
t_done
