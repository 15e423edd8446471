#!/usr/bin/env bash
# `make test` calls this before pytest: the browser tests (tests/test_dashboards_browser.py)
# need Debian's chromium. Installs it with apt-get when it is missing, apt-get exists and we
# are root; otherwise says why and leaves it (those tests then skip with the reason).
# Never fails: the rest of the suite does not need a browser.
set -u
for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "${GRAFTPOOL_NO_BROWSER_INSTALL:-0}" = "1" ]; then
    echo "note: chromium not installed (GRAFTPOOL_NO_BROWSER_INSTALL=1): the browser tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: chromium not installed and no apt-get here: the browser tests will skip"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "note: chromium not installed and not root (sudo apt-get install chromium): the browser tests will skip"
    exit 0
fi
echo "installing chromium for the browser tests (apt-get) ..."
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/dev/null 2>&1 \
        && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null 2>&1; then
    echo "chromium installed: $(command -v chromium)"
else
    echo "note: apt-get could not install chromium: the browser tests will skip"
fi
exit 0
