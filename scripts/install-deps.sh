#!/usr/bin/env bash
# Installs the Debian packages obmesh's tests use, when they are missing.
# Runs apt-get only if something is missing, and only as root (CI is root).
set -euo pipefail

# package:command-that-proves-it-is-installed
wanted=(
  openipmi:ipmi_sim
  ipmitool:ipmitool
  python3-pytest:/usr/lib/python3/dist-packages/pytest
  python3-requests:/usr/lib/python3/dist-packages/requests
  systemd:systemd-analyze
  zsh:zsh
  groff-base:groff   # obmesh man is checked with groff -ww (cmd/obmesh/daemon)
  chromium:chromium   # the web UI's browser test (tests/systemtest/webui_test.go)
)

missing=()
for w in "${wanted[@]}"; do
  pkg=${w%%:*} cmd=${w#*:}
  if ! command -v "$cmd" >/dev/null 2>&1 && ! [ -e "$cmd" ]; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
