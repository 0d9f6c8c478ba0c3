#!/usr/bin/env bash
# The workspace's `rust-version` holds for the locked dependencies: no package the build can reach on this
# platform (normal, build and dev dependencies) declares a newer `rust-version`. The code's own use of newer
# standard-library APIs is clippy's `incompatible_msrv` lint (clippy reads the same `rust-version`). Together they
# keep the declared minimum true without installing a second toolchain; a lock update that pulls a newer crate
# fails here, naming it and the way back (`cargo update --precise`, or the MSRV-aware resolver).
# What neither sees (a type the older compiler does not infer) needs that compiler: with MSRV_RUSTC set to one
# (e.g. Debian bookworm's rustc-web 1.85: MSRV_RUSTC=/usr/bin/rustc), the workspace is also checked with it.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
cargo metadata --locked --format-version 1 --filter-platform "$host" | python3 -c '
import json, sys

def ver(v):
    parts = [int(p) for p in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

meta = json.load(sys.stdin)
by_id = {p["id"]: p for p in meta["packages"]}
members = [by_id[i] for i in meta["workspace_members"]]
declared = {m["rust_version"] for m in members}
if None in declared or len(declared) != 1:
    sys.exit(f"check-msrv: every workspace member must declare the same rust-version: {sorted(map(str, declared))}")
msrv = declared.pop()
reached = {n["id"] for n in meta["resolve"]["nodes"]}
newer = sorted(
    (by_id[i]["name"], by_id[i]["version"], by_id[i]["rust_version"])
    for i in reached
    if by_id[i].get("rust_version") and ver(by_id[i]["rust_version"]) > ver(msrv)
)
if newer:
    print(f"check-msrv: the workspace declares rust-version {msrv}; these locked packages need a newer Rust:", file=sys.stderr)
    for name, version, rv in newer:
        print(f"  {name} {version} requires {rv}", file=sys.stderr)
    print("Pick compatible versions: CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo update -p NAME", file=sys.stderr)
    sys.exit(1)
print(f"check-msrv: {len(reached)} locked packages build on rust-version {msrv}")
'
if [ -n "${MSRV_RUSTC:-}" ]; then
  echo "check-msrv: cargo check with $("$MSRV_RUSTC" --version)"
  CARGO_TARGET_DIR=${MSRV_TARGET_DIR:-target/msrv} RUSTC="$MSRV_RUSTC" \
    "${MSRV_CARGO:-cargo}" check --workspace --all-targets --locked
fi
