#!/usr/bin/env bash
# Install or upgrade specwatch as a systemd service on this node, from a checkout or unpacked sdist:
#
#   sudo scripts/install.sh             # install, or upgrade in place (the config is never overwritten)
#   sudo scripts/install.sh --no-start  # install files only; start it yourself after editing the config
#
# What it does: creates the system user `specwatch`; a virtualenv in $PREFIX (default /opt/specwatch) with
# specwatch and its dependencies; an example config at $CONFIG_DIR/specwatch.yml (default /etc/specwatch) when
# none exists; the unit at $UNIT_DIR/specwatch.service (default /etc/systemd/system). Before it restarts a
# running service it validates the config with the new version, so an upgrade never stops a working daemon
# over a config the new version refuses. Logs go to the journal: journalctl -u specwatch.
#
# Environment: PYTHON (interpreter for the venv, >= 3.10; default python3), PREFIX, CONFIG_DIR, UNIT_DIR,
# PIP_ARGS (extra pip arguments, e.g. "--no-index --find-links /srv/wheels" on offline nodes).
# --no-system stages files only (no user, no chown, no systemctl, no root needed): for packaging and tests.
set -euo pipefail

PYTHON=${PYTHON:-python3}
PREFIX=${PREFIX:-/opt/specwatch}
CONFIG_DIR=${CONFIG_DIR:-/etc/specwatch}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
PIP_ARGS=${PIP_ARGS:-}
SERVICE_USER=specwatch
DEFAULT_PREFIX=/opt/specwatch

start=yes
system=yes
for arg in "$@"; do
  case "$arg" in
    --no-start) start=no ;;
    --no-system) system=no; start=no ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a Python >= 3.10"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PYTHON is older than 3.10"

# 1. The service user: no login, no home of its own (state lives in the StateDirectory).
if [ "$system" = yes ] && ! getent passwd "$SERVICE_USER" >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /var/lib/specwatch --shell /usr/sbin/nologin \
    --comment "specwatch monitor" "$SERVICE_USER"
  say "created system user $SERVICE_USER"
fi

# 2. The virtualenv. Upgrades install over the existing venv; a failed pip run leaves the old version in place.
if [ ! -x "$PREFIX/bin/python" ]; then
  "$PYTHON" -m venv "$PREFIX" || die "python -m venv failed (Debian: apt-get install python3-venv)"
fi
old_version=$("$PREFIX/bin/specwatch" --version 2>/dev/null || true)
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
"$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade $PIP_ARGS "$src" \
  || die "pip install failed; the previous installation ($old_version) is unchanged"
new_version=$("$PREFIX/bin/specwatch" --version) || die "the installed specwatch does not run"
say "${old_version:+$old_version -> }$new_version in $PREFIX"
install -d -m 0755 "$PREFIX/docs"
install -m 0644 "$src/docs/service.md" "$PREFIX/docs/service.md" 2>/dev/null || true

# 3. The config: an example on first install, never overwritten.
install -d -m 0755 "$CONFIG_DIR"
config="$CONFIG_DIR/specwatch.yml"
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
  chmod 0644 "$config"
  say "wrote an example config to $config: edit its routes"
fi

# 4. The unit, pointed at $PREFIX.
install -d -m 0755 "$UNIT_DIR"
sed "s#$DEFAULT_PREFIX/#$PREFIX/#g" "$src/systemd/specwatch.service" >"$UNIT_DIR/specwatch.service.tmp"
chmod 0644 "$UNIT_DIR/specwatch.service.tmp"
mv "$UNIT_DIR/specwatch.service.tmp" "$UNIT_DIR/specwatch.service"
say "installed $UNIT_DIR/specwatch.service"

# 5. Validate with the new version before touching a running service.
if ! "$PREFIX/bin/specwatch" check-config --config.file="$config"; then
  die "$config does not pass check-config with $new_version: fix it, then systemctl restart specwatch"
fi

[ "$system" = yes ] || { say "files staged (--no-system)"; exit 0; }
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
