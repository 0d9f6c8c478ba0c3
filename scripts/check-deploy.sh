#!/usr/bin/env bash
# Check the systemd deployment path as README's "Deploying" describes it, without systemd running as PID 1:
#   1. scripts/install.sh stages the install under a temporary root;
#   2. the service user can read the configuration (the unit's ExecStartPre `infergate -t`, run as that user),
#      and a user outside its group cannot;
#   3. the installed configuration uses the unit's paths (PIDFile=, RuntimeDirectory=, StateDirectory=) and
#      daemon_wait_for_ready;
#   4. `systemd-analyze verify` accepts the unit without a single warning;
#   5. `systemd-analyze security --offline=true` rates it at most 2.5.
# The test suite runs it (infergate/tests/it/deploy.rs). It installs Debian's `systemd` package when
# systemd-analyze is missing (apt-get, as root); exit status 77 means it could not, and nothing was checked.
#
#   scripts/check-deploy.sh [--binary PATH]      (default: target/release/infergate)
set -euo pipefail
cd "$(dirname "$0")/.."

binary="target/release/infergate"
case "${1:-}" in
    --binary) binary="${2:?--binary needs a path}" ;;
    --binary=*) binary="${1#--binary=}" ;;
    "") ;;
    *) echo "check-deploy.sh: unknown argument $1" >&2; exit 2 ;;
esac
MAX_EXPOSURE=2.5
fail() { echo "check-deploy.sh: FAIL: $*" >&2; exit 1; }
ok() { echo "check-deploy.sh: ok: $*"; }

if ! command -v systemd-analyze >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "check-deploy.sh: systemd-analyze missing: installing Debian's systemd package"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends systemd >/dev/null || true
    fi
    if ! command -v systemd-analyze >/dev/null; then
        echo "check-deploy.sh: SKIP: systemd-analyze is missing and cannot be installed here (needs root and" \
             "apt-get: apt-get install systemd)" >&2
        exit 77
    fi
fi

stage="$(mktemp -d /tmp/infergate-deploy.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
# The service user must be able to walk down to /etc/infergate.
chmod 0755 "$stage"
is_root=false
[ "$(id -u)" = 0 ] && is_root=true

# 1. Stage. As root with an existing unprivileged account (Debian's nobody:nogroup), so that ownership is real;
#    otherwise as infergate, without ownership (install.sh prints the chown commands).
user=infergate
if $is_root && getent passwd nobody >/dev/null; then
    user=nobody
fi
scripts/install.sh --root "$stage" --binary "$binary" --user "$user" >"$stage.log" 2>&1 \
    || { cat "$stage.log" >&2; rm -f "$stage.log"; fail "install.sh"; }
rm -f "$stage.log"
unit="$stage/etc/systemd/system/infergate.service"
conf="$stage/etc/infergate/infergate.yaml"
for f in "$stage/usr/local/bin/infergate" "$unit" "$conf" "$stage/etc/infergate/env"; do
    [ -f "$f" ] || fail "install.sh did not install ${f#"$stage"}"
done
mode() { stat -c '%a' "$1"; }
[ "$(mode "$conf")" = 640 ] || fail "config mode $(mode "$conf"), want 640"
[ "$(mode "$stage/etc/infergate/env")" = 640 ] || fail "env file mode $(mode "$stage/etc/infergate/env"), want 640"
[ "$(mode "$stage/etc/infergate")" = 750 ] || fail "/etc/infergate mode $(mode "$stage/etc/infergate"), want 750"
[ "$(mode "$stage/usr/local/bin/infergate")" = 755 ] || fail "binary mode, want 755"
ok "install.sh staged binary 0755, unit, config and env 0640 in /etc/infergate 0750"

