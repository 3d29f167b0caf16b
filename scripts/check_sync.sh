#!/usr/bin/env bash
# Fail when the library is out of sync with the notebooks (nbdev_export changes hkt_nb/)
# or when notebooks are not clean (nbdev_clean changes nbs/). Works on a dirty tree too:
# it compares the files before and after, not against git.
set -euo pipefail
# the nbdev tools: from $BIN when given (the Makefile's venv), else .venv/bin when it exists, else the PATH
if [ -z "${BIN:-}" ] && [ -x .venv/bin/nbdev_export ]; then BIN=.venv/bin; fi
tool() { if [ -n "${BIN:-}" ]; then "$BIN/$1"; else "$1"; fi; }
snapshot() { find "$1" -type f \( -name '*.py' -o -name '*.ipynb' \) -not -path '*/.ipynb_checkpoints/*' -print0 | sort -z | xargs -0 sha256sum; }
lib_before=$(snapshot hkt_nb); nbs_before=$(snapshot nbs)
# nbdev_export rewrites pyproject.toml even when nothing changes; keep its time then, or make would reinstall .venv
pyproject_copy=$(mktemp); cp -p pyproject.toml "$pyproject_copy"
tool nbdev_export
if cmp -s pyproject.toml "$pyproject_copy"; then touch -r "$pyproject_copy" pyproject.toml; fi
rm -f "$pyproject_copy"
tool nbdev_clean
status=0
if [ "$lib_before" != "$(snapshot hkt_nb)" ]; then
  echo "ERROR: hkt_nb/ was out of sync with nbs/ (nbdev_export has now rewritten it: review git diff hkt_nb). Library code is written only in"
  echo "       nbs/ '#| export' cells: run nbdev_export and commit notebooks and library together."
  diff <(echo "$lib_before") <(snapshot hkt_nb) || true
  status=1
fi
if [ "$nbs_before" != "$(snapshot nbs)" ]; then
  echo "ERROR: notebooks were not clean (nbdev_clean changed them). Run nbdev_clean and commit."
  diff <(echo "$nbs_before") <(snapshot nbs) || true
  status=1
fi
# the one install cell of every chapter (scripts/install_cell.py writes it from settings.ini)
if ! tool python scripts/install_cell.py --check; then status=1; fi
[ $status -eq 0 ] && echo "nbs/ and hkt_nb/ in sync; notebooks clean."
exit $status
