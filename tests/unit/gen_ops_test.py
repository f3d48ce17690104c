"""tools/gen_ops.py on signatures good and bad: what it reads from a signature, what it refuses (each with its
reason), and the checks it writes into the server's decoding (ctest `tools.gen_ops`)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tools'))
import gen_ops  # noqa: E402


class Refused(Exception):
    pass


def die(msg):
    raise Refused(msg)


def parse(text):
    return gen_ops.parse('spec:1', 'some_op', text, die)


def refused(text, why):
    try:
        parse(text)
    except Refused as e:
        assert why in str(e), f'{text!r}: refused for "{e}", expected "{why}"'
        return
    raise AssertionError(f'{text!r} was accepted')


failures = 0


def case(fn):
    global failures
    try:
        fn()
        print(f'ok   {fn.__name__}')
    except AssertionError as e:
        failures += 1
        print(f'FAIL {fn.__name__}: {e}')


@case
def reads_every_group():
    sig = parse('args(stream:stream flags:u32 [peer:device]) blobs(data) payload(input) '
                'outs(node:graph_node more:u64...) out_blobs(log) out_payload(image) destroys(stream)')
    assert sig['args'] == [('stream', 'stream'), ('flags', 'u32'), ('peer', 'device')]
    assert sig['trailing'] == 'peer' and sig['more_outs'] == 'more' and sig['more_args'] is None
    assert sig['blobs'] == ['data'] and sig['payload'] == ['input']
    assert sig['out_blobs'] == ['log'] and sig['out_payload'] == ['image'] and sig['destroys'] == ['stream']


@case
def reads_an_argument_run_and_optional_handles():
    sig = parse('args(exec:graph_exec? type:u32 params:u64...)')
    assert sig['more_args'] == 'params' and 'exec' in sig['optional']
    assert gen_ops.kind_text(sig, ('params', 'u64')) == 'u64...'


@case
def no_signature_is_none():
    assert parse('') is None


@case
def refuses_what_it_cannot_read():
    refused('args(a:u32) nonsense', 'cannot read')
    refused('inputs(a:u32)', 'unknown group')
    refused('args(a:u32) args(b:u32)', 'given twice')
    refused('args(a:float)', 'unknown kind')
    refused('args(a)', 'expected NAME:KIND')
    refused('outs(p:ptr)', 'unknown kind')


@case
def refuses_names_that_clash():
    refused('args(a:u32 a:u64)', 'used twice')
    refused('outs(x:u64) out_blobs(x)', 'used twice')
    refused('outs(handle:u64)', 'plain_call has a member')  # hid plain_call::handle in the client class
    refused('blobs(device)', 'plain_call has a member')  # a constructor parameter hides it too


@case
def refuses_runs_and_leftouts_that_are_not_last():
    refused('args([a:u32] b:u32)', 'only the last argument')
    refused('args(a:u64... b:u32)', 'only the last argument')
    refused('args(a:u32...)', 'a run of arguments is of u64 values')
    refused('outs(a:u64... b:u64)', 'only the last output')
    refused('payload(a b)', 'one name only')
    refused('args(a:u32) destroys(a)', 'not a handle argument')


@case
def the_decoding_checks_what_the_signature_says():
    run = gen_ops.server_wrapper('some_op', parse('args(graph:graph type:u32 params:u64...) blobs(data)'))
    # A run: at least the fixed arguments (parenthesized: it follows a `!`), and no payload taken.
    assert 'if (!(cx.arg_count() >= 2) || cx.blob_count() != 1 || !cx.payload().empty())' in run, run
    assert 'a.params = cx.args_from(2);' in run
    assert 'does not fit 32 bits' in run and 'handle_kind::graph' in run
    fixed = gen_ops.server_wrapper('other_op', parse('args(a:u64) payload(input) outs(x:u64 y:u64)'))
    assert 'cx.expect_args(1) || cx.blob_count() != 0)' in fixed and 'a.input = cx.payload();' in fixed
    assert 'cx.outs.size() - outs_before != 2' in fixed
    # Only a run of outputs: the count of outputs is not checked, nor its start kept.
    only_run = gen_ops.server_wrapper('run_op', parse('args(a:u64) outs(v:u64...)'))
    assert 'outs_before' not in only_run


print(f'gen_ops_test: {failures} failure(s)')
sys.exit(1 if failures else 0)
