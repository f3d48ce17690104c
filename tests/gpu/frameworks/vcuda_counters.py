# vcuda's call counters, read from its private export table in the libcuda.so.1 this process uses.
#
#   import vcuda_counters
#   c = vcuda_counters.read()   # (sync_round_trips, async_calls) since the process started, or None
#
# The table is found with cuGetExportTable(&table, &id), id = the 16 bytes of VCUDA_PRIVATE_TABLE_ID (32 hex
# characters, exported by run_frameworks.sh for vcuda runs only). The table is an array of 64-bit words: word 0
# is its size in bytes, word VCUDA_COUNTERS_SLOT (default 3) is
#   int fn(unsigned long long* sync_round_trips, unsigned long long* async_calls)   (0 = success).
# Natively (no id, or the real driver refusing the id) read() returns None.
import ctypes
import os

_fn = None
_looked_up = False


def _lookup():
    hex_id = os.environ.get("VCUDA_PRIVATE_TABLE_ID", "").strip()
    try:
        raw = bytes.fromhex(hex_id)
        slot = int(os.environ.get("VCUDA_COUNTERS_SLOT", "3"))
    except ValueError:
        return None
    if len(raw) != 16 or slot < 1:
        return None
    try:  # the libcuda.so.1 already loaded (vcuda's under `vcuda run`); load it only if nothing has yet
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
    get = getattr(lib, "cuGetExportTable", None)
    if get is None:
        return None
    get.restype = ctypes.c_int
    get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    table = ctypes.c_void_p()
    uuid = (ctypes.c_ubyte * 16).from_buffer_copy(raw)
    if get(ctypes.byref(table), ctypes.byref(uuid)) != 0 or not table.value:
        return None
    size = ctypes.c_uint64.from_address(table.value).value
    if size < 8 * (slot + 1):  # an older table without the counters slot
        return None
    ptr = ctypes.c_uint64.from_address(table.value + 8 * slot).value
    if not ptr:
        return None
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_ulonglong))
    return proto(ptr)


def read():
    """(sync_round_trips, async_calls) so far, or None where the counters are not available."""
    global _fn, _looked_up
    if not _looked_up:
        _fn, _looked_up = _lookup(), True
    if _fn is None:
        return None
    sync, asyn = ctypes.c_ulonglong(), ctypes.c_ulonglong()
    if _fn(ctypes.byref(sync), ctypes.byref(asyn)) != 0:
        return None
    return sync.value, asyn.value


def available():
    return read() is not None


if __name__ == "__main__":
    print("counters:", read())