# 2. The unit's ExecStartPre, as the service user.
if $is_root && [ "$user" = nobody ] && command -v setpriv >/dev/null; then
    group="$(id -gn nobody)"
    [ "$(stat -c '%U:%G' "$conf")" = "root:$group" ] || fail "config owned by $(stat -c '%U:%G' "$conf"), want root:$group"
    grep -qx "User=nobody" "$unit" && grep -qx "Group=$group" "$unit" || fail "the unit's User=/Group= were not set to nobody/$group"
    as_service() { setpriv --reuid=nobody --regid="$group" --clear-groups "$@"; }
    as_service "$stage/usr/local/bin/infergate" -t -c "$conf" >/dev/null \
        || fail "the service user cannot validate the installed config (ExecStartPre would fail)"
    # Control: the same command as a user outside the group is refused, so the check above means something.
    out="$(setpriv --reuid=65533 --regid=65533 --clear-groups "$stage/usr/local/bin/infergate" -t -c "$conf" 2>&1)" \
        && fail "a user outside the service group can read the config"
    case "$out" in *"Permission denied"*) ;; *) fail "unexpected refusal: $out" ;; esac
    ok "the service user (nobody:$group here) runs ExecStartPre's -t on the installed config; others are refused"
else
    echo "check-deploy.sh: note: not root (or no nobody/setpriv): ownership and the service user's read not checked"
fi

# 3-5 look at the unit as shipped, for the `infergate` user (verify warns about a unit running as nobody): stage
# it again without ownership.
rm -rf "$stage/etc/systemd"
scripts/install.sh --root "$stage" --binary "$binary" >/dev/null 2>&1 || fail "install.sh (unit as shipped)"
grep -qx "User=infergate" "$unit" || fail "the unit as shipped does not run as infergate"

# 3. The config and the unit agree.
pidfile="$(sed -n 's/^PIDFile=//p' "$unit")"
rundir="/run/$(sed -n 's/^RuntimeDirectory=//p' "$unit")"
yaml() { sed -n "s/^ *$1: *\([^ #]*\).*/\1/p" "$conf" | head -1; }
[ "$(yaml pid_file)" = "$pidfile" ] || fail "config pid_file $(yaml pid_file) != unit PIDFile=$pidfile"
case "$(yaml upgrade_sock)" in "$rundir"/*) ;; *) fail "config upgrade_sock $(yaml upgrade_sock) is outside $rundir" ;; esac
[ "$(yaml daemon_wait_for_ready)" = true ] || fail "config lacks daemon_wait_for_ready: true"
grep -q -- "-t -c /etc/infergate/infergate.yaml" "$unit" || fail "the unit does not validate /etc/infergate/infergate.yaml"
statedir="/var/lib/$(sed -n 's/^StateDirectory=//p' "$unit")"
[ "$statedir" != /var/lib/ ] || fail "the unit has no StateDirectory= for the session state file"
state="$(sed -n 's/^state_file: *{ *path: *\([^ ,}]*\).*/\1/p' "$conf" | head -1)"
case "$state" in "$statedir"/*) ;; *) fail "config state_file path '$state' is outside the unit's $statedir" ;; esac
ok "config pid_file = PIDFile=$pidfile, upgrade_sock in $rundir, daemon_wait_for_ready: true, state_file in $statedir"

# 4. verify: against the staged tree (the binary there) and the host's own units (targets it refers to).
mkdir -p "$stage/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$stage/usr/lib/systemd/" 2>/dev/null || cp -a /lib/systemd/system "$stage/usr/lib/systemd/"
out="$(systemd-analyze verify --root="$stage" /etc/systemd/system/infergate.service 2>&1)" \
    || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
ok "systemd-analyze verify: no warning"

# 5. security.
line="$(systemd-analyze security --offline=true "$unit" 2>&1 | grep 'Overall exposure level')" \
    || fail "systemd-analyze security printed no overall level"
score="$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')"
awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }' || fail "exposure $score > $MAX_EXPOSURE ($line)"
ok "systemd-analyze security --offline=true: $score (at most $MAX_EXPOSURE)"
echo "check-deploy.sh: all checks passed"
