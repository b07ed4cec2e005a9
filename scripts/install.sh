#!/usr/bin/env bash
# Install or upgrade specwatch as a systemd service on this node, from a checkout or unpacked sdist:
#
#   sudo scripts/install.sh             # install, or upgrade in place (the config is never overwritten)
#   sudo scripts/install.sh --no-start  # install files only; start it yourself after editing the config
#
# What it does: creates the system user `specwatch`; a virtualenv in $PREFIX (default /opt/specwatch) with
# specwatch installed from a wheel (built here from this checkout, or $WHEEL) and its dependencies; the CLI
# linked into $BIN_DIR (default /usr/local/bin); an example config at $CONFIG_DIR/specwatch.yml (default
# /etc/specwatch, root:specwatch 0640 in a 0750 directory: it may hold engine credentials) when none exists;
# $DEFAULT_FILE (default /etc/default/specwatch, the unit's arguments) when none exists; the unit at
# $UNIT_DIR/specwatch.service (default /etc/systemd/system). Before it restarts a running service it validates
# the config with the new version, so an upgrade never stops a working daemon over a config the new version
# refuses. Logs go to the journal: journalctl -u specwatch.
#
# Environment: PYTHON (interpreter for the venv, >= 3.10; default python3), PREFIX, BIN_DIR, CONFIG_DIR,
# DEFAULT_FILE, UNIT_DIR, WHEEL (a specwatch wheel built once for the fleet: `pip wheel --no-deps .`), PIP_ARGS
# (extra pip arguments, e.g. "--no-index --find-links /srv/wheels" on offline nodes), DESTDIR (build a staging
# root for a package or an image: see below).
# --no-system stages files only (no user, no chown, no systemctl, no root needed): for tests.
#
# The service user and the config's group are declared, not made: usr/lib/sysusers.d/specwatch.conf and
# usr/lib/tmpfiles.d/specwatch.conf. A live install applies them at once (systemd-sysusers, systemd-tmpfiles;
# useradd and chown by name where systemd's tools are missing). A DESTDIR staging root holds no account files
# and no numeric owner of the host's: the target applies the same two files when the tree lands there, as a
# package's postinst does (`systemd-sysusers specwatch.conf; systemd-tmpfiles --create specwatch.conf`). Its
# venv's launchers name the final path ($PREFIX), not the staging root, so the tree works once moved there.
set -euo pipefail

PYTHON=${PYTHON:-python3}
PREFIX=${PREFIX:-/opt/specwatch}
BIN_DIR=${BIN_DIR:-/usr/local/bin}
CONFIG_DIR=${CONFIG_DIR:-/etc/specwatch}
DEFAULT_FILE=${DEFAULT_FILE:-/etc/default/specwatch}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
PIP_ARGS=${PIP_ARGS:-}
WHEEL=${WHEEL:-}
DESTDIR=${DESTDIR:-}
SERVICE_USER=specwatch
DEFAULT_PREFIX=/opt/specwatch

start=yes
system=yes
for arg in "$@"; do
  case "$arg" in
    --no-start) start=no ;;
    --no-system) system=no; start=no ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "install.sh: $*"; }
die() { echo "install.sh: $*" >&2; exit 1; }

[ -f "$src/pyproject.toml" ] && [ -f "$src/systemd/specwatch.service" ] || die "run me from a specwatch checkout ($src)"
if [ "$system" = yes ]; then
  [ "$(id -u)" = 0 ] || die "must run as root (or pass --no-system to stage files only)"
  command -v systemctl >/dev/null || die "systemctl not found: this installs a systemd service"
fi
[ -z "$DESTDIR" ] || start=no  # a staging root has no running systemd to start anything in
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a Python >= 3.10"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PYTHON is older than 3.10"

