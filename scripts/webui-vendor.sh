#!/usr/bin/env bash
# Fetches the web UI's third-party assets (xterm.js and its fit addon) from
# the npm registry with npm, and copies the ES modules, the stylesheet and
# the licences into coordinator/webui/static/vendor/. The copied files are
# committed: building or running obmesh needs neither Node nor npm; only a
# developer who changes the versions below runs this script (Node and npm
# installed), reviews the diff and commits it.
#
#   scripts/webui-vendor.sh
#
# npm checks each tarball against the registry's integrity hash; the script
# then writes the sha256 of every copied file to vendor/VERSIONS, so a
# later run shows any change in the files as a diff.
set -euo pipefail

XTERM_VERSION=6.0.0
FIT_VERSION=0.11.0

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/coordinator/webui/static/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$work"
npm pack --silent "@xterm/xterm@$XTERM_VERSION" "@xterm/addon-fit@$FIT_VERSION" >/dev/null
mkdir xterm fit
tar xzf "xterm-xterm-$XTERM_VERSION.tgz" -C xterm
tar xzf "xterm-addon-fit-$FIT_VERSION.tgz" -C fit

rm -rf "$out"
mkdir -p "$out/xterm" "$out/addon-fit"
# The ES module builds, without the source map comment (the maps are not
# shipped, and a browser's developer tools would ask for them).
sed '/^\/\/# sourceMappingURL=/d' xterm/package/lib/xterm.mjs >"$out/xterm/xterm.mjs"
cp xterm/package/css/xterm.css "$out/xterm/xterm.css"
cp xterm/package/LICENSE "$out/xterm/LICENSE"
sed '/^\/\/# sourceMappingURL=/d' fit/package/lib/addon-fit.mjs >"$out/addon-fit/addon-fit.mjs"
cp fit/package/LICENSE "$out/addon-fit/LICENSE"

{
  echo "# Written by scripts/webui-vendor.sh; do not edit."
  echo "@xterm/xterm $XTERM_VERSION"
  echo "@xterm/addon-fit $FIT_VERSION"
  (cd "$out" && find . -type f ! -name VERSIONS | LC_ALL=C sort | xargs sha256sum)
} >"$out/VERSIONS"
echo "webui-vendor: wrote $out"
