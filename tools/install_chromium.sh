#!/usr/bin/env bash
# Installs Debian's chromium for the browser tests. Needs root (as on CI); otherwise
# explains what to run, and the browser tests skip with the same message.
set -u
if command -v chromium >/dev/null; then exit 0; fi
if [ "$(id -u)" != "0" ]; then
  echo "chromium is missing; the browser tests will be skipped. Install it with: sudo apt-get install -y chromium" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq chromium >/dev/null || {
  echo "apt-get could not install chromium; the browser tests will be skipped." >&2
  exit 0
}
