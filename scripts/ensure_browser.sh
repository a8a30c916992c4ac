#!/usr/bin/env bash
# Make sure the browser the console tests drive is on this machine: Debian's chromium at /usr/bin/chromium
# (Playwright for Python, from requirements-dev.txt, launches it through executable_path; no browser download).
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present)"
  exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

echo "chromium: not installed; installing Debian's chromium"
as_root apt-get update -qq
DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version
