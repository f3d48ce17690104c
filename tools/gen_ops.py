"""The described hand-written ops: what tools/gen_driver_api.py generates from an op's signature in the spec.

An op line may describe its call (protocol/spec/driver.spec, header):
    op NAME ID [outside_gate] [args(NAME:KIND ...)] [blobs(NAME ...)] [payload(NAME)] [outs(NAME:KIND ...)]
                              [out_blobs(NAME ...)] [out_payload(NAME)] [destroys(ARG ...)]   # what it does
The last argument may be one a call leaves out, [NAME:KIND], or a run of u64 values to the end, NAME:u64...;
the last output may be a run of values to the end, NAME:KIND... .
KIND: u64, u32, i32, bool (scalars; u32/i32/bool must fit), ptr (a device address), device (the session's
device index), or a handle kind of common/handle_kind.hpp (an argument: looked up in the session's table, and
with a `?` also 0 for none; an output: a handle the op creates). destroys(ARG): the handle argument ARG is gone
once the op succeeds. payload(NAME): the call's bulk bytes (the frame's payload: an op without it is refused one);
out_payload(NAME): the reply's.

From it come, for each described op: the server's decoding and checking of the call into a struct of named
arguments (server_ops.hpp, server_dispatch.cpp), the client's encoding as a class with named outputs
(client_ops.hpp), a table for tests (op_signatures.hpp) and the op's page in protocol/OPS.md (ops.md).
"""
import os
import re

SCALARS = {'u64': 'uint64_t', 'u32': 'unsigned', 'i32': 'int', 'bool': 'bool', 'ptr': 'CUdeviceptr'}
# Handle kinds (common/handle_kind.hpp) -> the driver type a handle of that kind stands for.
HANDLE_C_TYPES = {
    'context': 'CUcontext', 'module': 'CUmodule', 'function': 'CUfunction', 'library': 'CUlibrary',
    'kernel': 'CUkernel', 'stream': 'CUstream', 'event': 'CUevent', 'graph': 'CUgraph',
    'graph_exec': 'CUgraphExec', 'graph_node': 'CUgraphNode', 'mem_pool': 'CUmemoryPool',
    'link_state': 'CUlinkState', 'array': 'CUarray', 'mem_handle': 'void*',
    'mipmapped_array': 'CUmipmappedArray', 'green_ctx': 'CUgreenCtx', 'resource_desc': 'CUdevResourceDesc',
}
GROUPS = ('args', 'blobs', 'payload', 'outs', 'out_blobs', 'out_payload', 'destroys')
CLIENT_MEMBERS = {'arg', 'device', 'handle', 'blob', 'payload', 'take_payload', 'out', 'out_handle', 'out_blob', 'reply', 'forget', 'about',
                  'send_sync', 'send_async', 'send_cached', 'send_uncaching', 'request', 'target', 'forget_destroyed',
                  'wire_args', 'journaled'}


def write_if_changed(path, text):
    """Leaves an unchanged output untouched, so a spec edit rebuilds only what includes what it changed."""
    try:
        if open(path).read() == text:
            return
    except FileNotFoundError:
        pass
    with open(path, 'w') as f:
        f.write(text)


