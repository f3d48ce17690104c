#!/usr/bin/env bash
# CI integration test of the manager path on the software driver: one vcuda-mgmt, two vcuda-servers attached
# to it, and clients that lease GPUs instead of naming a server.
#   1. a client asking for 2 GPUs gets one on each server and runs a program that uses devices 0 and 1 (device
#      1's stream waits for an event of device 0's, then copies from it); a peer copy between them is refused
#      with the reason;
#   2. a client with a forged token, or none, is refused by the server;
#   3. `vcuda gpus` and `vcuda leases` show the inventory, and the lease is gone when the client is;
#   4. an operator releases a running client's lease; a client without a credential gets no lease, another
#      tenant cannot release it.
#   5. on two servers without address windows (the same device addresses), the client refuses the overlapping
#      allocation with the reason.
#   6. a server whose window is its own choice (--address-window auto) and taken is given a free one by the
#      manager, and places its sessions' memory there.
# Before 1, a third server asking for server a's address window is refused by the manager.
# The operator's credential is made with the shared secret file (as on the manager's host), the tenant's with it.
# Usage: manager_two_servers.sh BUILD_DIR
set -u
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/vcuda-mgr-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
wait_socket() { for i in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done; fail "no socket $1"; }

head -c 32 /dev/urandom | base64 > "$tmp/secret"; chmod 600 "$tmp/secret"
"$build/bin/vcuda-mgmt" --listen "unix:$tmp/m.sock" --db "$tmp/m.db" --secret-file "$tmp/secret" --lease-ttl 5s \
  --log-level debug 2> "$tmp/mgmt.log" & pids+=($!)
wait_socket "$tmp/m.sock"
# Address windows of their own: `auto` hashes the socket path (a random folder), and two servers given one window
# hand out the same device addresses, which one client using both cannot tell apart (clean-clone CI of eae3848:
# two_devices read zeros, "element 1 is 0.000000, expected 11.000000").
for s in a b; do
  id=$([ $s = a ] && echo 1 || echo 2)
  VCUDA_SOFT_HOST_ID=$id "$build/bin/vcuda-server" --listen "unix:$tmp/$s.sock" --advertise "unix:$tmp/$s.sock" \
    --address-window "$id" \
    --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" --secret-file "$tmp/secret" \
    --log-level debug 2> "$tmp/server-$s.log" & pids+=($!)
  wait_socket "$tmp/$s.sock"
done
# The first operator credential, made on "the manager's host" with the secret file; then a tenant's.
"$build/bin/vcuda" tokens create --tenant admin --operator --secret-file "$tmp/secret" -o "$tmp/admin.cred" \
  --manager "unix:$tmp/m.sock" || fail "vcuda tokens create with the secret file"
vcuda() { "$build/bin/vcuda" "$@" --manager "unix:$tmp/m.sock" --credential "$tmp/admin.cred"; }
vcuda tokens create --tenant alice -o "$tmp/alice.cred" || fail "vcuda tokens create --tenant alice"
vcuda tokens create --tenant bob -o "$tmp/bob.cred" || fail "vcuda tokens create --tenant bob"
vcuda tokens list
for i in $(seq 100); do [ "$(vcuda gpus --json 2>/dev/null | grep -o '"uuid"' | wc -l)" -ge 2 ] && break; sleep 0.1; done
vcuda gpus || fail "vcuda gpus"
[ "$(vcuda gpus --json | grep -o '"uuid"' | wc -l)" -eq 2 ] || fail "the manager does not list both servers' GPUs"
# A third server asking for server a's window is refused: it would hand out a's device addresses. It says so,
# with the free windows, and its GPU is not leased.
VCUDA_SOFT_HOST_ID=3 "$build/bin/vcuda-server" --listen "unix:$tmp/c.sock" --advertise "unix:$tmp/c.sock" \
  --address-window 1 --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" \
  --secret-file "$tmp/secret" 2> "$tmp/server-c.log" & server_c=$!; pids+=($server_c)
for i in $(seq 100); do grep -q "refused this server" "$tmp/server-c.log" && break; sleep 0.1; done
grep -q "the manager at unix:$tmp/m.sock refused this server: address window 1 is server srv-.* free one (0, 3, 4" \
  "$tmp/server-c.log" || fail "a server in another's address window was not refused with the reason"
