#!/usr/bin/env bash
# Check the Debian package on this machine, as README's "Deploying" describes it:
#   1. build it with cargo-deb (scripts/deb.sh) and check its name, control fields, conffiles and contents;
#   2. lintian reports no error;
#   3. `dpkg -i`: the files with their owners and modes, the `infergate` system user, the unit enabled and not
#      started, `systemd-analyze verify` silent on it, `infergate -t` on the installed config as the service user
#      (and refused to a user outside its group);
#   4. installed again over an edited config: the edit is kept (a conffile);
#   5. `dpkg --remove` keeps the config, the state and the user; `dpkg --purge` then leaves nothing: no file, no
#      user or group, no enablement link, nothing owned by the user's uid.
# scripts/test.sh runs it after the cargo tests. It needs root (or sudo) for dpkg and refuses to run where infergate
# is already installed or its user exists: it would purge them.
#
#   scripts/check-deb.sh             package target/debug/infergate (built by the tests; --profile dev --no-build):
#                                    what is checked is the packaging, and the release build would add minutes
#   scripts/check-deb.sh --release   package a release build (scripts/deb.sh: the package operators install)
set -euo pipefail
cd "$(dirname "$0")/.."

release=false
case "${1:-}" in
    --release) release=true ;;
    "") ;;
    *) echo "check-deb.sh: unknown argument $1" >&2; exit 2 ;;
esac
fail() { echo "check-deb.sh: FAIL: $*" >&2; exit 1; }
ok() { echo "check-deb.sh: ok: $*"; }
# Run quietly; on failure, fail with its output.
quiet() { local out; out="$("$@" 2>&1)" || fail "$* failed: $out"; }
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

if dpkg-query -W -f '${Status}' infergate 2>/dev/null | grep -q 'installed\|config-files'; then
    fail "the infergate package is installed here; this check would purge it (dpkg --purge infergate first)"
fi
if getent passwd infergate >/dev/null || getent group infergate >/dev/null || [ -e /etc/infergate ]; then
    fail "an infergate user, group or /etc/infergate exists here (scripts/install.sh?); this check would remove it"
fi
for t in lintian systemd-analyze setpriv; do
    command -v "$t" >/dev/null || fail "$t is missing: run scripts/ensure-test-tools.sh"
done

# 1. Build.
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
deb="target/debian/infergate_${version}_amd64.deb"
[ "$(sed -n '1s/^infergate (\(.*\)) .*/\1/p' conf/deb/changelog)" = "$version" ] \
    || fail "conf/deb/changelog's first entry is not version $version: add one (dch-style) for the new version"
rm -f "$deb"
start=$SECONDS
if $release; then
    scripts/deb.sh >/dev/null
else
    # The command check-demo.sh and conformance.sh run: nothing to build after them.
    cargo build --bins --quiet
    scripts/deb.sh --profile dev --no-build --fast >/dev/null
fi
[ -f "$deb" ] || fail "cargo deb wrote no $deb"
ok "built $deb in $((SECONDS - start)) s ($(du -h "$deb" | cut -f1))"
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = infergate ] && [ "$(field Version)" = "$version" ] && [ "$(field Architecture)" = amd64 ] \
    || fail "control: $(field Package) $(field Version) $(field Architecture)"
case "$(field Depends)" in *adduser*libc6*|*libc6*adduser*) ;; *) fail "Depends: $(field Depends)" ;; esac
ctl="$(mktemp -d /tmp/infergate-deb-control.XXXXXX)"
trap 'rm -rf "$ctl"' EXIT
dpkg-deb -e "$deb" "$ctl"
[ "$(sort "$ctl/conffiles")" = "$(printf '/etc/infergate/env\n/etc/infergate/infergate.yaml')" ] \
    || fail "conffiles: $(cat "$ctl/conffiles")"
grep -q 'deb-systemd-helper enable infergate.service' "$ctl/postinst" || fail "postinst does not enable the unit"
! grep -Eq 'deb-systemd-invoke (start|restart|try-restart)' "$ctl/postinst" || fail "postinst starts the unit"
contents="$(dpkg-deb -c "$deb" | awk '{print $1, $2, $6}')"
for want in "-rwxr-xr-x 0/0 ./usr/bin/infergate" \
            "-rw-r--r-- 0/0 ./usr/lib/systemd/system/infergate.service" \
            "-rw-r----- 0/0 ./etc/infergate/infergate.yaml" \
            "-rw-r----- 0/0 ./etc/infergate/env" \
            "-rw-r--r-- 0/0 ./usr/share/doc/infergate/copyright" \
            "-rw-r--r-- 0/0 ./usr/share/doc/infergate/examples/prometheus/prometheus.yml"; do
    grep -qxF -- "$want" <<<"$contents" || fail "the package lacks: $want"$'\n'"$contents"
done
ok "control fields, conffiles, contents; postinst enables the unit and does not start it"

# 2. lintian (overrides, each with its reason: conf/deb/lintian-overrides).
start=$SECONDS
out="$(lintian --fail-on error --tag-display-limit 0 "$deb" 2>&1)" || fail "lintian: $out"
if grep -q '^E:' <<<"$out"; then fail "lintian errors: $out"; fi
ok "lintian: no error in $((SECONDS - start)) s; warnings: $(grep '^W:' <<<"$out" | sed 's/^W: infergate: //' | tr '\n' ';')"