def parse(where, name, text, die):
    """The signature in `text` (what follows `op NAME ID [outside_gate]`), or None when it has none."""
    text = text.strip()
    if not text:
        return None
    sig = {g: [] for g in GROUPS}
    sig['optional'] = set()  # handle arguments that may be 0
    sig['trailing'] = None  # the argument a call may leave out ([NAME:KIND], the last one)
    sig['more_outs'] = None  # the output that is a run of values to the end (NAME:KIND..., the last one)
    sig['more_args'] = None  # the argument that is a run of u64 values to the end (NAME:u64..., the last one)
    pos = 0
    for m in re.finditer(r'\s*(\w+)\(([^)]*)\)\s*', text):
        if m.start() != pos:
            die(f'{where}: cannot read "{text[pos:m.start()]}" (expected GROUP(...), GROUP one of {", ".join(GROUPS)})')
        pos = m.end()
        group, items = m.group(1), m.group(2).split()
        if group not in GROUPS:
            die(f'{where}: unknown group {group} (known: {", ".join(GROUPS)})')
        if sig[group]:
            die(f'{where}: {group}(...) given twice')
        for item in items:
            if group in ('blobs', 'out_blobs', 'destroys', 'payload', 'out_payload'):
                if group in ('payload', 'out_payload') and sig[group]:
                    die(f'{where}: {group}: one name only')
                if not re.fullmatch(r'[a-z_][a-z0-9_]*', item):
                    die(f'{where}: {group}: "{item}" is not a name')
                sig[group].append(item)
                continue
            if (group == 'args' and (sig['trailing'] or sig['more_args'])) or (group == 'outs' and sig['more_outs']):
                die(f'{where}: {group}: only the last argument may be left out or a run, only the last output a run')
            if group == 'args' and item.startswith('[') and item.endswith(']'):
                item = item[1:-1]
                sig['trailing'] = item.partition(':')[0]
            if group == 'args' and item.endswith('...'):
                item = item[:-3]
                sig['more_args'] = item.partition(':')[0]
                if item.partition(':')[2] != 'u64':
                    die(f'{where}: args: a run of arguments is of u64 values ({item})')
            if group == 'outs' and item.endswith('...'):
                item = item[:-3]
                sig['more_outs'] = item.partition(':')[0]
            arg, _, kind = item.partition(':')
            if not re.fullmatch(r'[a-z_][a-z0-9_]*', arg) or not kind:
                die(f'{where}: {group}: expected NAME:KIND, got "{item}"')
            if kind.endswith('?') and group == 'args' and kind[:-1] in HANDLE_C_TYPES:
                sig['optional'].add(arg)  # 0: no handle (null)
                kind = kind[:-1]
            ok = kind in SCALARS or kind in HANDLE_C_TYPES or (group == 'args' and kind == 'device')
            if not ok or (group == 'outs' and kind == 'ptr'):
                die(f'{where}: {group}: unknown kind {kind} for {arg}')
            sig[group].append((arg, kind))
    if pos != len(text):
        die(f'{where}: cannot read "{text[pos:]}"')
    names = [a for a, _ in sig['args']] + sig['blobs'] + sig['payload']
    outs = [a for a, _ in sig['outs']] + sig['out_blobs'] + sig['out_payload']
    if len(set(names)) != len(names) or len(set(outs)) != len(outs):
        die(f'{where}: {name}: a name is used twice')
    # The client's class names its outputs' accessors so, and its constructor's parameters: plain_call's own
    # members would be hidden.
    for out in outs + names:
        if out in CLIENT_MEMBERS:
            die(f'{where}: {out}: plain_call has a member of that name')
    handles = {a for a, k in sig['args'] if k in HANDLE_C_TYPES}
    for d in sig['destroys']:
        if d not in handles:
            die(f'{where}: destroys({d}): {d} is not a handle argument')
    return sig


def kind_text(sig, item):
    """An argument's kind as the spec writes it (an optional handle with its `?`, a run of outputs with its
    `...`); a trailing argument a call may leave out is shown as `(may be left out)`."""
    run = item[0] in (sig['more_outs'], sig['more_args'])
    return item[1] + ('?' if item[0] in sig['optional'] else '') + ('...' if run else '') + \
        (' (may be left out)' if item[0] == sig['trailing'] else '')


def c_type(kind):
    if kind == 'device':
        return 'CUdevice'
    return SCALARS.get(kind) or HANDLE_C_TYPES[kind]


def summary(sig):
    parts = []
    for g in GROUPS:
        if sig[g]:
            parts.append(f'{g}(' + ' '.join(i if isinstance(i, str) else f'{i[0]}:{kind_text(sig, i)}' for i in sig[g]) + ')')
    return ' '.join(parts)