# 1. The service user (no login, no home of its own: state lives in the StateDirectory) and the config's
# group, as systemd declarations that any root can apply by name.
sysusers_file="$DESTDIR/usr/lib/sysusers.d/specwatch.conf"
tmpfiles_file="$DESTDIR/usr/lib/tmpfiles.d/specwatch.conf"
if [ "$system" = yes ] || [ -n "$DESTDIR" ]; then  # --no-system alone touches nothing outside the given paths
  install -d -m 0755 "$(dirname "$sysusers_file")" "$(dirname "$tmpfiles_file")"
  printf 'u %s - "specwatch monitor" /var/lib/specwatch /usr/sbin/nologin\n' "$SERVICE_USER" >"$sysusers_file"
  printf 'z %s 0750 root %s -\nz %s/specwatch.yml 0640 root %s -\n' \
    "$CONFIG_DIR" "$SERVICE_USER" "$CONFIG_DIR" "$SERVICE_USER" >"$tmpfiles_file"
  chmod 0644 "$sysusers_file" "$tmpfiles_file"
fi
if [ "$system" = yes ] && [ -z "$DESTDIR" ] && ! getent passwd "$SERVICE_USER" >/dev/null; then
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$sysusers_file"
  else
    useradd --system --user-group --no-create-home --home-dir /var/lib/specwatch \
      --shell /usr/sbin/nologin --comment "specwatch monitor" "$SERVICE_USER"
  fi
  say "created system user $SERVICE_USER"
fi

# 2. The virtualenv, specwatch from a wheel (what is shipped, nothing of the checkout's tests or testbed).
# Upgrades install over the existing venv; a failed pip run leaves the old version in place.
venv="$DESTDIR$PREFIX"
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv" || die "python -m venv failed (Debian: apt-get install python3-venv)"
fi
# `python -m specwatch`, not the launcher: a staged venv's launchers name the final path, not this one.
old_version=$("$venv/bin/python" -m specwatch --version 2>/dev/null || true)
if [ -z "$WHEEL" ]; then
  wheel_dir=$(mktemp -d)
  trap 'rm -rf "$wheel_dir"' EXIT
  # Built from a clean copy: setuptools would reuse (and ship) whatever an earlier build left in ./build.
  mkdir "$wheel_dir/src"
  tar -C "$src" --exclude='./.venv*' --exclude=./.git --exclude=./build --exclude=./dist -cf - . | tar -C "$wheel_dir/src" -xf -
  # shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
  "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps $PIP_ARGS -w "$wheel_dir" "$wheel_dir/src" \
    || die "building the specwatch wheel failed; the previous installation ($old_version) is unchanged"
  WHEEL=$(ls "$wheel_dir"/specwatch-*.whl)
fi
[ -f "$WHEEL" ] || die "WHEEL=$WHEEL: no such file"
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade $PIP_ARGS "$WHEEL" \
  || die "pip install failed; the previous installation ($old_version) is unchanged"
new_version=$("$venv/bin/python" -m specwatch --version) || die "the installed specwatch does not run"
say "${old_version:+$old_version -> }$new_version in $venv (from $(basename "$WHEEL"))"
if [ -n "$DESTDIR" ]; then
  # What pip and venv wrote with the staging path in it (launchers' shebangs, the activate scripts,
  # pyvenv.cfg's `command`) is rewritten to the final path, as dh-virtualenv does for a .deb.
  grep -rlI --null -F "$venv" "$venv/bin" "$venv/pyvenv.cfg" | xargs -0 -r sed -i "s#$venv#$PREFIX#g"
  ! grep -rqI -F "$DESTDIR" "$venv" || die "files under $venv still name the staging root $DESTDIR"
fi
install -d -m 0755 "$venv/docs"
install -m 0644 "$src/docs/service.md" "$venv/docs/service.md" 2>/dev/null || true

# 3. The CLI on PATH, so on-call runs `sudo -u specwatch specwatch baseline accept ROUTE` as the runbook says.
install -d -m 0755 "$DESTDIR$BIN_DIR"
ln -sfn "$PREFIX/bin/specwatch" "$DESTDIR$BIN_DIR/specwatch"
say "linked $BIN_DIR/specwatch -> $PREFIX/bin/specwatch"

# 4. The config: an example on first install, never overwritten. It may hold engine credentials, so only
# root writes it and only the service's group reads it.
config_dir="$DESTDIR$CONFIG_DIR"
install -d -m 0750 "$config_dir"
config="$config_dir/specwatch.yml"
if [ ! -e "$config" ]; then
  cat >"$config" <<'YAML'
