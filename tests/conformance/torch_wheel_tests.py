"""PyTorch conformance tests built only from what the installed wheel ships (torch.testing._internal): run when
the repository's own test/*.py files are not at hand.

- TestCommonCUDA.test_compare_cpu: every OpInfo of op_db, float32, its reference inputs run on CUDA and on the
  CPU and compared (atol = rtol = 1e-3), as test/test_ops.py's TestCommon.test_compare_cpu does upstream; op_db's
  own skips and expected failures for ("TestCommon", "test_compare_cpu") apply through the same decorators.
- TestModuleCUDA.test_cpu_gpu_parity: every ModuleInfo of module_db, float32, train and eval: the module built on
  the CPU, a deep copy moved to CUDA, forward outputs compared; module_db's decorators for ("TestModule",
  "test_cpu_gpu_parity") apply (upstream's test of that name also compares gradients; this one only forwards).

Run: pytest -p no:cacheprovider tests/conformance/torch_wheel_tests.py (CUDA device only).
"""
import copy

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCUDA, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils._pytree import tree_map


def _to(device):
    def move(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x
    return move


class TestCommon(TestCase):
    @onlyCUDA
    @ops(op_db, allowed_dtypes=(torch.float32,))
    def test_compare_cpu(self, device, dtype, op):
        for sample in op.reference_inputs(device, dtype):
            cpu_sample = sample.transform(_to("cpu"))
            cuda_results = op(sample.input, *sample.args, **sample.kwargs)
            cpu_results = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
            cuda_results = sample.output_process_fn_grad(cuda_results)
            cpu_results = cpu_sample.output_process_fn_grad(cpu_results)
            self.assertEqual(cuda_results, cpu_results, atol=1e-3, rtol=1e-3)


class TestModule(TestCase):
    @onlyCUDA
    @modules(module_db, allowed_dtypes=(torch.float32,))
    def test_cpu_gpu_parity(self, device, dtype, module_info, training):
        inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype, requires_grad=False,
                                                training=training)
        for mi in inputs:
            if mi.forward_input is None:
                continue
            torch.manual_seed(0)
            c_args, c_kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
            m_cpu = module_info.module_cls(*c_args, **c_kwargs)
            m_cpu = m_cpu.to(dtype) if isinstance(m_cpu, torch.nn.Module) else m_cpu
            m_cpu.train(training)
            m_gpu = copy.deepcopy(m_cpu).to(device)
            f_args, f_kwargs = mi.forward_input.args, mi.forward_input.kwargs
            out_cpu = m_cpu(*f_args, **f_kwargs)
            out_gpu = m_gpu(*tree_map(_to(device), f_args), **tree_map(_to(device), f_kwargs))
            self.assertEqual(tree_map(_to("cpu"), out_gpu), out_cpu, atol=1e-3, rtol=1e-3, exact_device=False)


instantiate_device_type_tests(TestCommon, globals(), only_for="cuda")
instantiate_device_type_tests(TestModule, globals(), only_for="cuda")

if __name__ == "__main__":
    run_tests()
