#!/usr/bin/env bash
# Install infergate as a systemd service (conf/infergate.service): the binary, the unit, the configuration and
# the environment file, owned so that the unprivileged service user can read them. On Debian and Ubuntu, install
# the package instead (scripts/deb.sh, README "Deploying"); this script is for other distributions.
#
#   sudo scripts/install.sh                     install on this machine, create the `infergate` user
#   scripts/install.sh --root /tmp/stage        stage the same tree under a directory (packaging, tests): no
#                                               user is created, nothing outside the directory is touched
#
# Options:
#   --root DIR      install under DIR (DESTDIR-style) instead of /
#   --binary PATH   the infergate binary (default: target/release/infergate; build it with cargo build --release)
#   --config FILE   the configuration installed when /etc/infergate/infergate.yaml does not exist yet
#                   (default: conf/infergate.systemd.yaml); an existing one is kept, the new one is put beside it
#                   as infergate.yaml.new
#   --user NAME     the service account (default: infergate); the unit's User= and Group= are set to it and its
#                   group
#
# What it installs (under DIR with --root):
#   /usr/local/bin/infergate                 root:root 0755
#   /etc/systemd/system/infergate.service    root:root 0644
#   /etc/infergate/                          root:GROUP 0750
#   /etc/infergate/infergate.yaml            root:GROUP 0640 (the service reads it; only root writes it)
#   /etc/infergate/env                       root:GROUP 0640, created empty if missing (engine API keys)
#   /usr/share/doc/infergate/README.md       root:root 0644
# Then, on a real install, `systemctl daemon-reload` when systemd runs. It never starts or restarts the service:
# run `systemctl enable --now infergate` the first time, `systemctl reload infergate` after an upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

root=""
binary="target/release/infergate"
config="conf/infergate.systemd.yaml"
user="infergate"
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --root=*) root="${1#--root=}"; shift ;;
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --binary=*) binary="${1#--binary=}"; shift ;;
        --config) config="${2:?--config needs a file}"; shift 2 ;;
        --config=*) config="${1#--config=}"; shift ;;
        --user) user="${2:?--user needs a name}"; shift 2 ;;
        --user=*) user="${1#--user=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -n "$root" ]; then
    mkdir -p "$root"
    root="$(cd "$root" && pwd)"
fi
[ -x "$binary" ] || { echo "install.sh: no binary at $binary: run cargo build --release (or pass --binary)" >&2; exit 1; }
[ -f "$config" ] || { echo "install.sh: no configuration file $config" >&2; exit 1; }
"$binary" -t -c "$config" >/dev/null || { echo "install.sh: $config is not valid (see above)" >&2; exit 1; }

is_root=false
[ "$(id -u)" = 0 ] && is_root=true
say() { echo "install.sh: $*"; }

# The service account: created on a real install as root; otherwise say how.
useradd_cmd="useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin $user"
if getent passwd "$user" >/dev/null; then
    group="$(id -gn "$user")"
elif [ -z "$root" ] && $is_root; then
    $useradd_cmd
    say "created system user $user"
    group="$(id -gn "$user")"
else
    group="$user"
    say "user $user does not exist here; on the target machine, as root: $useradd_cmd"
fi
# Ownership needs root and an existing group; without them the modes are set and the commands printed.
own=false
if $is_root && getent group "$group" >/dev/null; then
    own=true
fi
owner() { # owner GROUP-OR-root PATH...
    local g="$1"; shift
    if $own; then
        chown "root:$g" "$@"
    elif [ "$g" != root ]; then
        local p; for p in "$@"; do say "as root on the target: chown root:$g ${p#"$root"}"; done
    fi
}

etc="$root/etc/infergate"
install -d -m 0755 "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/share/doc/infergate"
install -m 0755 "$binary" "$root/usr/local/bin/infergate"
# The unit names the Debian package's /usr/bin/infergate; this install's binary is in /usr/local/bin.
sed -e "s/^User=infergate$/User=$user/" -e "s/^Group=infergate$/Group=$group/" \
    -e "s|/usr/bin/infergate |/usr/local/bin/infergate |" conf/infergate.service \
    > "$root/etc/systemd/system/infergate.service"
chmod 0644 "$root/etc/systemd/system/infergate.service"
install -m 0644 README.md "$root/usr/share/doc/infergate/README.md"

install -d -m 0750 "$etc"
owner "$group" "$etc"
if [ -e "$etc/infergate.yaml" ]; then
    install -m 0640 "$config" "$etc/infergate.yaml.new"
    owner "$group" "$etc/infergate.yaml.new"
    say "kept $etc/infergate.yaml; the shipped one is $etc/infergate.yaml.new"
else
    install -m 0640 "$config" "$etc/infergate.yaml"
    owner "$group" "$etc/infergate.yaml"
fi
if [ ! -e "$etc/env" ]; then
    install -m 0640 conf/infergate.env "$etc/env"
    owner "$group" "$etc/env"
fi
if $own; then
    chown root:root "$root/usr/local/bin/infergate" "$root/etc/systemd/system/infergate.service"
fi

say "installed under ${root:-/}"
if [ -z "$root" ]; then
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        say "next: edit /etc/infergate/infergate.yaml (your engines), then: systemctl enable --now infergate"
        say "after a binary or config change: systemctl reload infergate (graceful upgrade)"
    else
        say "systemd is not running here: the unit is installed but not loaded"
    fi
fi