# ------------------------------------------------------------------------------------------------ server

def server_header(described):
    lines = ['#pragma once\n', '#define __CUDA_API_VERSION_INTERNAL 1', '#include <cuda.h>\n',
             '#include <cstddef>\n#include <cstdint>\n#include <span>\n', 'namespace vcuda::server {\n',
             'class call_context;\n']
    for name, oid, sig in described:
        lines.append(f'// op {name} ({oid}): {summary(sig)}')
        lines.append(f'struct {name}_args {{')
        for arg, kind in sig['args']:
            if arg == sig['more_args']:
                lines.append(f'    std::span<const uint64_t> {arg};  // the rest of the arguments')
                continue
            lines.append(f'    {c_type(kind)} {arg}{{}};')
            if kind in HANDLE_C_TYPES:
                lines.append(f'    uint64_t {arg}_id = 0;  // the session handle')
            elif kind == 'device':
                lines.append(f'    size_t {arg}_index = 0;  // the session\'s device index')
        if sig['trailing']:
            lines.append(f'    bool has_{sig["trailing"]} = false;  // the call gave it')
        for b in sig['blobs'] + sig['payload']:
            lines.append(f'    std::span<const std::byte> {b};')
        lines.append('};')
        lines.append(f'CUresult handle_{name}(call_context& cx, const {name}_args& a);  // server/handlers_*.cpp\n')
    lines.append('}  // namespace vcuda::server\n')
    return '\n'.join(lines)


def server_wrapper(name, sig):
    """The dispatch entry of a described op: decodes and checks the call, runs the handler, and keeps what the
    signature promises (outputs answered, destroyed handles forgotten)."""
    args, blobs = sig['args'], sig['blobs']
    least = len(args) - (1 if sig['trailing'] or sig['more_args'] else 0)
    if sig['more_args']:
        arity = f'(cx.arg_count() >= {least})'
    elif least == len(args):
        arity = f'cx.expect_args({len(args)})'
    else:
        arity = f'(cx.arg_count() == {least} || cx.arg_count() == {len(args)})'
    no_payload = '' if sig['payload'] else ' || !cx.payload().empty()'
    lines = [f'CUresult op_{name}(call_context& cx) {{',
             f'    if (!{arity} || cx.blob_count() != {len(blobs)}{no_payload}) return cx.bad_arguments();',
             f'    {name}_args a;']
    if sig['trailing']:
        lines.append(f'    a.has_{sig["trailing"]} = cx.arg_count() == {len(args)};')

    def given(arg, code):  # the trailing argument's code runs only when the call gave it
        if arg == sig['trailing']:
            lines.append(f'    if (a.has_{arg}) {{')
            lines.extend('    ' + c for c in code)
            lines.append('    }')
        else:
            lines.extend(code)

    # Values first, then lookups: a malformed call is refused as such whatever its handles name.
    for i, (arg, kind) in enumerate(args):
        if kind in ('u32', 'i32'):
            given(arg, [f'    if (cx.arg({i}) >> 32) return cx.fail(CUDA_ERROR_INVALID_VALUE, "{name}: {arg} does not fit 32 bits");',
                           f'    a.{arg} = cx.scalar<{c_type(kind)}>({i});'])
        elif kind == 'bool':
            given(arg, [f'    if (cx.arg({i}) > 1) return cx.fail(CUDA_ERROR_INVALID_VALUE, "{name}: {arg} is not 0 or 1");',
                           f'    a.{arg} = cx.arg({i}) != 0;'])
        elif arg == sig['more_args']:
            lines.append(f'    a.{arg} = cx.args_from({i});')
        elif kind in ('u64', 'ptr'):
            given(arg, [f'    a.{arg} = cx.arg({i});'])
    for i, (arg, kind) in enumerate(args):
        if kind in HANDLE_C_TYPES:
            lookup = f'if (CUresult rc = cx.handle({i}, handle_kind::{kind}, a.{arg}); rc != CUDA_SUCCESS) return rc;'
            code = [f'    a.{arg}_id = cx.arg({i});']
            code += [f'    if (a.{arg}_id != 0)', f'        {lookup}'] if arg in sig['optional'] else [f'    {lookup}']
            given(arg, code)
        elif kind == 'device':
            given(arg, [f'    a.{arg}_index = static_cast<size_t>(cx.arg({i}));',
                           f'    if (CUresult rc = cx.device({i}, a.{arg}); rc != CUDA_SUCCESS) return rc;'])
    for i, b in enumerate(blobs):
        lines.append(f'    a.{b} = cx.blob({i});')
    for p in sig['payload']:
        lines.append(f'    a.{p} = cx.payload();')
    # The outputs: exactly the fixed ones, or at least them before a run (nothing to count for a run alone).
    fixed = len(sig['outs']) - (1 if sig['more_outs'] else 0)
    bad = [f'cx.out_blobs.size() - blobs_before != {len(sig["out_blobs"])}']
    if not sig['more_outs'] or fixed:
        bad.insert(0, f'cx.outs.size() - outs_before {"<" if sig["more_outs"] else "!="} {fixed}')
        lines.append('    const size_t outs_before = cx.outs.size();')
    lines.append('    const size_t blobs_before = cx.out_blobs.size();')
    lines.append(f'    CUresult rc = handle_{name}(cx, a);')
    lines.append('    if (rc != CUDA_SUCCESS) return rc;')
    lines.append(f'    if ({" || ".join(bad)})')
    lines.append(f'        return cx.fail(CUDA_ERROR_UNKNOWN, "server bug: {name} did not answer what the spec says");')
    for d in sig['destroys']:
        lines.append(f'    cx.forget_handle({[a for a, _ in args].index(d)});')
    lines.append('    return CUDA_SUCCESS;\n}\n')
    return '\n'.join(lines)