grep -q "server.register from host .* refused: address window 1" "$tmp/mgmt.log" ||
  fail "the manager did not log the refused registration"
[ "$(vcuda gpus --json | grep -o '"uuid"' | wc -l)" -eq 2 ] || fail "the refused server's GPU was listed"
vcuda servers | grep -q "unix:$tmp/a.sock *1 " || fail "vcuda servers does not show server a's window: $(vcuda servers)"
kill "$server_c"; wait "$server_c" 2>/dev/null

# 1. two GPUs on two servers in one process
out=$("$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --gpus 2 --memory 256M --credential "$tmp/alice.cred" -- \
      "$build/tests/programs/two_devices" 2>&1) || fail "two_devices through a lease: $out"
echo "$out"
echo "$out" | grep -q "devices: 2" || fail "the client did not get 2 devices"
echo "$out" | grep -q "PASS two_devices" || fail "two_devices did not pass"
echo "$out" | grep -q "device 1 waited for device 0's event and copied from it: ok" ||
  fail "a stream of one server did not wait for an event of the other's"
grep -q "session .* opened" "$tmp/server-a.log" || fail "server a served no session"
grep -q "session .* opened" "$tmp/server-b.log" || fail "server b served no session"
# Every process of a job numbers the GPUs alike, whatever order the manager lists a lease's GPUs in (two DDP
# ranks, each with a lease of its own, found themselves on one GPU when the manager listed the second lease's
# GPUs the other way round). The manager lists the fuller GPU first (best fit): a client holding 128 MiB of
# one GPU makes the next lease list that GPU first. The devices keep one order (by PCI bus id, then UUID).
props() {
  "$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --gpus 2 --memory 128M --credential "$tmp/alice.cred" -- \
    "$build/tests/programs/device_props" > "$tmp/order-$1.out" 2>&1 || fail "device_props through a lease of 2 GPUs"
  grep -E "^  (uuid|pci) = " "$tmp/order-$1.out" > "$tmp/order-$1.ids"
}
props 1
[ "$(grep -c uuid "$tmp/order-1.ids")" -eq 2 ] || fail "device_props did not list 2 devices: $(cat "$tmp/order-1.out")"
# The holder goes to the GPU of the larger UUID (the other cordoned meanwhile), which the manager then lists
# first: out of the order the devices must keep.
gpu_a=$(vcuda gpus --json | python3 -c 'import json,sys; print(min(g["uuid"] for g in json.load(sys.stdin)["gpus"]))')
leases() { vcuda leases --json | grep -o '"lease_id"' | wc -l; }
for i in $(seq 100); do [ "$(leases)" -eq 0 ] && break; sleep 0.1; done  # the first client's is gone
vcuda cordon "$gpu_a" > /dev/null || fail "vcuda cordon $gpu_a"
"$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --memory 128M --credential "$tmp/alice.cred" -- \
  "$build/tests/programs/multi_thread" 20000 > "$tmp/holder.out" 2>&1 &
holder=$!
for i in $(seq 100); do [ "$(leases)" -ge 1 ] && break; sleep 0.1; done
vcuda uncordon "$gpu_a" > /dev/null || fail "vcuda uncordon $gpu_a"
props 2
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
cmp -s "$tmp/order-1.ids" "$tmp/order-2.ids" ||
  fail "two clients numbered the GPUs differently: $(paste "$tmp/order-1.ids" "$tmp/order-2.ids")"
# ... and that order is PCI bus id, then UUID (each device's uuid line comes before its pci line).
paste - - < "$tmp/order-2.ids" | awk '{ print $6, $3 }' | sort -c ||
  fail "the GPUs are not numbered by PCI bus id and UUID: $(cat "$tmp/order-2.ids")"
# Devices of two servers are not peers: a peer copy between them is refused with the reason, logged by name.
out=$("$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --gpus 2 --memory 256M --credential "$tmp/alice.cred" -- \
      env VCUDA_LOG_FILE="$tmp/peer-client.log" "$build/tests/programs/peer_copies" refusal-ok 2>&1) ||
  fail "peer_copies through a lease: $out"
echo "$out"
echo "$out" | grep -q "device 0 CANNOT access device 1" || fail "devices of two servers were reported peers"
echo "$out" | grep -q "devices 0 -> 1: peer copy refused: cudaErrorPeerAccessUnsupported" ||
  fail "a peer copy across servers was not refused"
grep -q "peer copy between devices of different vcuda servers: vcuda answers CUDA_ERROR_PEER_ACCESS_UNSUPPORTED" \
  "$tmp/peer-client.log" || fail "the client did not log why it refused the peer copy"

# 2. no token, a forged token: refused
out=$(VCUDA_SERVER="unix:$tmp/a.sock" LD_LIBRARY_PATH="$build/lib/vcuda" "$build/tests/programs/vector_add" 2>&1) && fail "a client without a token was served"
grep -q "lease token is required" "$tmp/server-a.log" || fail "server a did not say why it refused the tokenless client"
out=$(VCUDA_SERVER="unix:$tmp/a.sock" VCUDA_TOKEN="v1.forged.token" LD_LIBRARY_PATH="$build/lib/vcuda" \
      "$build/tests/programs/vector_add" 2>&1) && fail "a client with a forged token was served"
grep -q "lease token rejected" "$tmp/server-a.log" || fail "server a did not reject the forged token"

# 3. the lease is gone once the client is (released by the client, or expired)
for i in $(seq 80); do [ "$(vcuda leases --json | grep -o '"lease_id"' | wc -l)" -eq 0 ] && break; sleep 0.1; done
[ "$(vcuda leases --json | grep -o '"lease_id"' | wc -l)" -eq 0 ] || fail "the lease outlived its client"
# 4. no credential: no lease
out=$("$build/bin/vcuda" run --manager "unix:$tmp/m.sock" -- "$build/tests/programs/vector_add" 2>&1) && fail "a client without a credential got a lease"
echo "$out" | grep -q "VCUDA_CREDENTIAL" || fail "the client without a credential was not told what it needs: $out"
# an operator releases a running client's lease: the server ends that client's session
VCUDA_CREDENTIAL=$(cat "$tmp/alice.cred") "$build/bin/vcuda" run --manager "unix:$tmp/m.sock" -- \
  "$build/tests/programs/multi_thread" 20000 > "$tmp/long.out" 2>&1 &
long=$!
for i in $(seq 100); do lease=$(vcuda leases --json | grep -o '"lease_id": *"[^"]*"' | head -1 | sed 's/.*"\(lease-[^"]*\)"/\1/'); [ -n "$lease" ] && break; sleep 0.1; done
[ -n "$lease" ] || fail "the long-running client got no lease"
sleep 1
out=$("$build/bin/vcuda" release "$lease" --manager "unix:$tmp/m.sock" --credential "$tmp/bob.cred" 2>&1) && fail "tenant bob released alice's lease"
echo "$out" | grep -q "belongs to tenant alice" || fail "bob was not told why: $out"
vcuda release "$lease" || fail "vcuda release $lease"
for i in $(seq 300); do kill -0 $long 2>/dev/null || break; sleep 0.1; done
if kill -0 $long 2>/dev/null; then kill $long; fail "the client kept running after its lease was released"; fi
grep -q "was released or expired" "$tmp"/server-*.log || fail "no server ended the released lease's session"
# 5. Two servers without address windows hand out the same device addresses: a client leasing a GPU of each
# refuses the second server's allocation, saying why, instead of mixing the two servers' memory up.
gpus_before=$(vcuda gpus --json | python3 -c 'import json,sys; print(" ".join(g["uuid"] for g in json.load(sys.stdin)["gpus"]))')
for s in c d; do
  id=$([ $s = c ] && echo 3 || echo 4)
  VCUDA_SOFT_HOST_ID=$id "$build/bin/vcuda-server" --listen "unix:$tmp/$s.sock" --advertise "unix:$tmp/$s.sock" \
    --address-window none --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" \
    --secret-file "$tmp/secret" 2> "$tmp/server-$s.log" & pids+=($!)
  wait_socket "$tmp/$s.sock"
done
for g in $gpus_before; do vcuda cordon "$g" > /dev/null || fail "vcuda cordon $g"; done
for i in $(seq 100); do [ "$(vcuda gpus --json | grep -o '"uuid"' | wc -l)" -ge 4 ] && break; sleep 0.1; done
out=$("$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --gpus 2 --memory 256M --credential "$tmp/alice.cred" -- \
      env VCUDA_LOG_FILE="$tmp/overlap-client.log" "$build/tests/programs/two_devices" 2>&1) &&
  fail "two_devices passed on two servers handing out the same addresses: $out"
grep -q "overlaps memory of another device this process holds" "$tmp/overlap-client.log" ||
  fail "the client did not refuse the overlapping allocation: $out; $(tail -5 "$tmp/overlap-client.log")"
# 6. `auto` hashes the listen address: server e's choice, learned from a run of its own, is made another's
# (server f's, unless a or b holds it), then e under the manager gets a free window and uses it.
VCUDA_SOFT_HOST_ID=6 "$build/bin/vcuda-server" --listen "unix:$tmp/e.sock" --driver "$build/lib/libvcuda-softdriver.so" \
  2> "$tmp/probe-e.log" & probe=$!
wait_socket "$tmp/e.sock"; kill $probe; wait $probe 2>/dev/null; rm -f "$tmp/e.sock"
chosen=$(sed -n 's/.*address window \([0-9]*\) (auto.*/\1/p' "$tmp/probe-e.log")
[ -n "$chosen" ] || fail "server e did not say which window it chose: $(cat "$tmp/probe-e.log")"
if [ "$chosen" != 1 ] && [ "$chosen" != 2 ]; then
  VCUDA_SOFT_HOST_ID=5 "$build/bin/vcuda-server" --listen "unix:$tmp/f.sock" --advertise "unix:$tmp/f.sock" \
    --address-window "$chosen" --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" \
    --secret-file "$tmp/secret" 2> "$tmp/server-f.log" & pids+=($!)
  wait_socket "$tmp/f.sock"
  for i in $(seq 100); do grep -q "registered with the manager" "$tmp/server-f.log" && break; sleep 0.1; done
fi
for g in $(vcuda gpus --json | python3 -c 'import json,sys; print(" ".join(g["uuid"] for g in json.load(sys.stdin)["gpus"]))'); do
  vcuda cordon "$g" > /dev/null || fail "vcuda cordon $g"
done
VCUDA_SOFT_HOST_ID=6 "$build/bin/vcuda-server" --listen "unix:$tmp/e.sock" --advertise "unix:$tmp/e.sock" \
  --driver "$build/lib/libvcuda-softdriver.so" --manager "unix:$tmp/m.sock" --secret-file "$tmp/secret" \
  2> "$tmp/server-e.log" & pids+=($!)
wait_socket "$tmp/e.sock"
for i in $(seq 100); do grep -q "registered with the manager" "$tmp/server-e.log" && break; sleep 0.1; done
given=$(sed -n "s/.*address window $chosen is another server's: the manager at .* gave this server window \([0-9]*\)/\1/p" \
  "$tmp/server-e.log")
[ -n "$given" ] && [ "$given" != "$chosen" ] || fail "server e was not given another window than $chosen"
grep -q "address window $given (it asked for $chosen, another server's)" "$tmp/mgmt.log" ||
  fail "the manager did not log the window it gave"
vcuda events | grep -q "chose address window $chosen, another server's: given window $given" ||
  fail "vcuda events does not show the window given: $(vcuda events)"
vcuda servers | grep -q "unix:$tmp/e.sock *$given " || fail "vcuda servers does not show e's window $given: $(vcuda servers)"
out=$("$build/bin/vcuda" run --manager "unix:$tmp/m.sock" --gpus 1 --credential "$tmp/alice.cred" -- \
      "$build/tests/programs/vector_add" 2>&1) || fail "vector_add on server e: $out"
grep -q "address window $given: sessions' memory at" "$tmp/server-e.log" ||
  fail "server e did not place its session's memory in window $given: $(grep 'address window' "$tmp/server-e.log")"
echo "PASS manager_two_servers"
