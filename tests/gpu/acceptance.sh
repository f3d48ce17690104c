#!/usr/bin/env bash
# GPU-machine checks beyond the program suite, one call: NVML through vcuda (nvidia-smi, PyTorch's NVML check),
# the manager path (manager + server + `vcuda run --manager`, `vcuda gpus` during and after), and a PyTorch
# probe. Usage: tests/gpu/acceptance.sh BUILD_DIR   (outputs under $OUT/acceptance when OUT is set)
set -u
build=$(cd "${1:?usage: tests/gpu/acceptance.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}/acceptance; mkdir -p "$out"
tmp=$(mktemp -d)
say() { echo "[acceptance] $*"; }
run() { "$build/bin/vcuda" run "$@"; }

say "--- NVML: nvidia-smi natively and through vcuda (quota 16GiB)"
"$build/bin/vcuda-server" --listen unix:$tmp/v.sock --memory-quota 16GiB 2> "$out/server-nvml.log" &
srv=$!; for i in $(seq 50); do [ -S $tmp/v.sock ] && break; sleep 0.1; done
nvidia-smi -L
run --server unix:$tmp/v.sock -- nvidia-smi -L
nvidia-smi --query-gpu=name,uuid,memory.total,memory.used,utilization.gpu --format=csv
run --server unix:$tmp/v.sock -- nvidia-smi --query-gpu=name,uuid,memory.total,memory.used,utilization.gpu --format=csv
run --server unix:$tmp/v.sock -- nvidia-smi > "$out/nvidia-smi.vcuda.txt" 2>&1; echo "vcuda nvidia-smi rc=$?"; head -20 "$out/nvidia-smi.vcuda.txt"
PYTORCH_NVML_BASED_CUDA_CHECK=1 run --server unix:$tmp/v.sock -- python3 -c \
  "import torch; print('torch NVML check: device_count', torch.cuda.device_count(), 'available', torch.cuda.is_available())"
say "--- PyTorch probe natively and through vcuda"
timeout 120 python3 "$here/frameworks/torch_probe.py" 2>&1 | tail -4
VCUDA_LOG_LEVEL=warn timeout 120 "$build/bin/vcuda" run --server unix:$tmp/v.sock -- python3 "$here/frameworks/torch_probe.py" 2>&1 | tail -6
kill $srv; wait $srv 2>/dev/null

say "--- manager: vcuda-mgmt + vcuda-server --manager + vcuda run --manager"
head -c 32 /dev/urandom | base64 > $tmp/secret; chmod 600 $tmp/secret
"$build/bin/vcuda-mgmt" --listen 127.0.0.1:7401 --db $tmp/m.db --secret-file $tmp/secret 2> "$out/mgmt.log" &
mg=$!
sleep 0.5
"$build/bin/vcuda-server" --listen 127.0.0.1:7402 --manager 127.0.0.1:7401 --secret-file $tmp/secret 2> "$out/server-mgmt.log" &
srv=$!
# Every call to the manager presents a credential: the operator's is made with the secret file, as on its host.
"$build/bin/vcuda" tokens create --tenant admin --operator --secret-file $tmp/secret -o $tmp/admin.cred --manager 127.0.0.1:7401
export VCUDA_CREDENTIAL_FILE=$tmp/admin.cred
for i in $(seq 50); do "$build/bin/vcuda" gpus --manager 127.0.0.1:7401 2>/dev/null | grep -q H[12]00 && break; sleep 0.2; done
say "vcuda gpus before:"; "$build/bin/vcuda" gpus --manager 127.0.0.1:7401
run --manager 127.0.0.1:7401 --memory 8G -- "$build/tests/programs/multi_thread" 3000 > "$out/multi_thread.mgmt.out" 2>&1 &
app=$!
sleep 2
say "vcuda gpus while a leased program runs:"; "$build/bin/vcuda" gpus --manager 127.0.0.1:7401
"$build/bin/vcuda" leases --manager 127.0.0.1:7401
wait $app; say "program through the manager: rc=$? $(tail -1 "$out/multi_thread.mgmt.out")"
sleep 3
say "vcuda gpus after:"; "$build/bin/vcuda" gpus --manager 127.0.0.1:7401
"$build/bin/vcuda" leases --manager 127.0.0.1:7401
kill $srv $mg; wait 2>/dev/null
rm -rf "$tmp"