# ------------------------------------------------------------------------------------------------ client

def client_header(described):
    lines = ['#pragma once\n', '#include <optional>\n', '#include "client/plain_call.hpp"\n', 'namespace vcuda::client {\n']
    for name, oid, sig in described:
        params, body, last = [], [], []
        for arg, kind in sig['args']:
            if arg == sig['more_args']:  # a span, last: each value sent
                last.append(f'std::span<const uint64_t> {arg}')
                body.append(f'for (uint64_t v : {arg}) arg(v);')
                continue
            if arg == sig['trailing']:  # a std::optional parameter, last; sent when it has a value
                last.append(f'std::optional<{c_type(kind)}> {arg} = std::nullopt')
                send = {'device': f'device(*{arg});'}.get(kind, f'handle(*{arg}, handle_kind::{kind});'
                                                          if kind in HANDLE_C_TYPES else f'arg(*{arg});')
                body.append(f'if ({arg}) {send}')
                continue
            if kind in HANDLE_C_TYPES:
                params.append(f'{c_type(kind)} {arg}')
                body.append(f'if ({arg}) handle({arg}, handle_kind::{kind}); else arg(uint64_t{{0}});'
                            if arg in sig['optional'] else f'handle({arg}, handle_kind::{kind});')
            elif kind == 'device':
                params.append(f'CUdevice {arg}')
                body.append(f'device({arg});')
            else:
                params.append(f'{c_type(kind)} {arg}')
                body.append(f'arg({arg});')
        for b in sig['blobs']:
            params.append(f'std::span<const std::byte> {b}')
            body.append(f'blob({b});')
        for p in sig['payload']:
            params.append(f'std::span<const std::byte> {p}')
            body.append(f'payload({p});')
        params += last
        lines.append(f'// op {name} ({oid}): {summary(sig)}')
        lines.append(f'class {name}_call : public plain_call {{\n  public:')
        lines.append(f'    {name}_call(const char* api{"".join(", " + p for p in params)})')
        lines.append(f'        : plain_call(op::{name}, api) {{')
        for b in body:
            lines.append(f'        {b}')
        for d in sig['destroys']:
            lines.append(f'        destroyed_.push_back(reinterpret_cast<uint64_t>({d}));')
        lines.append('    }')
        for i, (out, kind) in enumerate(sig['outs']):
            if kind in HANDLE_C_TYPES:
                lines.append(f'    {c_type(kind)} {out}(uint64_t owner = 0) {{ return out_handle<{c_type(kind)}>({i}, '
                             f'handle_kind::{kind}, owner); }}')
                lines.append(f'    uint64_t {out}_id() const {{ return out<uint64_t>({i}); }}  // not adopted in the mirror')
            elif out == sig['more_outs']:
                lines.append(f'    std::span<const uint64_t> {out}() const {{')
                lines.append(f'        const auto& o = reply().outs;')
                lines.append(f'        return o.size() > {i} ? std::span<const uint64_t>(o).subspan({i}) : std::span<const uint64_t>{{}};')
                lines.append('    }')
            else:
                lines.append(f'    {c_type(kind)} {out}() const {{ return out<{c_type(kind)}>({i}); }}')
        for i, b in enumerate(sig['out_blobs']):
            lines.append(f'    std::span<const std::byte> {b}() const {{ return out_blob({i}); }}')
        for p in sig['out_payload']:
            lines.append(f'    // The reply\'s payload, taken: the bytes move to the caller.')
            lines.append(f'    std::vector<std::byte> {p}() {{ return take_payload(); }}')
        made = [i for i, (_, kind) in enumerate(sig['outs']) if kind in HANDLE_C_TYPES]
        if made:
            lines.append('    // The handles it makes go into the journal (client/journal.hpp) when it succeeds.')
            lines.append('    CUresult send_sync() { return journaled(plain_call::send_sync()); }')
            lines.append('    CUresult send_cached() { return journaled(plain_call::send_cached()); }')
        if sig['destroys']:
            lines.append('    // After success: the mirror forgets the handles the op destroyed (and the journal their making).')
            lines.append('    void forget_destroyed() {\n        for (uint64_t id : destroyed_) state::get().forget(id);\n    }')
        if made or sig['destroys']:
            lines.append('\n  private:')
        if made:
            lines.append('    CUresult journaled(CUresult rc) {')
            lines.append('        if (rc != CUDA_SUCCESS) return rc;')
            for i in made:
                lines.append(f'        if (uint64_t id = out<uint64_t>({i})) state::get().journal().made(op::{name}, wire_args(), id);')
            lines.append('        return rc;\n    }')
        if sig['destroys']:
            lines.append('    std::vector<uint64_t> destroyed_;')
        lines.append('};\n')
    lines.append('}  // namespace vcuda::client\n')
    return '\n'.join(lines)


