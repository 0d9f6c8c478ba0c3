#!/usr/bin/env bash
# Build the Debian package with cargo-deb: target/debian/infergate_<version>_amd64.deb, from a release build (fat
# LTO: several minutes on 2 cores). Packaging metadata: [package.metadata.deb] in infergate/Cargo.toml; the
# maintainer scripts in conf/deb/. Installs the pinned cargo-deb first when it is missing (cargo install, crates.io).
#
#   scripts/deb.sh                    build the release binary and the package
#   scripts/deb.sh --no-build         package target/release/infergate as it is
#   scripts/deb.sh [cargo deb args]   e.g. --profile NAME; see `cargo deb --help`
#
# Then: sudo apt install ./target/debian/infergate_*_amd64.deb (README, "Deploying").
set -euo pipefail
cd "$(dirname "$0")/.."

# The cargo-deb release the packaging was written and checked against (scripts/check-deb.sh).
CARGO_DEB_VERSION=3.8.0
if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
    echo "deb.sh: installing cargo-deb $CARGO_DEB_VERSION (cargo install, about a minute)" >&2
    cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION" >&2
fi
exec cargo deb -p infergate "$@"
