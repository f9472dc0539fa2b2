#!/usr/bin/env bash
# Checks that the equivalence tests catch a claim that leaves the breakers or the budget
# otherwise than the sequential call would: each mutation below is applied to a copy of the
# tree, and `cargo test --test it equivalence` must fail on it. Not part of CI (each mutation
# rebuilds the crate); run it by hand after changing the claim:
#
#   bash tests/mutations/run.sh [WORKDIR]
#
# WORKDIR (default: a new temporary directory) receives the copy; give one that already holds a
# `target` directory to build faster. Exit status 0 when every mutation was caught.
set -euo pipefail
# At the 200 cases CI runs, the breaker mutation once went uncaught; 2,000 catch both.
export TOOLSCRIPT_PROPTEST_CASES="${TOOLSCRIPT_PROPTEST_CASES:-2000}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
tar -C "$root" --exclude=./target --exclude=./.git --exclude=./.venv \
  --exclude=./tests/mcp/node_modules -cf - . | tar -C "$work" -xf -

# name | file | text to replace | replacement
mutations=(
  "claims record nothing in the breakers|src/dispatch/context.rs|self.breakers.replay(tool, health, &nested, now)|{ let _ = (tool, health); Ok::<(), Replay>(()) }"
  "a claimed composite is charged one call|src/dispatch/context.rs|let _ = self.budget.charge_claim(calls, now);|let _ = self.budget.charge_claim(1, now);"
)

missed=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file from to <<<"$m"
  cp "$root/$file" "$work/$file"
  if ! grep -qF "$from" "$work/$file"; then
    echo "mutation '$name': its text is no longer in $file; update this script" >&2
    exit 2
  fi
  python3 - "$work/$file" "$from" "$to" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
open(path, 'w').write(text.replace(old, new, 1))
PY
  if ! (cd "$work" && cargo test --quiet --test it --no-run >/dev/null 2>&1); then
    echo "mutation '$name' does not build; update this script" >&2
    exit 2
  fi
  if (cd "$work" && cargo test --quiet --test it equivalence >/dev/null 2>&1); then
    echo "MISSED: $name"
    missed=$((missed + 1))
  else
    echo "caught: $name"
  fi
  cp "$root/$file" "$work/$file"
done
exit $((missed > 0))