# ------------------------------------------------------------------------------------------------ tests, docs

def signatures_header(described):
    lines = ['#pragma once\n', '#include <span>\n#include <string_view>\n', '#include "common/handle_kind.hpp"',
             '#include "ops.hpp"\n', 'namespace vcuda {\n',
             '// One argument of a described op: KIND as in the spec; `handle` is its handle kind, or none.',
             'struct op_arg {\n    std::string_view name;\n    std::string_view kind;\n    handle_kind handle;\n};\n',
             'struct op_signature {\n    op id;\n    std::span<const op_arg> args;\n    size_t blobs;\n'
             '    bool payload;  // takes a payload (an op without one refuses it)\n'
             '    bool more_args;  // its last argument is a run of values (any number of arguments from there)\n'
             '    size_t outs;\n    size_t out_blobs;\n};\n', 'namespace op_signature_args {']
    for name, oid, sig in described:
        items = ', '.join(f'{{"{a}", "{k + ("?" if a in sig["optional"] else "")}", handle_kind::{k if k in HANDLE_C_TYPES else "none"}}}'
                          for a, k in sig['args'])
        lines.append(f'inline constexpr op_arg {name}[] = {{{items}}};' if items else
                     f'inline constexpr std::span<const op_arg> {name}{{}};')
    lines.append('}  // namespace op_signature_args\n')
    lines.append('// Every described op (protocol/OPS.md).')
    lines.append('inline constexpr op_signature op_signatures[] = {')
    for name, oid, sig in described:
        lines.append(f'    {{op::{name}, op_signature_args::{name}, {len(sig["blobs"])}, '
                     f'{"true" if sig["payload"] else "false"}, {"true" if sig["more_args"] else "false"}, '
                     f'{len(sig["outs"])}, {len(sig["out_blobs"])}}},')
    lines.append('};\n')
    lines.append('}  // namespace vcuda\n')
    return '\n'.join(lines)


