#!/usr/bin/env bash
# Create (once) a separate virtual environment with Label Studio 1.23.2 for the end-to-end test.
# Label Studio pins rq<2.7 and redis<5.3, which conflict with the service's own dependencies, so it never
# goes into .venv. The environment is cached in .labelstudio-venv (git-ignored); a marker file records the
# installed version, so a second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LABELSTUDIO_VENV:-.labelstudio-venv}"
VERSION="1.23.2"
PY="${PY:-python3}"
if [ -f "$VENV/.installed-$VERSION" ]; then
  echo "label-studio $VERSION already installed in $VENV"
  exit 0
fi
start=$(date +%s)
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "label-studio==$VERSION"
touch "$VENV/.installed-$VERSION"
echo "installed label-studio $VERSION into $VENV in $(( $(date +%s) - start )) s"
