#!/usr/bin/env bash
# Installs everything walkit's tests need on a fresh Debian machine, then runs the whole suite.
# Fast tier only: scripts/test.sh -m fast      (extra arguments go to pytest; tiers: docs/internals/testing.md#tiers)
set -euo pipefail
cd "$(dirname "$0")/.."

# Real ZooKeeper and etcd servers for the metadata tests (walkit.testing.servers runs them), and
# redis-cli, redis-server, kcat and sqlite3 for the adapters' tests, OpenJDK 17 for the Spark adapter's tests.
missing=()
[ -e /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)      # the KV server's tests use redis-cli
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)   # ... and compare its replies with a real redis-server
command -v kcat >/dev/null 2>&1 || missing+=(kcat)                   # the topics broker's tests use kcat
command -v openssl >/dev/null 2>&1 || missing+=(openssl)             # the TLS tests make their certificates with it
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)       # the metrics tests scrape with a real Prometheus
command -v sqlite3 >/dev/null 2>&1 || missing+=(sqlite3)             # the SQLite replicator's tests read replicas with it
command -v ip >/dev/null 2>&1 || missing+=(iproute2)                 # walkit.testing.network makes namespaces, veths and tbf with ip and tc
command -v nft >/dev/null 2>&1 || missing+=(nftables)                # walkit.testing.network cuts links with nftables rules
dpkg -s openjdk-17-jre-headless >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)  # Spark 4 runs on Java 17
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install --quiet --disable-pip-version-check -e '.[all,test]'
# --no-loadscope-reorder: xdist runs the groups in collection order (tests/conftest.py puts the
# long network, Spark and process groups first), not its default of the largest groups first.
python3 -m pytest -q --durations=30 -n 2 --dist loadgroup --no-loadscope-reorder "$@"
