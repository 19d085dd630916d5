#!/usr/bin/env bash
# The allocation-failure sweep through the Redis store (tests/oom/test_oom.c,
# its redis_* calls): starts a redis-server of its own on a free 127.0.0.1
# port (no persistence: the sweep empties the database before every run),
# runs test_oom against it, and stops the server on exit whatever happens.
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler, $6 sanitizers.
set -u
build="$2"
test_bin="$build/tests/test_oom"
plugin="$(dirname "$3")/libkvmem-redis.so"
command -v redis-server >/dev/null || { echo "skipped: redis-server not installed (Debian package redis-server)"; exit 77; }
command -v redis-cli >/dev/null || { echo "skipped: redis-cli not installed (Debian package redis-tools)"; exit 77; }
[ -f "$plugin" ] || { echo "skipped: redis store: not built (libhiredis-dev not found)"; exit 77; }
[ -x "$test_bin" ] || { echo "skipped: $test_bin not built"; exit 77; }

tmp="$(mktemp -d /tmp/kvmem-redis-oom-XXXXXX)"
pidf="$tmp/redis.pid"
cleanup() {
  if [ -f "$pidf" ]; then
    pid="$(cat "$pidf" 2>/dev/null)"
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')"
# a unix socket and an ACL user too, so the URL's socket path, user and
# password are allocated (and failed) as well
redis-server --bind 127.0.0.1 --port "$port" --unixsocket "$tmp/redis.sock" --unixsocketperm 700 \
  --user oom on '>oom-secret' '~*' '&*' '+@all' --dir "$tmp" --save '' --appendonly no --daemonize yes \
  --pidfile "$pidf" --logfile "$tmp/redis.log" --protected-mode yes >/dev/null
up=0
for _ in $(seq 1 100); do
  [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ] && { up=1; break; }
  sleep 0.1
done
if [ $up != 1 ]; then
  echo "FAIL: redis-server did not start on 127.0.0.1:$port"
  tail -20 "$tmp/redis.log" 2>/dev/null
  exit 1
fi
echo "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port"
KVMEM_BACKEND_PATH="$(dirname "$3")" KVMEM_TEST_REDIS_PORT="$port" KVMEM_TEST_REDIS_SOCK="$tmp/redis.sock" \
  KVMEM_TEST_REDIS_AUTH="oom:oom-secret" "$test_bin"
