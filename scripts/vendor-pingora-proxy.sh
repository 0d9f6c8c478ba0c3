#!/usr/bin/env bash
# Re-creates vendor/pingora-proxy from the crates.io release named below plus vendor/pingora-proxy.patch.
# Run it when upgrading Pingora: bump VERSION, run, rebuild, and check that the patch still applies and that
# infergate's body tests (infergate/tests/it/bodies.rs) pass. Why the patch exists: README, "Request bodies".
set -euo pipefail
VERSION="${1:-0.9.1}"
cd "$(dirname "$0")/.."
cargo fetch --quiet >/dev/null 2>&1 || true
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/pingora-proxy-"$VERSION" 2>/dev/null | head -n1)
[ -n "$src" ] || { echo "pingora-proxy $VERSION is not in the cargo registry cache; add it to a Cargo.toml and run cargo fetch" >&2; exit 1; }
rm -rf vendor/pingora-proxy
mkdir -p vendor/pingora-proxy
cp -r "$src/src" "$src/LICENSE" vendor/pingora-proxy/
# Only the library is built from this copy: drop examples, benches and dev-dependencies from the manifest.
python3 - "$src/Cargo.toml" vendor/pingora-proxy/Cargo.toml <<'PY'
import re, sys
blocks = re.split(r'(?m)^(?=\[)', open(sys.argv[1]).read())
keep = [b for b in blocks if not re.match(r'\[\[(example|bench|test)\]\]|\[.*dev-dependencies', b)]
open(sys.argv[2], 'w').write(''.join(keep))
PY
patch -d vendor/pingora-proxy -p1 < vendor/pingora-proxy.patch
echo "vendor/pingora-proxy: pingora-proxy $VERSION + vendor/pingora-proxy.patch"
