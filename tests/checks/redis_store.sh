#!/usr/bin/env bash
# The Redis store against real servers on loopback: starts redis-server on a
# free 127.0.0.1 port (append-only file, fsync always, in a temporary
# directory, so a killed and restarted server keeps what it acknowledged),
# runs tests/redis/test_redis_store.c against it, then the store bench with
# its URL. A 3-master cluster (redis-cli --cluster create) is added when it
# forms within 30 s. Every server started here is stopped on exit (trap),
# whatever happens.
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler, $6 sanitizers.
set -u
build="$2"
tool="$4"
test_bin="$build/tests/test_redis_store"
plugin="$(dirname "$3")/libkvmem-redis.so"
command -v redis-server >/dev/null || { echo "skipped: redis-server not installed (Debian package redis-server)"; exit 77; }
command -v redis-cli >/dev/null || { echo "skipped: redis-cli not installed (Debian package redis-tools)"; exit 77; }
[ -f "$plugin" ] || { echo "skipped: redis store: not built (libhiredis-dev not found)"; exit 77; }
[ -x "$test_bin" ] || { echo "skipped: $test_bin not built"; exit 77; }

tmp="$(mktemp -d /tmp/kvmem-redis-check-XXXXXX)"
pids_files=()
cleanup() {
  for f in "${pids_files[@]}"; do
    if [ -f "$f" ]; then
      pid="$(cat "$f" 2>/dev/null)"
      [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    fi
  done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
# a cluster node also listens on port + 10000 (its bus): both must be free
free_cluster_port() {
  python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(200):
    p = random.randint(20000, 55000)
    if free(p) and free(p + 10000):
        print(p); break
PY
}

wait_ping() { # port [tries of 0.1 s]
  for _ in $(seq 1 "${2:-100}"); do
    [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ] && return 0
    sleep 0.1
  done
  return 1
}

port="$(free_port)"
dir="$tmp/single"
mkdir -p "$dir"
pidf="$dir/redis.pid"
pids_files+=("$pidf")
# start.sh / kill.sh: the test kills the server mid-save and restarts it
cat >"$tmp/start.sh" <<EOF
redis-server --bind 127.0.0.1 --port $port --unixsocket $dir/redis.sock --unixsocketperm 700 \
  --dir $dir --appendonly yes --appendfsync always --save '' --daemonize yes --pidfile $pidf \
  --logfile $dir/redis.log --protected-mode yes >/dev/null
for i in \$(seq 1 100); do
  [ "\$(redis-cli -h 127.0.0.1 -p $port ping 2>/dev/null)" = "PONG" ] && exit 0
  sleep 0.1
done
exit 1
EOF
cat >"$tmp/kill.sh" <<EOF
pid=\$(cat $pidf) && kill -9 "\$pid" && while kill -0 "\$pid" 2>/dev/null; do sleep 0.05; done
EOF
if ! bash "$tmp/start.sh"; then
  echo "FAIL: redis-server did not start on 127.0.0.1:$port"
  cat "$dir/redis.log" 2>/dev/null | tail -20
  exit 1
fi
echo "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port"

# optional 3-master cluster on loopback, only if it forms quickly
cluster_node=""
if [ "${KVMEM_REDIS_NO_CLUSTER:-0}" != 1 ]; then
  start_s=$(date +%s)
  cports=()
  ok=1
  for i in 1 2 3; do
    cp="$(free_cluster_port)"
    cd_="$tmp/cluster$i"
    mkdir -p "$cd_"
    pids_files+=("$cd_/redis.pid")
    redis-server --bind 127.0.0.1 --port "$cp" --cluster-enabled yes --cluster-config-file "$cd_/nodes.conf" \
      --dir "$cd_" --save '' --appendonly no --daemonize yes --pidfile "$cd_/redis.pid" \
      --logfile "$cd_/redis.log" --protected-mode yes >/dev/null || ok=0
    cports+=("$cp")
  done
  for cp in "${cports[@]}"; do wait_ping "$cp" 50 || ok=0; done
  if [ $ok = 1 ] && timeout 25 redis-cli --cluster create "127.0.0.1:${cports[0]}" "127.0.0.1:${cports[1]}" \
       "127.0.0.1:${cports[2]}" --cluster-replicas 0 --cluster-yes >"$tmp/cluster.log" 2>&1; then
    while [ $(( $(date +%s) - start_s )) -lt 30 ]; do
      if redis-cli -h 127.0.0.1 -p "${cports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
        cluster_node="127.0.0.1:${cports[0]}"
        break
      fi
      sleep 0.2
    done
  fi
  if [ -n "$cluster_node" ]; then
    echo "3-master cluster formed in $(( $(date +%s) - start_s )) s at $cluster_node"
  else
    echo "note: the 3-node cluster did not form within 30 s: cluster test skipped"
    tail -5 "$tmp/cluster.log" 2>/dev/null
  fi
fi

fail=0
KVMEM_BACKEND_PATH="$(dirname "$3")" KVMEM_TEST_REDIS_PORT="$port" KVMEM_TEST_REDIS_SOCK="$dir/redis.sock" \
  KVMEM_TEST_REDIS_KILL="bash $tmp/kill.sh" KVMEM_TEST_REDIS_START="bash $tmp/start.sh" \
  KVMEM_TEST_REDIS_CLUSTER="$cluster_node" "$test_bin" || fail=1

# the store bench, pointed at this server (the bench starts nothing itself)
if [ -x "$tool" ]; then
  out="$(KVMEM_BACKEND_PATH="$(dirname "$3")" "$tool" bench --json --quick store --store "redis://127.0.0.1:$port/0?pool=bench" 2>&1)"
  rc=$?
  if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "has no benchmarks"; then
    echo "bench: this build has no benchmarks (KVMEM_BUILD_BENCH=OFF)"
  elif [ $rc -ne 0 ]; then
    echo "FAIL: kvmem bench store --store exited $rc:"
    printf '%s\n' "$out"
    fail=1
  else
    lines="$(printf '%s\n' "$out" | grep '"store":"redis"')"
    printf '%s\n' "$lines"
    n="$(printf '%s\n' "$lines" | grep -c '"redis_save_gbps":[0-9]')"
    if [ "$n" -lt 2 ]; then
      echo "FAIL: expected redis save/load lines for F16 and Q4 in the bench output:"
      printf '%s\n' "$out"
      fail=1
    fi
  fi
fi
exit $fail