# 3. Install.
before="$(find /etc /usr /var /opt -xdev -name '*infergate*' 2>/dev/null | sort)"
quiet $SUDO dpkg -i "$deb"
purged=false
cleanup() { $purged || $SUDO dpkg --purge infergate >/dev/null 2>&1 || true; rm -rf "$ctl"; }
trap cleanup EXIT
meta() { stat -c '%a %U:%G' "$1"; }
[ "$(meta /usr/bin/infergate)" = "755 root:root" ] || fail "/usr/bin/infergate: $(meta /usr/bin/infergate)"
[ "$(meta /etc/infergate)" = "750 root:infergate" ] || fail "/etc/infergate: $(meta /etc/infergate)"
for f in infergate.yaml env; do
    [ "$(meta /etc/infergate/$f)" = "640 root:infergate" ] || fail "/etc/infergate/$f: $(meta /etc/infergate/$f)"
done
IFS=: read -r _ _ uid gid _ home shell <<<"$(getent passwd infergate)" || fail "no infergate user"
[ "$uid" -lt 1000 ] && [ "$home" = /nonexistent ] && [ ! -e /nonexistent ] || fail "user: uid $uid, home $home"
case "$shell" in */nologin|*/false) ;; *) fail "the user's shell is $shell" ;; esac
[ "$(getent group infergate | cut -d: -f3)" = "$gid" ] || fail "the user's group is not infergate"
ok "files and modes, system user infergate (uid $uid, home $home, shell $shell)"
wants=/etc/systemd/system/multi-user.target.wants/infergate.service
[ "$(readlink "$wants")" = /usr/lib/systemd/system/infergate.service ] || [ "$(readlink "$wants")" = /lib/systemd/system/infergate.service ] \
    || fail "the unit is not enabled ($wants -> $(readlink "$wants"))"
! pgrep -f '^/usr/bin/infergate' >/dev/null || fail "an installed infergate runs: the package started it"
out="$(systemd-analyze verify /usr/lib/systemd/system/infergate.service 2>&1)" || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
ok "unit enabled ($wants), not started; systemd-analyze verify: no warning"
as() { $SUDO setpriv --reuid="$1" --regid="$2" --clear-groups "${@:3}"; }
as infergate infergate /usr/bin/infergate -t -c /etc/infergate/infergate.yaml >/dev/null \
    || fail "the service user cannot validate the installed config (the unit's ExecStartPre would fail)"
out="$(as nobody nogroup /usr/bin/infergate -t -c /etc/infergate/infergate.yaml 2>&1)" \
    && fail "a user outside the infergate group can read the config"
case "$out" in *"Permission denied"*) ;; *) fail "unexpected refusal: $out" ;; esac
ok "infergate -t on the installed config as the service user; refused to nobody"

# 4. An edited config survives reinstalling.
echo "# edited by check-deb.sh" | $SUDO tee -a /etc/infergate/infergate.yaml >/dev/null
quiet $SUDO dpkg -i "$deb"
tail -1 /etc/infergate/infergate.yaml | grep -qx "# edited by check-deb.sh" || fail "reinstalling replaced the edited config"
[ "$(meta /etc/infergate/infergate.yaml)" = "640 root:infergate" ] || fail "mode after reinstalling"
ok "an edited /etc/infergate/infergate.yaml is kept by a reinstall"

# 5. What the service and the operator leave: session state (the unit's StateDirectory=), a token file.
$SUDO install -d -o infergate -g infergate -m 0700 /var/lib/infergate
$SUDO install -o infergate -g infergate -m 0600 /dev/null /var/lib/infergate/sessions.state
$SUDO install -o root -g infergate -m 0640 /dev/null /etc/infergate/metrics-token
quiet $SUDO dpkg --remove infergate
[ ! -e /usr/bin/infergate ] && [ ! -e /usr/lib/systemd/system/infergate.service ] || fail "remove left the binary or unit"
[ -f /etc/infergate/infergate.yaml ] && [ -f /var/lib/infergate/sessions.state ] && getent passwd infergate >/dev/null \
    || fail "remove (not purge) took the config, the state or the user"
quiet $SUDO dpkg --purge infergate
purged=true
! dpkg-query -W infergate >/dev/null 2>&1 || fail "dpkg still knows infergate: $(dpkg-query -W infergate 2>&1)"
getent passwd infergate >/dev/null && fail "the infergate user is left"
getent group infergate >/dev/null && fail "the infergate group is left"
left="$(find /etc /usr /var /opt /srv /run /home \( -uid "$uid" -o -gid "$gid" \) -print 2>/dev/null | head)"
[ -z "$left" ] || fail "files of uid $uid / gid $gid are left: $left"
after="$(find /etc /usr /var /opt -xdev -name '*infergate*' 2>/dev/null | sort)"
[ "$before" = "$after" ] || fail "left after purge: $(comm -13 <(echo "$before") <(echo "$after"))"
ok "remove kept config, state and user; purge left nothing (files, user, group, enablement, uid $uid)"
echo "check-deb.sh: all checks passed"
