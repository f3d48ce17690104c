#!/usr/bin/env python3
"""Generates vcuda's driver surface from one annotated spec.

Inputs: protocol/spec/driver.spec (what vcuda implements, how each call travels, stable op ids), the toolkit's
cuda.h (prototypes), the stub libcuda.so (the exported symbol list: every one must exist in the client) and
protocol/procaddress-driver580.tsv (the real driver's cuGetProcAddress answers).

Outputs (build tree only, never edited by hand):
  ops.hpp                 op ids and names, shared by client and server
  client_exports.map      linker version script: exactly the driver's symbols are exported
  export_symbols.txt      the same list, for tests
  client_stubs.cpp        generated client functions: plain calls, per-thread-stream variants
  client_unsupported.cpp  a CUDA_ERROR_NOT_SUPPORTED stub for every other symbol
  client_trace.hpp/.cpp   the record mode (VCUDA_TRACE, client/TRACE.md): for every exported symbol, a function
                          that calls the real driver's and writes one line with its arguments, result and time
  procaddress_table.cpp   cuGetProcAddress answers per (name, version, flags)
  server_dispatch.cpp     the server's allowlist: op -> handler, generated handlers for plain calls
  driver_table.hpp/.cpp   the server's table of real-driver entry points, loaded with dlsym
  surface.md              how each of the driver's entry points is served, counted (README.md holds a copy,
                          kept equal by the test readme.surface)
  server_ops.hpp, client_ops.hpp, op_signatures.hpp, ops.md
                          from the signatures of described hand-written ops (tools/gen_ops.py): the server's
                          decoding into named arguments, the client's encoding, a table for tests, and
                          protocol/OPS.md (kept equal by the test protocol.ops_doc)
"""
import argparse
import os
import re
import subprocess
import sys

import gen_ops
from gen_ops import write_if_changed

# Opaque handle types -> the handle kind the session tables use (common/handle_kind.hpp).
HANDLE_TYPES = {
    'CUcontext': 'context', 'CUmodule': 'module', 'CUfunction': 'function', 'CUlibrary': 'library',
    'CUkernel': 'kernel', 'CUstream': 'stream', 'CUevent': 'event', 'CUgraph': 'graph',
    'CUgraphExec': 'graph_exec', 'CUgraphNode': 'graph_node', 'CUmemoryPool': 'mem_pool',
    'CUlinkState': 'link_state', 'CUarray': 'array',
}
# Scalar types that travel by value in a u64 (enums are recognised by their CU..._enum / typedef names).
SCALAR_TYPES = {
    'int', 'unsigned int', 'unsigned', 'size_t', 'unsigned long long', 'long long', 'float', 'double', 'char',
    'unsigned char', 'short', 'unsigned short', 'CUdevice', 'CUdeviceptr', 'cuuint32_t', 'cuuint64_t',
    'CUdevice_v1', 'CUdeviceptr_v2', 'CUtexObject', 'CUsurfObject',
}