# specwatch configuration. Check it with: specwatch check-config --config.file=/etc/specwatch/specwatch.yml
# Apply changes without a restart: systemctl reload specwatch (a bad file is refused whole; the old one keeps
# running and specwatch_config_last_reload_successful drops to 0).
interval: 5s                 # sampling and evaluation period (keep WatchdogSec in the unit well above it)
state_dir: /var/lib/specwatch
scrape:
  timeout: 2s
gpu:
  enabled: auto              # auto | true | false
routes:
  # One entry per engine endpoint. engine: vllm | sglang | auto.
  - name: chat
    engine: auto
    url: http://127.0.0.1:8000/metrics
    # gpus: [0, 1]           # set when the engine runs as another user (see docs/service.md)
# otlp:                      # optional push of the same metrics over OTLP
#   endpoint: http://otel-collector:4318
#   protocol: http/protobuf
#   interval: 60s
YAML
  chmod 0640 "$config"
  say "wrote an example config to $config: edit its routes"
fi
if [ "$system" = yes ] && [ -z "$DESTDIR" ]; then
  if command -v systemd-tmpfiles >/dev/null; then
    systemd-tmpfiles --create "$tmpfiles_file"
  else
    chown "root:$SERVICE_USER" "$config_dir" "$config"
    chmod 0750 "$config_dir"
  fi
fi

# 5. The unit's arguments (EnvironmentFile=-/etc/default/specwatch), on first install only.
default_file="$DESTDIR$DEFAULT_FILE"
if [ ! -e "$default_file" ]; then
  install -d -m 0755 "$(dirname "$default_file")"
  cat >"$default_file" <<'ENV'
# Arguments of the specwatch service (read by its unit; `systemctl restart specwatch` after a change).
# Listen address: loopback by default. For a remote Prometheus, listen on all addresses and add TLS and
# basic auth with --web.config.file (docs/service.md).
#LISTEN_ADDRESS=0.0.0.0:9448
# Any other flags, e.g. ARGS="--web.config.file=/etc/specwatch/web.yml --log.level=debug --log.format=json"
ARGS=""
ENV
  chmod 0644 "$default_file"
  say "wrote $DEFAULT_FILE: the service's arguments"
fi

# 6. The unit, pointed at $PREFIX.
unit_dir="$DESTDIR$UNIT_DIR"
install -d -m 0755 "$unit_dir"
sed -e "s#$DEFAULT_PREFIX/#$PREFIX/#g" -e "s#=-/etc/default/specwatch#=-$DEFAULT_FILE#" \
  "$src/systemd/specwatch.service" >"$unit_dir/specwatch.service.tmp"
chmod 0644 "$unit_dir/specwatch.service.tmp"
mv "$unit_dir/specwatch.service.tmp" "$unit_dir/specwatch.service"
say "installed $UNIT_DIR/specwatch.service"

# 7. Validate with the new version before touching a running service.
if ! "$venv/bin/python" -m specwatch check-config --config.file="$config"; then
  die "$config does not pass check-config with $new_version: fix it, then systemctl restart specwatch"
fi

[ "$system" = yes ] || { say "files staged (--no-system)"; exit 0; }
if [ -n "$DESTDIR" ]; then
  systemctl --root="$DESTDIR" enable --quiet specwatch.service
  say "installed into $DESTDIR and enabled there; nothing started"
  say "on the target, once the tree is in place: systemd-sysusers specwatch.conf && systemd-tmpfiles --create specwatch.conf"
  exit 0
fi
systemctl daemon-reload
systemctl enable --quiet specwatch.service
if [ "$start" = no ]; then
  say "enabled, not started: systemctl start specwatch"
elif systemctl is-active --quiet specwatch.service; then
  systemctl restart specwatch.service
  say "restarted specwatch"
else
  systemctl start specwatch.service
  say "started specwatch"
fi
say "logs: journalctl -u specwatch -f; readiness: curl -fsS http://127.0.0.1:9448/-/ready"
