#!/usr/bin/env bash
# Make sure Prometheus, promtool, Alertmanager and amtool are installed (Debian/Ubuntu packages `prometheus` and
# `prometheus-alertmanager`). Used by CI and the end-to-end alerting test. Does nothing when all four are present.
# The packaged services are left alone: the tests run their own instances on free loopback ports.
set -euo pipefail

missing=()
for binary in prometheus promtool prometheus-alertmanager amtool; do
  command -v "$binary" >/dev/null 2>&1 || missing+=("$binary")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "ensure_prometheus: missing ${missing[*]}; installing prometheus and prometheus-alertmanager with apt-get" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_prometheus: apt-get not found; install Prometheus and Alertmanager (with promtool and amtool) yourself" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "ensure_prometheus: not root and no sudo; run as root: apt-get install prometheus prometheus-alertmanager" >&2
    exit 1
  fi
  sudo=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null

for binary in prometheus promtool prometheus-alertmanager amtool; do
  command -v "$binary" >/dev/null 2>&1 || { echo "ensure_prometheus: $binary still missing after install" >&2; exit 1; }
done
echo "ensure_prometheus: $(prometheus --version 2>&1 | head -1); $(prometheus-alertmanager --version 2>&1 | head -1)" >&2