def ops_doc(ops, sigs, docs, hand_ops):
    described = [n for n in hand_ops if sigs.get(n)]
    lines = ['# The hand-written ops', '',
             'Generated by tools/gen_driver_api.py from protocol/spec/driver.spec; do not edit (the test',
             '`protocol.ops_doc` keeps it equal to the build\'s `generated/ops.md`). The plain calls (`fn ... sync|async`)',
             'are described by their cuda.h prototypes; these are the ops written by hand on both sides.', '',
             f'**{len(described)} of {len(hand_ops)} hand-written ops are described** by a signature: their',
             'arguments are decoded and checked by generated code (arity, blob count, 32-bit and boolean ranges,',
             'handles of the named kind from the session\'s table), their outputs are counted, the handles they',
             'destroy are forgotten, and the client encodes them with a generated class. The others still read',
             'positional arguments by hand; their comment in the spec says what they take.', '',
             '| Op | Id | Arguments | Blobs | Outputs | Output blobs | Destroys | What it does |',
             '|----|---:|-----------|-------|---------|--------------|----------|--------------|']
    cell = lambda sig, xs: ' '.join(x if isinstance(x, str) else f'`{x[0]}`:{kind_text(sig, x)}' for x in xs) or '—'
    # Blob names, then the payload's after a `;` (it is no blob).
    with_payload = lambda names, payload: '; '.join(
        x for x in (' '.join(names), ' '.join(f'payload {p}' for p in payload)) if x) or '—'
    for n in sorted(hand_ops, key=lambda x: ops[x]):
        sig = sigs.get(n)
        doc = docs.get(n, '').replace('|', '\\|')
        if sig:
            blobs = with_payload(sig['blobs'], sig['payload'])
            out_blobs = with_payload(sig['out_blobs'], sig['out_payload'])
            lines.append(f'| `{n}` | {ops[n]} | {cell(sig, sig["args"])} | {blobs} | '
                         f'{cell(sig, sig["outs"])} | {out_blobs} | {cell(sig, sig["destroys"])} | {doc} |')
        else:
            lines.append(f'| `{n}` | {ops[n]} | *not described yet* | | | | | {doc} |')
    return '\n'.join(lines) + '\n'


def emit(out, header, ops, sigs, docs, hand_ops):
    described = [(n, ops[n], sigs[n]) for n in sorted(hand_ops, key=lambda x: ops[x]) if sigs.get(n)]
    write_if_changed(os.path.join(out, 'server_ops.hpp'), header + server_header(described))
    write_if_changed(os.path.join(out, 'client_ops.hpp'), header + client_header(described))
    write_if_changed(os.path.join(out, 'op_signatures.hpp'), header + signatures_header(described))
    write_if_changed(os.path.join(out, 'ops.md'), ops_doc(ops, sigs, docs, hand_ops))
    return described
