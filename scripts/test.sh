#!/usr/bin/env bash
# Installs everything walkit's tests need on a fresh Debian machine, then runs the whole suite.
# Fast tier only: scripts/test.sh -m "not slow"      (extra arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
python3 -m pytest -q "$@"