def die(msg):
    print(f'gen_driver_api: error: {msg}', file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------------------------------------------ inputs

def read_prototypes(cuda_include):
    """All CUresult functions declared by cuda.h (+ cudaProfiler.h), old ABI versions included."""
    src = '#include <cuda.h>\n#include <cudaProfiler.h>\n'
    out = subprocess.run(['cc', '-E', '-P', '-D__CUDA_API_VERSION_INTERNAL', '-I', cuda_include, '-x', 'c', '-'],
                         input=src, capture_output=True, text=True)
    if out.returncode != 0:
        die('preprocessing cuda.h failed:\n' + out.stderr)
    text = re.sub(r'\s+', ' ', out.stdout)
    protos = {}
    for stmt in re.split(r'[;{}]', text):
        m = re.search(r'\bCUresult (?:__attribute__\(\(deprecated\)\) )?(\w+) ?\((.*)\) ?$', stmt.strip())
        if m:
            protos[m.group(1)] = parse_params(m.group(2))
    return protos


def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch == '(':
            depth += 1
        elif ch == ')':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_params(text):
    text = text.strip()
    if text in ('', 'void'):
        return []
    params = []
    for i, p in enumerate(split_top(text)):
        p = p.strip()
        arrays = p.count('[')
        p = re.sub(r'\[[^\]]*\]', '', p).strip()
        m = re.match(r'^(.*?)(\w+)$', p)
        if not m or not m.group(1).strip():
            typ, name = p, f'p{i}'
        else:
            typ, name = m.group(1).strip(), m.group(2)
        typ = re.sub(r'\s*\*\s*', '*', typ).replace('*', ' *').replace('  ', ' ').strip()
        typ = typ + ' *' * arrays
        params.append((typ.replace(' *', '*'), name))
    return params


def read_stub_symbols(stub):
    out = subprocess.run(['nm', '-D', '--defined-only', stub], capture_output=True, text=True)
    if out.returncode != 0:
        die(f'nm {stub} failed: {out.stderr}')
    syms = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    return sorted(set(s.split('@')[0] for s in syms))


# The annotations a `fn` line may carry (the spec's header says what each does).
ANNOTATIONS = {'destroy', 'cached', 'uncaches', 'optional_outs', 'shared_sync', 'not_peers', 'device_work',
               'charge', 'server', 'observes'}
outside_gate = set()  # ops that run while a session is suspended (annotation outside_gate)
op_signatures = {}  # hand-written op -> its signature (tools/gen_ops.py), or None
op_docs = {}  # hand-written op -> the comment on its spec line


def read_spec(path):
    fns, ops = {}, {}
    global outside_gate
    used_ids = {}
    for lineno, raw in enumerate(open(path), 1):
        line = raw.split('#', 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f'{path}:{lineno}'
        if words[0] == 'op':
            m = re.fullmatch(r'op\s+(\w+)\s+(\d+)(\s+outside_gate)?(.*)', line)
            if not m:
                die(f'{where}: expected "op NAME ID [outside_gate] [SIGNATURE]"')
            name, oid = m.group(1), int(m.group(2))
            ops[name] = oid
            if m.group(3):
                outside_gate.add(name)
            op_signatures[name] = gen_ops.parse(where, name, m.group(4), die)
            if '#' in raw:
                op_docs[name] = raw.split('#', 1)[1].strip()
        elif words[0] == 'fn':
            if len(words) < 3:
                die(f'{where}: expected "fn NAME CLASS [OP] [ANNOT...]"')
            name, klass = words[1], words[2]
            entry = {'class': klass, 'annot': {}}
            rest = words[3:]
            if klass in ('sync', 'async'):
                if not rest:
                    die(f'{where}: {klass} function needs an op id')
                entry['op'] = int(rest[0])
                ops[name] = entry['op']
                rest = rest[1:]
            elif klass not in ('hand', 'local'):
                die(f'{where}: unknown class {klass}')
            for a in rest:
                k, _, v = a.partition('=')
                if k not in ANNOTATIONS:
                    die(f'{where}: unknown annotation {k} (known: {", ".join(sorted(ANNOTATIONS))})')
                entry['annot'][k] = v
            if name in fns:
                die(f'{where}: {name} listed twice')
            fns[name] = entry
        else:
            die(f'{where}: lines start with "fn" or "op"')
    for name, oid in ops.items():
        if oid in used_ids:
            die(f'op id {oid} used by both {used_ids[oid]} and {name}')
        used_ids[oid] = name
    return fns, ops


def read_procaddress(path):
    table = []
    for raw in open(path):
        if raw.startswith('#') or not raw.strip():
            continue
        cols = raw.rstrip('\n').split('\t')
        name = cols[0]
        default, ptds = [], None
        for col in cols[1:]:
            col = col.strip()
            if col.startswith('ptds:'):
                ptds = [tuple(x.split(':', 1)) for x in col[5:].split()]
            else:
                default += [tuple(x.split(':', 1)) for x in col.split()]
        table.append((name, [(int(v), s) for v, s in default],
                      None if ptds is None else [(int(v), s) for v, s in ptds]))
    return table


# ------------------------------------------------------------------------------------------------ classification

def base_type(t):
    return t.replace('const ', '').replace('*', '').strip()


def is_scalar(t):
    return t in SCALAR_TYPES or t.endswith('_enum') or re.fullmatch(r'CU\w+', t) is not None and t not in HANDLE_TYPES


def classify(fn, params, annot):
    """Returns [(role, type, name, extra)] with role in: in_scalar, in_handle, in_device, out_scalar, out_handle."""
    result = []
    for typ, name in params:
        ptr = typ.count('*')
        bt = base_type(typ)
        if ptr == 0:
            if bt in HANDLE_TYPES:
                role = 'destroy_handle' if annot.get('destroy') == name else 'in_handle'
                result.append((role, bt, name, HANDLE_TYPES[bt]))
            elif bt == 'CUdevice':
                result.append(('in_device', bt, name, None))
            elif is_scalar(bt):
                result.append(('in_scalar', bt, name, None))
            else:
                die(f'{fn}: cannot classify parameter {typ} {name}; write it by hand (class hand)')
        elif ptr == 1 and not typ.startswith('const'):
            if bt in HANDLE_TYPES:
                result.append(('out_handle', bt, name, HANDLE_TYPES[bt]))
            elif bt in SCALAR_TYPES or bt.endswith('_enum') or is_scalar(bt):
                result.append(('out_scalar', bt, name, None))
            else:
                die(f'{fn}: cannot classify pointer parameter {typ} {name}; write it by hand (class hand)')
        else:
            die(f'{fn}: parameter {typ} {name} needs hand-written marshalling (class hand)')
    return result


# ------------------------------------------------------------------------------------------------ emitters

HEADER = '// Generated by tools/gen_driver_api.py from protocol/spec/driver.spec. Do not edit.\n'


def emit_ops(out, ops):
    lines = [HEADER, '#pragma once\n', '#include <cstdint>\n#include <string_view>\n',
             'namespace vcuda {\n', 'enum class op : uint32_t {']
    for name, oid in sorted(ops.items(), key=lambda x: x[1]):
        lines.append(f'    {name} = {oid},')
    lines.append('};\n')
    lines.append(f'inline constexpr uint32_t op_id_limit = {max(ops.values()) + 1};\n')
    lines.append('constexpr std::string_view op_name(op o) {\n    switch (o) {')
    for name, oid in sorted(ops.items(), key=lambda x: x[1]):
        lines.append(f'        case op::{name}: return "{name}";')
    lines.append('    }\n    return "unknown op";\n}\n')
    lines.append('}  // namespace vcuda\n')
    write_if_changed(os.path.join(out, 'ops.hpp'), '\n'.join(lines))


def emit_exports(out, symbols):
    write_if_changed(os.path.join(out, 'client_exports.map'),
                     '/* ' + HEADER.strip()[3:] + ' */\n{\n  global:\n' + ''.join(f'    {s};\n' for s in symbols) +
                     '  local:\n    *;\n};\n')
    write_if_changed(os.path.join(out, 'export_symbols.txt'), '\n'.join(symbols) + '\n')


def cdecl(params):
    return ', '.join(f'{t} {n}' for t, n in params)


def emit_client(out, fns, protos, symbols):
    implemented = set(fns)
    body = [HEADER,
            '// Plain calls marshalled by vcuda::client::plain_call, per-thread-stream variants forwarding to',
            '// their base function, and a NOT_SUPPORTED stub for every other symbol of the driver.',
            '#define __CUDA_API_VERSION_INTERNAL 1',
            '#include <cuda.h>',
            '#include <cudaProfiler.h>',
            '#include "client/deferred_copies.hpp"',
            '#include "client/managed.hpp"',
            '#include "client/plain_call.hpp"',
            '#include "client/trace.hpp"',
            '#include "ops.hpp"',
            '',
            'using vcuda::client::ipc_shared;',
            'using vcuda::client::plain_call;',
            'using vcuda::handle_kind;',
            '',
            'extern "C" {']
    unsupported = []
    for sym in symbols:
        spec = fns.get(sym)
        if spec and spec['class'] in ('sync', 'async'):
            body.append(client_plain(sym, spec, protos[sym]))
        elif spec:
            continue  # hand-written in client/
        else:
            base = re.sub(r'_pt(sz|ds)$', '', sym)
            if base != sym and base in implemented and sym in protos and base in protos:
                body.append(client_ptsz(sym, base, protos[sym], protos[base]))
            else:
                unsupported.append(sym)
    body.append('}  // extern "C"\n')
    write_if_changed(os.path.join(out, 'client_stubs.cpp'), '\n'.join(body))

    # Unsupported stubs: they log their name once and answer CUDA_ERROR_NOT_SUPPORTED, or, in record mode,
    # forward to the real driver like every other exported function.
    lines = [HEADER, '#define __CUDA_API_VERSION_INTERNAL 1', '#include <cuda.h>', '#include <cudaProfiler.h>',
             '#include "client/trace.hpp"', '#include "client/unsupported.hpp"\n', 'extern "C" {']
    for sym in unsupported:
        if sym not in protos:
            # No prototype to forward with: the C ABI lets a function declared without parameters be called
            # with any. It answers NOT_SUPPORTED in record mode too.
            print(f'gen_driver_api: warning: {sym} has no prototype in cuda.h; record mode cannot forward it',
                  file=sys.stderr)
            lines.append(f'__attribute__((visibility("default"))) int {sym}() noexcept '
                         f'{{ return vcuda::client::unsupported("{sym}"); }}')
            continue
        params = protos[sym]
        lines.append(f'__attribute__((visibility("default"))) CUresult {sym}({cdecl(params)}) noexcept {{\n'
                     f'    {trace_hook(sym, params)}\n'
                     f'    return static_cast<CUresult>(vcuda::client::unsupported("{sym}"));\n}}')
    lines.append('}  // extern "C"\n')
    write_if_changed(os.path.join(out, 'client_unsupported.cpp'), '\n'.join(lines))
    return unsupported


def client_plain(name, spec, params):
    roles = classify(name, params, spec['annot'])
    lines = [f'__attribute__((visibility("default"))) CUresult {name}({cdecl(params)}) noexcept {{',
             f'    {trace_hook(name, params)}']
    optional = 'optional_outs' in spec['annot']  # the driver lets callers pass NULL for outputs they skip
    for role, typ, pname, kind in roles:
        if role.startswith('out') and not optional:
            lines.append(f'    if (!{pname}) return CUDA_ERROR_INVALID_VALUE;')
    if 'device_work' in spec['annot']:
        lines.append('    if (CUresult rc = vcuda::client::managed_before_launch(); rc != CUDA_SUCCESS) return rc;')
    lines.append(f'    plain_call c(vcuda::op::{name}, "{name}");')
    for role, typ, pname, kind in roles:
        if role == 'in_scalar':
            lines.append(f'    c.arg({pname});')
        elif role == 'in_device':
            lines.append(f'    c.device({pname});')
        elif role in ('in_handle', 'destroy_handle'):
            lines.append(f'    c.handle({pname}, handle_kind::{kind});')
    if 'not_peers' in spec['annot']:
        # Devices of two sessions (servers) are not peers: every answer about them is 0, asked of neither.
        outs = [pname for role, typ, pname, kind in roles if role == 'out_scalar']
        if len([r for r in roles if r[0] == 'in_device']) != 2 or not outs:
            die(f'{name}: not_peers needs two device parameters and a scalar output')
        zero = ' '.join(f'*{o} = 0;' for o in outs)
        lines.append(f'    if (c.devices_of_two_sessions()) {{ {zero} return CUDA_SUCCESS; }}')
    if spec['class'] == 'async' and 'shared_sync' in spec['annot']:
        # Queued, unless the handle is shared with other processes (IPC): then the call has run on the server
        # when it returns, so that another process the application tells next sees its effect.
        shared = spec['annot']['shared_sync']
        if shared not in [pname for role, typ, pname, kind in roles if role == 'in_handle']:
            die(f'{name}: shared_sync={shared} must name a handle parameter')
        send = (f'ipc_shared(reinterpret_cast<uint64_t>({shared})) ? c.send_sync() : c.send_async()')
    elif spec['class'] == 'async':
        send = 'send_async()'
    elif 'cached' in spec['annot']:
        send = 'send_cached()'
    elif 'uncaches' in spec['annot']:
        sent = [pname for role, typ, pname, kind in roles
                if role in ('in_scalar', 'in_device', 'in_handle', 'destroy_handle')]
        value = spec['annot']['uncaches']
        if value not in sent:
            die(f'{name}: uncaches={value} must name the parameter that carries the value set (one of {sent})')
        send = f'send_uncaching({sent.index(value)})'
    else:
        send = 'send_sync()'
    call = send if send.startswith('ipc_shared') else f'c.{send}'
    lines.append(f'    if (CUresult rc = {call}; rc != CUDA_SUCCESS) return rc;')
    if 'observes' in spec['annot']:
        # The application now knows that GPU work finished: copies left under way into its memory land first.
        lines.append('    vcuda::client::settle_finished();')
    i = 0
    for role, typ, pname, kind in roles:
        if role == 'out_scalar':
            lines.append(f'    {"if (" + pname + ") " if optional else ""}*{pname} = c.out<{typ}>({i});')
            i += 1
        elif role == 'out_handle':
            lines.append(f'    *{pname} = c.out_handle<{typ}>({i}, handle_kind::{kind});')
            i += 1
        elif role == 'destroy_handle':
            lines.append(f'    c.forget({pname}, handle_kind::{kind});')
    lines.append('    return CUDA_SUCCESS;\n}')
    return '\n'.join(lines)


def client_ptsz(name, base, params, base_params):
    args = []
    for t, n in params:
        if base_type(t) == 'CUstream' and t.count('*') == 0:
            args.append(f'vcuda::client::per_thread_stream({n})')
        else:
            args.append(n)
    if [t for t, _ in params] != [t for t, _ in base_params]:
        die(f'{name}: signature differs from {base}')
    return (f'__attribute__((visibility("default"))) CUresult {name}({cdecl(params)}) noexcept {{\n'
            f'    {trace_hook(name, params)}\n'
            f'    return {base}({", ".join(args)});\n}}')


def trace_hook(name, params):
    """The first statement of an exported function: in record mode, the call goes to its trace twin."""
    return f'VCUDA_TRACE_HOOK({", ".join([name] + [n for _, n in params])});'


# Record mode: parameters printed in hex (addresses and opaque 64-bit values) besides pointers and handles.
TRACE_HEX = {'CUdeviceptr', 'CUdeviceptr_v1', 'CUdeviceptr_v2', 'CUtexObject', 'CUsurfObject',
             'CUmemGenericAllocationHandle'}
TRACE_INTEGERS = {'int', 'unsigned int', 'unsigned', 'size_t', 'long long', 'unsigned long long', 'cuuint32_t',
                  'cuuint64_t'}
# Written by hand in client/trace.cpp: they rewrite what the real driver answered (entry points, tables).
TRACE_HAND = {'cuGetProcAddress', 'cuGetProcAddress_v2', 'cuGetExportTable'}


def trace_format(params, i):
    """The statement that prints parameter i after the call (vt_ok: the call returned CUDA_SUCCESS)."""
    typ, name = params[i]
    ptr = typ.count('*')
    bt = base_type(typ)
    q = f'"{name}"'
    if typ == 'const char*':
        return f'vt_c.str({q}, {name});'
    if typ == 'char*':
        nxt = params[i + 1] if i + 1 < len(params) else None
        if nxt and nxt[0] in TRACE_INTEGERS:
            return f'vt_c.strbuf({q}, {name}, static_cast<long long>({nxt[1]}), vt_ok);'
        return f'vt_c.arg({q}, {name});'
    if typ == 'const char**':
        return f'vt_c.out_str({q}, {name}, vt_ok);'
    if typ == 'CUresult':
        return f'vt_c.result_arg({q}, {name});'
    if typ == 'const CUuuid*':
        return f'vt_c.uuid({q}, {name});'
    if typ == 'CUuuid*':
        return f'vt_c.out_uuid({q}, {name}, vt_ok);'
    if ptr == 0:
        if bt in TRACE_HEX or (re.search('flags', name, re.I) and (bt in TRACE_INTEGERS or is_scalar(bt))):
            return f'vt_c.hex({q}, static_cast<unsigned long long>({name}));'
        return f'vt_c.arg({q}, {name});'
    writable = not typ.startswith('const') or ptr >= 2  # const T** points to a writable const T*
    if writable:
        if ptr == 1 and bt in TRACE_HEX:
            return f'vt_c.out_hex({q}, {name}, vt_ok);'
        return f'vt_c.out({q}, {name}, vt_ok);'
    return f'vt_c.arg({q}, {name});'


def emit_trace(out, protos, symbols):
    """client_trace.hpp / client_trace.cpp: the record mode's twin of every exported symbol."""
    index = {s: i for i, s in enumerate(symbols)}
    h = [HEADER, '// The record mode (client/trace.hpp, client/TRACE.md): for every symbol libcuda exports, a function',
         '// of the same name and signature that calls the real driver\'s and writes one line.',
         '#pragma once\n',
         '#ifndef __CUDA_API_VERSION_INTERNAL',
         '#define __CUDA_API_VERSION_INTERNAL 1',
         '#endif',
         '#include <cuda.h>',
         '#include <cudaProfiler.h>',
         '#ifdef cuMemAlloc',
         '#error "cuda.h was included without __CUDA_API_VERSION_INTERNAL: include client/trace.hpp first"',
         '#endif\n',
         'namespace vcuda::client::trace {\n',
         f'inline constexpr int symbol_count = {len(symbols)};',
         'extern const char* const symbol_names[symbol_count];  // sorted (strcmp order)',
         '// The index of an exported symbol in symbol_names, or -1.',
         'int symbol_index(const char* name);\n',
         'namespace idx {',
         'enum : int {']
    for s in symbols:
        h.append(f'    {s} = {index[s]},')
    h.append('};\n}  // namespace idx\n')
    for s in symbols:
        if s in protos:
            h.append(f'CUresult {s}({cdecl(protos[s])}) noexcept;')
    h.append('\n}  // namespace vcuda::client::trace\n')
    write_if_changed(os.path.join(out, 'client_trace.hpp'), '\n'.join(h))

    c = [HEADER, '#include "client/trace.hpp"', '#include "client/trace_log.hpp"\n', '#include <cstring>\n',
         'namespace vcuda::client::trace {\n',
         'const char* const symbol_names[symbol_count] = {']
    for s in symbols:
        c.append(f'    "{s}",')
    c.append('};\n')
    c.append('int symbol_index(const char* name) {\n'
             '    int lo = 0, hi = symbol_count;\n'
             '    while (lo < hi) {\n'
             '        int mid = (lo + hi) / 2;\n'
             '        int cmp = std::strcmp(symbol_names[mid], name);\n'
             '        if (cmp == 0) return mid;\n'
             '        if (cmp < 0) lo = mid + 1;\n'
             '        else hi = mid;\n'
             '    }\n'
             '    return -1;\n'
             '}\n')
    for s in symbols:
        if s in TRACE_HAND or s not in protos:
            continue
        params = protos[s]
        types = ', '.join(t for t, _ in params)
        args = ', '.join(n for _, n in params)
        i = index[s]
        body = [f'CUresult {s}({cdecl(params)}) noexcept {{',
                f'    auto vt_f = reinterpret_cast<CUresult (*)({types})>(real_fn(idx::{s}));',
                f'    call vt_c(symbol_names[idx::{s}]);',
                f'    CUresult vt_rc = vt_f ? vt_f({args}) : static_cast<CUresult>(missing(vt_c));',
                '    vt_c.done();']
        if params:
            body.append('    [[maybe_unused]] bool vt_ok = vt_rc == CUDA_SUCCESS;')
        for k in range(len(params)):
            body.append('    ' + trace_format(params, k))
        body.append('    vt_c.end(vt_rc);')
        body.append('    return vt_rc;\n}\n')
        c.append('\n'.join(body))
    c.append('}  // namespace vcuda::client::trace\n')
    write_if_changed(os.path.join(out, 'client_trace.cpp'), '\n'.join(c))


def emit_procaddress(out, table, symbols):
    symset = set(symbols)
    lines = [HEADER, '#include "client/procaddress.hpp"\n', 'extern "C" {']
    needed = sorted({s for _, d, p in table for _, s in d + (p or [])})
    for s in needed:
        if s not in symset:
            die(f'procaddress table names {s}, which libcuda does not export')
        lines.append(f'void {s}();')
    lines.append('}\n\nnamespace vcuda::client {\n')
    lines.append('namespace {')
    for i, (name, d, p) in enumerate(table):
        lines.append(f'const proc_version pv{i}[] = {{' + ', '.join(f'{{{v}, (void*)&{s}}}' for v, s in d) + '};')
        if p is not None:
            lines.append(f'const proc_version pp{i}[] = {{' + ', '.join(f'{{{v}, (void*)&{s}}}' for v, s in p) + '};')
    lines.append('}  // namespace\n')
    lines.append('const proc_entry proc_table[] = {')
    for i, (name, d, p) in enumerate(sorted(table, key=lambda x: x[0])):
        j = table.index((name, d, p))
        ptds = f'pp{j}, {len(p)}' if p is not None else 'nullptr, 0'
        lines.append(f'    {{"{name}", pv{j}, {len(d)}, {ptds}}},')
    lines.append('};')
    lines.append(f'const size_t proc_table_size = {len(table)};\n')
    lines.append('}  // namespace vcuda::client\n')
    write_if_changed(os.path.join(out, 'procaddress_table.cpp'), '\n'.join(lines))


def emit_errors(out, cuda_include):
    """CUresult names and one-line descriptions, from cuda.h's cudaError_enum and its doc comments."""
    text = open(os.path.join(cuda_include, 'cuda.h')).read()
    body = text[text.index('typedef enum cudaError_enum'):]
    body = body[:body.index('} CUresult;')]
    entries = []
    for m in re.finditer(r'/\*\*(.*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)', body, re.S):
        doc = ' '.join(line.strip(' *') for line in m.group(1).splitlines()).strip()
        doc = re.sub(r'\s+', ' ', re.sub(r'::|\\\w+', '', doc))
        first = re.split(r'(?<=[a-z0-9)])\.\s', doc + ' ')[0].strip().rstrip('.')
        entries.append((int(m.group(3)), m.group(2), first.replace('"', "'")))
    lines = [HEADER, '// {CUresult, name, description}', ]
    for code, name, desc in entries:
        lines.append(f'{{{code}, "{name}", "{desc}"}},')
    write_if_changed(os.path.join(out, 'error_names.inc'), '\n'.join(lines) + '\n')


def emit_driver_table(out, protos):
    names = sorted(protos)
    h = [HEADER, '// The real driver\'s entry points, loaded by name; a missing one stays null.',
         '#pragma once\n', '#define __CUDA_API_VERSION_INTERNAL 1', '#include <cuda.h>', '#include <cudaProfiler.h>\n',
         'namespace vcuda::server {\n', 'struct driver_table {']
    for n in names:
        h.append(f'    decltype(&::{n}) {n} = nullptr;')
    h.append('\n    // Resolves every entry with `resolve(symbol_name)`; returns how many were found.')
    h.append('    template <class F> int load(F&& resolve) {\n        int found = 0;')
    for n in names:
        h.append(f'        if (({n} = reinterpret_cast<decltype({n})>(resolve("{n}")))) ++found;')
    h.append('        return found;\n    }')
    h.append(f'    static constexpr int size = {len(names)};')
    h.append('};\n\n}  // namespace vcuda::server\n')
    write_if_changed(os.path.join(out, 'driver_table.hpp'), '\n'.join(h))
    write_if_changed(os.path.join(out, 'driver_table.cpp'), HEADER + '#include "driver_table.hpp"\n')


def emit_server(out, fns, ops, protos):
    lines = [HEADER, '#include <functional>', '', '#include "server/dispatch.hpp"', '#include "server/call_context.hpp"', '',
             'namespace vcuda::server {', '']
    hand_ops = sorted(n for n in ops if n not in fns)
    lines.insert(4, '#include "server_ops.hpp"')
    for n in hand_ops:
        if not op_signatures.get(n):
            lines.append(f'CUresult handle_{n}(call_context& cx);  // server/handlers_*.cpp')
    for name, spec in sorted(fns.items()):
        if spec['class'] in ('sync', 'async') and 'charge' in spec['annot']:
            types = [typ if r != 'in_device' else 'CUdevice' for r, typ, pname, kind in
                     classify(name, protos[name], spec['annot'])
                     if r in ('in_scalar', 'in_device', 'in_handle', 'destroy_handle')]
            lines.append(f'CUresult {spec["annot"]["charge"]}(call_context& cx, const std::function<CUresult()>& '
                         f'call{"".join(", " + t for t in types)});  // server/quota_checks.cpp')
        if spec['class'] in ('sync', 'async') and 'server' in spec['annot']:
            lines.append(f'CUresult {spec["annot"]["server"]}(call_context& cx);  // server/handlers_*.cpp')
    lines.append('')
    lines.append('namespace {\n')
    for name, spec in sorted(fns.items()):
        if spec['class'] not in ('sync', 'async') or 'server' in spec['annot']:
            continue
        lines.append(server_plain(name, spec, protos[name]))
    for n in hand_ops:
        if op_signatures.get(n):
            lines.append(gen_ops.server_wrapper(n, op_signatures[n]))
    lines.append('}  // namespace\n')
    lines.append('// The allowlist: an op absent here is refused. Indexed by op id.')
    lines.append('const dispatch_entry dispatch_table[] = {')
    for name, oid in sorted(ops.items(), key=lambda x: x[1]):
        fn = (fns[name]['annot'].get('server', f'gen_{name}')) if name in fns else \
            (f'op_{name}' if op_signatures.get(name) else f'handle_{name}')
        klass = fns[name]['class'] if name in fns else 'hand'
        lines.append(f'    {{op::{name}, "{name}", &{fn}, {"true" if klass == "async" else "false"}, '
                     f'{"true" if name in outside_gate else "false"}}},')
    lines.append('};')
    lines.append('const size_t dispatch_table_size = sizeof(dispatch_table) / sizeof(dispatch_table[0]);\n')
    lines.append('}  // namespace vcuda::server\n')
    write_if_changed(os.path.join(out, 'server_dispatch.cpp'), '\n'.join(lines))


def server_plain(name, spec, params):
    roles = classify(name, params, spec['annot'])
    n_in = sum(1 for r in roles if r[0] in ('in_scalar', 'in_handle', 'in_device', 'destroy_handle'))
    lines = [f'CUresult gen_{name}(call_context& cx) {{',
             f'    if (!cx.drv().{name}) return cx.unsupported("{name}");',
             f'    if (!cx.expect_args({n_in})) return cx.bad_arguments();']
    call_args = []
    i = 0
    for role, typ, pname, kind in roles:
        v = f'a_{pname}'
        if role == 'in_scalar':
            lines.append(f'    auto {v} = cx.scalar<{typ}>({i});')
            i += 1
        elif role == 'in_device':
            lines.append(f'    CUdevice {v};')
            lines.append(f'    if (CUresult rc = cx.device({i}, {v}); rc != CUDA_SUCCESS) return rc;')
            i += 1
        elif role in ('in_handle', 'destroy_handle'):
            lines.append(f'    {typ} {v};')
            lines.append(f'    if (CUresult rc = cx.handle({i}, handle_kind::{kind}, {v}); rc != CUDA_SUCCESS) return rc;')
            i += 1
        elif role in ('out_scalar', 'out_handle'):
            lines.append(f'    {typ} {v}{{}};')
            v = '&' + v
        call_args.append(v)
    charge = spec['annot'].get('charge')
    if charge:
        # The quota check of a call that makes the driver hold memory (server/quota_checks.cpp): it runs the
        # driver call itself, between charging the session and crediting it back on failure.
        ins = [f'a_{r[2]}' for r in roles if r[0] in ('in_scalar', 'in_device', 'in_handle', 'destroy_handle')]
        lines.append(f'    CUresult rc = {charge}(cx, [&] {{ return cx.drv().{name}({", ".join(call_args)}); }}'
                     f'{"".join(", " + v for v in ins)});')
    else:
        lines.append(f'    CUresult rc = cx.drv().{name}({", ".join(call_args)});')
    lines.append('    if (rc != CUDA_SUCCESS) return rc;')
    i = 0
    for role, typ, pname, kind in roles:
        if role == 'out_scalar':
            lines.append(f'    cx.out(a_{pname});')
        elif role == 'out_handle':
            lines.append(f'    cx.out_handle(handle_kind::{kind}, a_{pname});')
        elif role == 'destroy_handle':
            pos = [r[2] for r in roles if r[0] in ('in_scalar', 'in_handle', 'in_device', 'destroy_handle')].index(pname)
            lines.append(f'    cx.forget_handle({pos});')
    lines.append('    return CUDA_SUCCESS;\n}\n')
    return '\n'.join(lines)


# ------------------------------------------------------------------------------------------------ main

def emit_surface(out, fns, symbols, unsupported):
    """The README's table of how the driver's entry points are served, from the same spec as the code."""
    classes = {sym: fns[sym]['class'] for sym in symbols if sym in fns}
    count = lambda *cs: sum(1 for c in classes.values() if c in cs)
    variants = len(symbols) - len(classes) - len(unsupported)
    rows = [
        ('forwarded to the server, generated from the spec (`sync`, `async`)', count('sync', 'async')),
        ('per-thread-stream variants (`_ptsz`, `_ptds`) of implemented functions', variants),
        ('hand-written in `client/`, forwarded through hand-written ops (`hand`)', count('hand')),
        ('answered by the client from its vGPU mirror (`local`)', count('local')),
        ('not supported: `CUDA_ERROR_NOT_SUPPORTED`, the name logged once', len(unsupported)),
        ('all of the driver\'s exported entry points', len(symbols)),
    ]
    lines = ['| how vcuda serves it | entry points |', '|---|---|']
    lines += [f'| {what} | {n} |' for what, n in rows]
    write_if_changed(os.path.join(out, 'surface.md'), '\n'.join(lines) + '\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--cuda-include', required=True)
    ap.add_argument('--stub', required=True, help='the toolkit\'s lib64/stubs/libcuda.so')
    ap.add_argument('--spec', required=True)
    ap.add_argument('--procaddress', required=True)
    ap.add_argument('--out', required=True)
    a = ap.parse_args()

    protos = read_prototypes(a.cuda_include)
    symbols = read_stub_symbols(a.stub)
    fns, ops = read_spec(a.spec)
    table = read_procaddress(a.procaddress)

    for name in fns:
        if name not in symbols:
            die(f'spec names {name}, which libcuda does not export')
        if fns[name]['class'] in ('sync', 'async') and name not in protos:
            die(f'{name}: no prototype in cuda.h')
    missing_proto = [s for s in symbols if s not in protos]
    for s in missing_proto:
        if s in fns:
            die(f'{s}: listed in the spec but has no prototype')

    os.makedirs(a.out, exist_ok=True)
    emit_ops(a.out, ops)
    emit_exports(a.out, symbols)
    unsupported = emit_client(a.out, fns, protos, symbols)
    emit_procaddress(a.out, table, symbols)
    emit_trace(a.out, protos, symbols)
    emit_driver_table(a.out, protos)
    emit_errors(a.out, a.cuda_include)
    emit_server(a.out, fns, ops, protos)
    emit_surface(a.out, fns, symbols, unsupported)
    hand_ops = [n for n in ops if n not in fns]
    described = gen_ops.emit(a.out, HEADER, ops, op_signatures, op_docs, hand_ops)
    print(f'gen_driver_api: {len(symbols)} symbols, {len(fns)} in the spec, {len(ops)} ops '
          f'({len(described)} of {len(hand_ops)} hand-written ones described), {len(unsupported)} unsupported stubs')


if __name__ == '__main__':
    main()
